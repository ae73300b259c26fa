//! The `aip.config.v1.Config` service: each sidecar's one long-lived Watch
//! stream of its pod's configuration, its Reports, and RequestApproval (held
//! calls, which `approvals` turns into ApprovalRequests). This module only
//! translates between the index and the protocol; who a caller is comes from
//! `auth`.

pub mod auth;
mod incoming;
pub mod snapshot;
pub mod tls;

use aip_service::sync::lock;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aip_proto::v1::config_server::{Config, ConfigServer};
use aip_proto::v1::{
    ApprovalRequest, ApprovalUpdate, ApprovalWithdrawal, ReportRequest, ReportResponse, Snapshot,
    WatchRequest,
};
use kube::runtime::events::Recorder;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::approvals::Approvals;
use crate::certs::ServedRx;
use crate::identity::PodIdentity;
use crate::index::{Index, ObjectKey};
use crate::metrics::Metrics;
pub use auth::{AuthError, Authenticate, TokenReviewer};
pub use incoming::DEFAULT_MAX_SIDECARS;

/// How long a reviewed token is trusted without asking the API server
/// again (never past its own expiry).
const REVIEW_CACHE: Duration = Duration::from_secs(60);

/// What one sidecar reported about one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub connection: ObjectKey,
    pub pod: String,
    pub health: aip_proto::v1::HealthState,
    pub reason: String,
    pub http_status: u32,
    pub required_scope: String,
    pub successful_calls: u64,
    pub network_failures: u64,
    pub credential_failures: u64,
    /// Why the credential is refused, as a condition reason; empty when
    /// the gateway knows no more than "refused".
    pub credential_reason: String,
}

/// Where the service tells the rest of the operator what it learned.
#[derive(Clone)]
pub struct Signals {
    /// Policies whose status may have changed (acks).
    pub policies: mpsc::UnboundedSender<ObjectKey>,
    /// Connection evidence from sidecars.
    pub evidence: mpsc::UnboundedSender<Evidence>,
    /// This replica's acks changed (its sync report is rewritten).
    pub acked: Arc<Notify>,
}

pub struct ConfigService<A> {
    index: Arc<Mutex<Index>>,
    auth: Arc<A>,
    signals: Signals,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    reviewed: Mutex<HashMap<[u8; 32], (PodIdentity, Instant)>>,
    /// When each pod was last sent each version, for propagation latency.
    sent: SentLog,
    /// Where ApprovalRequests are created; None: RequestApproval is
    /// refused.
    approvals: Option<Arc<Approvals>>,
    /// What the listener serves, whose CA bundle each stream hands its
    /// sidecar (set by `serve`).
    served: Option<ServedRx>,
    /// The most sidecars this replica serves at once.
    max_sidecars: usize,
}

impl<A: Authenticate> ConfigService<A> {
    pub fn new(
        index: Arc<Mutex<Index>>,
        auth: A,
        signals: Signals,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> ConfigService<A> {
        ConfigService {
            index,
            auth: Arc::new(auth),
            signals,
            metrics,
            shutdown,
            reviewed: Mutex::new(HashMap::new()),
            sent: Arc::new(Mutex::new(HashMap::new())),
            approvals: None,
            served: None,
            max_sidecars: incoming::DEFAULT_MAX_SIDECARS,
        }
    }

    /// Serves at most `max` sidecars at once; the next are refused with
    /// RESOURCE_EXHAUSTED and retry elsewhere.
    pub fn with_max_sidecars(mut self, max: usize) -> ConfigService<A> {
        self.max_sidecars = max;
        self
    }

    /// Serves RequestApproval, creating ApprovalRequests with `client`
    /// and recording Events with `recorder`; `replica` names this replica
    /// on the requests it follows; `away_bound`: how long an ask waits for
    /// its sidecar to come back.
    pub fn with_approvals(
        mut self,
        client: kube::Client,
        recorder: Recorder,
        replica: &str,
        away_bound: Duration,
    ) -> ConfigService<A> {
        self.approvals = Some(Arc::new(Approvals {
            client,
            recorder,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            replica: replica.to_owned(),
            away_bound,
        }));
        self
    }

    /// The caller's pod, from its bearer token; refused at once on a
    /// connection over this replica's cap.
    async fn identify<T>(&self, request: &Request<T>) -> Result<PodIdentity, Status> {
        let over = request
            .extensions()
            .get::<incoming::ConnectInfo>()
            .filter(|c| c.admission == incoming::Admission::OverCap);
        if let Some(over) = over {
            let peer = over
                .tcp
                .remote_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            tracing::debug!(%peer, "a sidecar over this replica's maximum is refused");
            return Err(Status::resource_exhausted(format!(
                "this operator replica serves its maximum of {} sidecars (--max-sidecars); reconnect: the Service may reach a replica with room",
                self.max_sidecars
            )));
        }
        let result = self.identify_token(request).await;
        if let Err(e) = &result {
            self.metrics.auth_failure(e.metric_label());
        }
        result.map_err(|e| Status::unauthenticated(e.to_string()))
    }

    async fn identify_token<T>(&self, request: &Request<T>) -> Result<PodIdentity, AuthError> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Missing)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((id, until)) = lock(&self.reviewed).get(&key)
            && *until > now
        {
            return Ok(id.clone());
        }
        let id = self.auth.authenticate(token).await?;
        if id.expires.is_some_and(|e| e <= SystemTime::now()) {
            return Err(AuthError::Rejected("the token has expired".to_owned()));
        }
        let trust_for = id
            .expires
            .and_then(|e| e.duration_since(SystemTime::now()).ok())
            .map_or(REVIEW_CACHE, |left| left.min(REVIEW_CACHE));
        let mut cache = lock(&self.reviewed);
        cache.retain(|_, (_, until)| *until > now);
        cache.insert(key, (id.clone(), now + trust_for));
        Ok(id)
    }
}

/// When each pod (namespace, name) was last sent which version.
pub(crate) type SentLog = Arc<Mutex<HashMap<(String, String), (u64, Instant)>>>;

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<Snapshot, Status>> + Send>>;
type ApprovalStream = Pin<Box<dyn Stream<Item = Result<ApprovalUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl<A: Authenticate> Config for ConfigService<A> {
    type WatchStream = SnapshotStream;
    type RequestApprovalStream = ApprovalStream;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let id = self.identify(&request).await?;
        let subscribed = {
            let index = lock(&self.index);
            if !index.is_synced() {
                return Err(Status::unavailable(
                    "the operator is still loading the cluster's state",
                ));
            }
            index.subscribe(&id.namespace, &id.pod, &id.uid)
        };
        let Some(configs) = subscribed else {
            // The pod watch may not have seen a brand-new pod yet: worth a retry.
            return Err(Status::unavailable(format!(
                "pod {}/{} (uid {}) is not known to the operator (yet)",
                id.namespace, id.pod, id.uid
            )));
        };
        let hello = request.get_ref();
        tracing::info!(namespace = %id.namespace, pod = %id.pod, sidecar = %hello.sidecar_version, instance = %hello.sidecar_instance, "sidecar connected");
        if let Some(approvals) = self.approvals.clone() {
            let (id, instance) = (id.clone(), hello.sidecar_instance.clone());
            tokio::spawn(async move { approvals.withdraw_earlier(&id, &instance).await });
        }
        let (tx, rx) = mpsc::channel(2);
        let stream = snapshot::Stream {
            id,
            configs,
            tx,
            metrics: self.metrics.clone(),
            sent: self.sent.clone(),
            served: self.served.clone(),
            shutdown: self.shutdown.clone(),
            recorder: self.approvals.as_ref().map(|a| a.recorder.clone()),
        };
        tokio::spawn(stream.run());
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let id = self.identify(&request).await?;
        let report = request.into_inner();
        let pod_key = (id.namespace.clone(), id.pod.clone());
        if let Some((version, at)) = lock(&self.sent).get(&pod_key).copied()
            && version == report.applied_version
        {
            self.metrics.propagation(at.elapsed());
        }
        if !report.refused_reason.is_empty() {
            tracing::warn!(namespace = %id.namespace, pod = %id.pod, reason = %report.refused_reason, "a sidecar refused its configuration");
        }
        let touched =
            lock(&self.index).ack(&id.namespace, &id.pod, &id.uid, report.applied_version);
        if !touched.is_empty() {
            self.signals.acked.notify_one();
        }
        for policy in touched {
            let _ = self.signals.policies.send(policy);
        }
        for c in report.connections {
            let _ = self.signals.evidence.send(Evidence {
                connection: ObjectKey::new(&id.namespace, &c.connection),
                pod: id.pod.clone(),
                health: c.health(),
                reason: c.reason,
                http_status: c.http_status,
                required_scope: c.required_scope,
                successful_calls: c.successful_calls,
                network_failures: c.network_failures,
                credential_failures: c.credential_failures,
                credential_reason: c.credential_reason,
            });
        }
        Ok(Response::new(ReportResponse {}))
    }

    async fn request_approval(
        &self,
        request: Request<ApprovalRequest>,
    ) -> Result<Response<ApprovalStream>, Status> {
        let id = self.identify(&request).await?;
        let Some(approvals) = &self.approvals else {
            return Err(Status::unimplemented(
                "this operator was started without approvals",
            ));
        };
        let ask = request.into_inner();
        let explicit = ask.withdraws_explicitly;
        let name = if ask.resume_name.is_empty() {
            let governing = lock(&self.index)
                .subscribe(&id.namespace, &id.pod, &id.uid)
                .and_then(|c| c.borrow().policy.clone());
            let Some(policy) = governing else {
                return Err(Status::failed_precondition(
                    "no AgentPolicy governs this pod, so nothing can be asked",
                ));
            };
            approvals
                .create(&id, &policy.name, policy.approval_timeout, &ask)
                .await?
        } else {
            ask.resume_name
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(approvals.clone().follow(id, name, explicit, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn withdraw_approval(
        &self,
        request: Request<ApprovalWithdrawal>,
    ) -> Result<Response<ApprovalUpdate>, Status> {
        let id = self.identify(&request).await?;
        let Some(approvals) = &self.approvals else {
            return Err(Status::unimplemented(
                "this operator was started without approvals",
            ));
        };
        let update = approvals.withdraw(&id, request.get_ref()).await?;
        Ok(Response::new(update))
    }
}

/// Serves the Config service on `listener` until `shutdown`.
pub async fn serve<A: Authenticate>(
    listener: tokio::net::TcpListener,
    served: ServedRx,
    mut service: ConfigService<A>,
) -> anyhow::Result<()> {
    let shutdown = service.shutdown.clone();
    let tls = crate::certs::server_config(&served, &[b"h2"])?;
    service.served = Some(served);
    let addr = listener
        .local_addr()
        .map_or_else(|e| e.to_string(), |a| a.to_string());
    let max_sidecars = service.max_sidecars;
    let metrics = service.metrics.clone();
    tracing::info!(address = %addr, max_sidecars, "gRPC config service listening");
    // Each sidecar holds one Watch and at most a few approval streams; dead
    // peers are found by keepalive; headers are small.
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(Some(64))
        .concurrency_limit_per_connection(64)
        .http2_max_header_list_size(Some(16 * 1024))
        .add_service(ConfigServer::new(service))
        .serve_with_incoming_shutdown(
            incoming::incoming(listener, tls, max_sidecars, metrics),
            shutdown.cancelled_owned(),
        )
        .await?;
    Ok(())
}

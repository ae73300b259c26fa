//! Kubernetes mode's configuration source: the operator's Watch stream
//! (aip.config.v1), authenticated with the pod's projected service-account
//! token. It keeps the last good configuration while the operator is away
//! (optionally only for a bounded time, then it fails closed), reconnects
//! with backoff, and reports what it applied and what it saw of its
//! connections.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aip_policy::{AgentPolicy, CompileOptions, Evaluator};
use aip_proto::v1::config_client::ConfigClient;
use aip_proto::v1::{self, ReportRequest, WatchRequest};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint as GrpcEndpoint};

use super::Config;
use super::connection::{ClientCapabilities, Connection, Endpoint, Tls};

/// Where the operator is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct OperatorSource {
    /// `https://HOST:PORT` of the operator's gRPC service.
    pub url: String,
    /// The CAs that signed the operator's certificate.
    pub ca: OperatorCa,
    /// Verify the operator's certificate for this name instead of the URL's
    /// host.
    pub server_name: Option<String>,
    /// The projected token; read again at every connection, since the
    /// kubelet rotates it.
    pub token_file: PathBuf,
    /// After this long without the operator, every tool call is refused.
    pub max_staleness: Option<Duration>,
}

/// Where the operator's CA bundle comes from.
#[derive(Debug, Clone)]
pub enum OperatorCa {
    /// A PEM file (a mounted ConfigMap or Secret).
    File(PathBuf),
    /// The PEM itself (the injector puts it in the environment, so the pod
    /// needs no extra object in its namespace).
    Pem(String),
}

impl OperatorCa {
    fn pem(&self) -> anyhow::Result<String> {
        match self {
            OperatorCa::File(path) => std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!(
                    "cannot read the operator CA {}: {}",
                    path.display(),
                    e.kind()
                )
            }),
            OperatorCa::Pem(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => Ok(pem.clone()),
            OperatorCa::Pem(_) => anyhow::bail!(
                "the operator CA given inline (--operator-ca-pem) holds no PEM certificate"
            ),
        }
    }
}

/// What the source publishes.
pub struct Watched {
    pub config: watch::Receiver<Arc<Config>>,
    /// The snapshot version in force (0: none yet).
    pub version: watch::Receiver<u64>,
    /// Asks go to the operator, which makes ApprovalRequests of them.
    pub approvals: Arc<OperatorApprovals>,
}

/// How the gateway's view of its connections is read for reports.
pub type EvidenceFn = Arc<dyn Fn() -> Vec<v1::ConnectionEvidence> + Send + Sync>;

const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(15);
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Starts following the operator. Until the first snapshot arrives the
/// configuration is empty: every tool call is blocked.
pub fn watch(
    source: OperatorSource,
    evidence: watch::Receiver<Option<EvidenceFn>>,
    shutdown: CancellationToken,
) -> anyhow::Result<Watched> {
    let channel = channel(&source)?;
    let (config_tx, config) = watch::channel(Arc::new(Config::empty()));
    let (version_tx, version) = watch::channel(0u64);
    let instance = format!("{:032x}", rand::random::<u128>());
    let approvals = Arc::new(OperatorApprovals {
        client: ConfigClient::new(channel.clone()),
        token_file: source.token_file.clone(),
        instance: instance.clone(),
    });
    let follower = Follower {
        source,
        instance,
        client: ConfigClient::new(channel),
        config: config_tx,
        version: version_tx,
        evidence,
        shutdown,
    };
    tokio::spawn(follower.run());
    Ok(Watched {
        config,
        version,
        approvals,
    })
}

fn channel(source: &OperatorSource) -> anyhow::Result<Channel> {
    let ca = source.ca.pem()?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(name) = &source.server_name {
        tls = tls.domain_name(name.clone());
    }
    if !source.url.starts_with("https://") {
        anyhow::bail!("--operator must be an https:// URL, found {:?}", source.url);
    }
    Ok(GrpcEndpoint::from_shared(source.url.clone())?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

struct Follower {
    source: OperatorSource,
    /// This process's instance id (see WatchRequest.sidecar_instance).
    instance: String,
    client: ConfigClient<Channel>,
    config: watch::Sender<Arc<Config>>,
    version: watch::Sender<u64>,
    evidence: watch::Receiver<Option<EvidenceFn>>,
    shutdown: CancellationToken,
}

impl Follower {
    async fn run(mut self) {
        let mut retry = FIRST_RETRY;
        // The moment the operator last sent a snapshot.
        let mut last_contact: Option<Instant> = None;
        loop {
            let before = last_contact;
            match self.follow(&mut last_contact).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e.message(), retry_ms = retry.as_millis() as u64, "configuration stream from the operator lost; keeping the last configuration")
                }
            }
            if last_contact != before {
                // The stream worked for a while: start backing off afresh.
                retry = FIRST_RETRY;
            }
            let wait = tokio::time::sleep(jitter(retry));
            tokio::pin!(wait);
            loop {
                // Only a configuration that still allows something can go stale.
                let stale_at = match (self.source.max_staleness, last_contact) {
                    (Some(max), Some(at)) if self.config.borrow().policy.is_some() => {
                        Some(at + max)
                    }
                    _ => None,
                };
                tokio::select! {
                    () = &mut wait => break,
                    () = sleep_until(stale_at) => self.fail_closed(),
                    () = self.shutdown.cancelled() => return,
                }
            }
            retry = (retry * 2).min(MAX_RETRY);
        }
    }

    /// Refuses everything once the last configuration is too old to trust.
    fn fail_closed(&mut self) {
        tracing::error!(
            "the operator has been away longer than --max-staleness; every tool call is refused until it is back"
        );
        self.config.send_replace(Arc::new(Config::empty()));
        self.version.send_replace(0);
    }

    /// One Watch stream, until it ends. Ok only on shutdown.
    async fn follow(&mut self, last_contact: &mut Option<Instant>) -> Result<(), tonic::Status> {
        let token = self.token()?;
        let mut request = tonic::Request::new(WatchRequest {
            sidecar_version: env!("CARGO_PKG_VERSION").to_owned(),
            applied_version: *self.version.borrow(),
            sidecar_instance: self.instance.clone(),
        });
        authorize(&mut request, &token)?;
        let mut stream = tokio::select! {
            r = self.client.watch(request) => r?.into_inner(),
            () = self.shutdown.cancelled() => return Ok(()),
        };
        let mut report_tick = tokio::time::interval(REPORT_EVERY);
        report_tick.reset();
        loop {
            let message = tokio::select! {
                m = stream.message() => m?,
                _ = report_tick.tick() => { self.report(&token, String::new()).await; continue; }
                () = self.shutdown.cancelled() => return Ok(()),
            };
            let Some(snapshot) = message else {
                return Err(tonic::Status::unavailable("the operator ended the stream"));
            };
            *last_contact = Some(Instant::now());
            let refused = match self.apply(&snapshot) {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::error!(version = snapshot.version, error = %e, "configuration from the operator refused; keeping the previous one");
                    e
                }
            };
            self.report(&token, refused).await;
        }
    }

    fn token(&self) -> Result<SecretString, tonic::Status> {
        read_token(&self.source.token_file)
    }

    fn apply(&mut self, snapshot: &v1::Snapshot) -> Result<(), String> {
        let previous = self.config.borrow().clone();
        let config = from_snapshot(snapshot, &previous)?;
        self.config.send_replace(Arc::new(config));
        self.version.send_replace(snapshot.version);
        Ok(())
    }

    async fn report(&mut self, token: &SecretString, refused_reason: String) {
        let connections = self
            .evidence
            .borrow()
            .as_ref()
            .map(|f| f())
            .unwrap_or_default();
        let mut request = tonic::Request::new(ReportRequest {
            applied_version: *self.version.borrow(),
            refused_reason,
            connections,
        });
        if authorize(&mut request, token).is_err() {
            return;
        }
        if let Err(e) = self.client.report(request).await {
            tracing::warn!(error = %e.message(), "report to the operator failed");
        }
    }
}

fn authorize<T>(
    request: &mut tonic::Request<T>,
    token: &SecretString,
) -> Result<(), tonic::Status> {
    let value = format!("Bearer {}", token.expose_secret())
        .parse()
        .map_err(|_| {
            tonic::Status::unauthenticated("the token holds characters a header cannot")
        })?;
    request.metadata_mut().insert("authorization", value);
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Up to a quarter more, so that sidecars restarted together do not
/// reconnect in lockstep.
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(rand::random::<f64>() / 4.0)
}

/// The gateway's Config for a snapshot. The policy is validated and
/// compiled here as well: the sidecar trusts no one to have done it. A
/// policy whose hash is unchanged keeps its compiled evaluator (and so its
/// rate-limit buckets); a changed one keeps the buckets of unchanged rules.
pub fn from_snapshot(snapshot: &v1::Snapshot, previous: &Config) -> Result<Config, String> {
    let connections = snapshot
        .connections
        .iter()
        .map(connection)
        .collect::<Result<Vec<_>, _>>()?;
    if snapshot.keep_previous && previous.policy.is_some() {
        tracing::warn!(reason = %snapshot.deny_reason, "the policy is invalid upstream; keeping the one in force");
        // The same connections as before, with whatever fresh credentials
        // the operator has for them; nothing newly granted.
        let fresh: Vec<Arc<Connection>> = snapshot
            .connections
            .iter()
            .map(connection)
            .collect::<Result<_, _>>()?;
        let connections = previous
            .connections
            .iter()
            .map(|old| {
                fresh
                    .iter()
                    .find(|c| c.name == old.name)
                    .unwrap_or(old)
                    .clone()
            })
            .collect();
        return Ok(Config {
            evaluator: previous.evaluator.clone(),
            policy: previous.policy.clone(),
            connections,
        });
    }
    let Some(p) = &snapshot.policy else {
        if !snapshot.deny_reason.is_empty() {
            tracing::warn!(reason = %snapshot.deny_reason, "no policy applies to this pod; every tool call is refused");
        }
        return Ok(Config {
            connections,
            ..Config::empty()
        });
    };
    let policy = AgentPolicy::from_json(&p.document_json)
        .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?;
    let unchanged = previous
        .policy
        .as_ref()
        .is_some_and(|old| aip_policy::hash::policy_hash(old) == p.hash);
    let evaluator = if unchanged {
        previous.evaluator.clone()
    } else {
        let options = CompileOptions::default();
        Arc::new(
            Evaluator::compile_after(&policy, &options, &previous.evaluator)
                .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?,
        )
    };
    Ok(Config {
        evaluator,
        policy: Some(policy),
        connections,
    })
}

/// A connection as the operator sends it, in the gateway's terms.
pub fn connection(c: &v1::Connection) -> Result<Arc<Connection>, String> {
    let at = |field: &str| format!("connection {}: {field}", c.name);
    if !(c.url.starts_with("http://") || c.url.starts_with("https://")) {
        return Err(at("url is not http(s)"));
    }
    let credentials = if c.credentials_error.is_empty() {
        Ok(c.headers
            .iter()
            .map(|h| (h.name.clone(), SecretString::from(h.value.clone())))
            .collect())
    } else {
        Err(c.credentials_error.clone())
    };
    let millis = |ms: u32, field: &str| {
        if ms == 0 {
            Err(at(&format!("{field} is zero")))
        } else {
            Ok(Duration::from_millis(ms.into()))
        }
    };
    let tls = c.tls.clone().unwrap_or_default();
    let caps = c.capabilities.unwrap_or_default();
    Ok(Arc::new(Connection {
        name: c.name.clone(),
        endpoint: Endpoint::Http { url: c.url.clone() },
        credentials,
        timeout: millis(c.timeout_ms, "timeout")?,
        max_response_bytes: usize::try_from(c.max_response_bytes).unwrap_or(usize::MAX),
        health_interval: millis(c.health_interval_ms, "health interval")?,
        health_deadline: millis(c.health_deadline_ms, "health deadline")?,
        tool_prefix: c.tool_prefix.clone(),
        capabilities: ClientCapabilities {
            sampling: caps.sampling,
            elicitation: caps.elicitation,
            roots: caps.roots,
        },
        tls: Tls {
            ca_pem: (!tls.ca_pem.is_empty()).then_some(tls.ca_pem),
            server_name: (!tls.server_name.is_empty()).then_some(tls.server_name),
        },
    }))
}

/// What the gateway knows of its connections, as report evidence.
pub fn gateway_evidence(gateway: &crate::gate::Gateway) -> Vec<v1::ConnectionEvidence> {
    gateway
        .connections()
        .iter()
        .map(|c| {
            let health = c.health();
            let (successful_calls, network_failures) = c.take_evidence();
            let required_scope = c
                .gates()
                .into_values()
                .find_map(|g| g.required_scope)
                .unwrap_or_default();
            v1::ConnectionEvidence {
                connection: c.connection().name.clone(),
                state: format!("{:?}", health.state),
                reason: health.reason.unwrap_or_default(),
                http_status: health.http_status.map_or(0, u32::from),
                required_scope,
                successful_calls,
                network_failures,
                credential_failures: u64::from(
                    health.state == crate::upstream::health::HealthState::NeedsCredentials,
                ),
            }
        })
        .collect()
}

/// The projected token, read afresh (the kubelet rotates it).
fn read_token(path: &std::path::Path) -> Result<SecretString, tonic::Status> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(SecretString::from(t.trim().to_owned())),
        Ok(_) => Err(tonic::Status::unauthenticated(format!(
            "the token file {} is empty",
            path.display()
        ))),
        Err(e) => Err(tonic::Status::unauthenticated(format!(
            "cannot read the token file {}: {}",
            path.display(),
            e.kind()
        ))),
    }
}

/// Asks in Kubernetes mode: each becomes an ApprovalRequest the operator
/// creates; the decision comes back on the same stream. A broken stream is
/// resumed by the request's name, so an operator restart loses nothing;
/// dropping the wait ends the stream, and the operator withdraws the request.
pub struct OperatorApprovals {
    client: ConfigClient<Channel>,
    token_file: PathBuf,
    instance: String,
}

impl crate::approvals::Remote for OperatorApprovals {
    fn ask(
        &self,
        ask: crate::approvals::Ask,
        timeout: Duration,
    ) -> crate::approvals::BoxFuture<'_, aip_policy::Approval> {
        Box::pin(self.wait(ask, timeout))
    }
}

impl OperatorApprovals {
    async fn wait(&self, ask: crate::approvals::Ask, timeout: Duration) -> aip_policy::Approval {
        use aip_policy::Approval;
        use v1::approval_update::Decision;
        // The operator expires the request; this only bounds a wait for an
        // operator that never comes back.
        let give_up = Instant::now() + timeout + Duration::from_secs(30);
        let mut name = String::new();
        let mut retry = FIRST_RETRY;
        loop {
            let mut client = self.client.clone();
            let mut request = tonic::Request::new(v1::ApprovalRequest {
                connection: ask.connection.clone(),
                tool: ask.tool.clone(),
                arguments_json: ask.arguments.to_string(),
                arguments_hash: ask.arguments_hash.clone(),
                policy_version: 0,
                resume_name: name.clone(),
                sidecar_instance: self.instance.clone(),
            });
            let authorized = read_token(&self.token_file).and_then(|t| authorize(&mut request, &t));
            let stream = match authorized {
                Ok(()) => client.request_approval(request).await,
                Err(e) => Err(e),
            };
            match stream {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Ok(Some(update)) = stream.message().await {
                        if name.is_empty() {
                            name = update.name.clone();
                            tracing::info!(approval = %name, tool = %ask.tool, "waiting for a decision on ApprovalRequest");
                        }
                        match Decision::try_from(update.decision) {
                            Ok(Decision::Approved) => return Approval::Approved,
                            Ok(Decision::Denied | Decision::Withdrawn) => return Approval::Denied,
                            Ok(Decision::Expired) => return Approval::TimedOut,
                            _ => {}
                        }
                    }
                    retry = FIRST_RETRY;
                }
                // The operator cannot take this ask at all: refuse the call.
                Err(e)
                    if matches!(
                        e.code(),
                        tonic::Code::FailedPrecondition
                            | tonic::Code::InvalidArgument
                            | tonic::Code::PermissionDenied
                            | tonic::Code::Unimplemented
                    ) =>
                {
                    tracing::warn!(error = %e.message(), tool = %ask.tool, "the operator refused the approval request; the call is refused");
                    return Approval::Denied;
                }
                Err(e) => tracing::warn!(error = %e.message(), "approval stream lost; resuming"),
            }
            if Instant::now() + retry >= give_up {
                return Approval::TimedOut;
            }
            tokio::time::sleep(jitter(retry)).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }
}

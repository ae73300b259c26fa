//! The Config service over real gRPC and TLS on loopback, authenticating
//! sidecars by TokenReview against the genuine kube-apiserver: a pod gets
//! its own configuration and every change to it, acks count as synced, and
//! a token for the wrong audience, no token, an expired token or a pod that
//! is gone get nothing. Each test has a namespace of its own on the test
//! binary's control plane.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_api::AgentPolicySpec;
use aip_operator::certs::Served;
use aip_operator::grpc::{
    AuthError, Authenticate, ConfigService, Signals, TokenReviewer, tls::ServerTls,
};
use aip_operator::identity::PodIdentity;
use aip_operator::index::{Index, ObjectKey, PodMeta};
use aip_operator::metrics::Metrics;
use aip_proto::v1::config_client::ConfigClient;
use aip_proto::v1::{ConnectionEvidence, ReportRequest, Snapshot, WatchRequest};
use common::Cluster;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Streaming};

const AUDIENCE: &str = aip_proto::TOKEN_AUDIENCE;
const PATIENCE: Duration = Duration::from_secs(10);

struct Harness {
    cluster: Cluster,
    /// The test's namespace, with ServiceAccount `runner`.
    ns: String,
    index: Arc<Mutex<Index>>,
    channel: Channel,
    policies: mpsc::UnboundedReceiver<ObjectKey>,
    evidence: mpsc::UnboundedReceiver<aip_operator::grpc::Evidence>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    /// Where the listener is, what it serves, and the hand that rotates it.
    addr: std::net::SocketAddr,
    tls: ServerTls,
    served: tokio::sync::watch::Sender<Arc<Served>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn policy(tools: &[&str]) -> AgentPolicySpec {
    serde_json::from_value(json!({
        "allowed_tools": tools,
        "podSelector": {"matchLabels": {"app": "a"}},
    }))
    .unwrap()
}

async fn harness() -> Harness {
    let cluster = Cluster::shared().await;
    let ns = cluster.fresh_namespace("grpc").await;
    cluster.service_account(&ns, "runner").await;
    let index = Arc::new(Mutex::new(Index::new()));
    let (ptx, policies) = mpsc::unbounded_channel();
    let (etx, evidence) = mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let signals = Signals {
        policies: ptx,
        evidence: etx,
        acked: Default::default(),
    };
    let auth = TokenReviewer::new(cluster.admin.clone(), AUDIENCE);
    let approvals = Some(cluster.admin.clone());
    let listening = serve(&index, auth, approvals, signals, &metrics, &shutdown).await;
    Harness {
        addr: listening.addr,
        tls: listening.tls,
        served: listening.served,
        channel: listening.channel,
        cluster,
        ns,
        index,
        policies,
        evidence,
        metrics,
        shutdown,
    }
}

/// The service listening over TLS on loopback.
struct Listening {
    channel: Channel,
    addr: std::net::SocketAddr,
    tls: ServerTls,
    served: tokio::sync::watch::Sender<Arc<Served>>,
}

/// A channel to `addr` that trusts `ca` (PEM) for localhost.
fn channel_to(addr: std::net::SocketAddr, ca: &str) -> Channel {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect_lazy()
}

/// The service over TLS on loopback with `auth`; a channel to it.
async fn serve<A: Authenticate>(
    index: &Arc<Mutex<Index>>,
    auth: A,
    approvals: Option<kube::Client>,
    signals: Signals,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Listening {
    serve_capped(index, auth, approvals, signals, metrics, shutdown, None).await
}

/// The same, serving at most `max_sidecars` when given.
async fn serve_capped<A: Authenticate>(
    index: &Arc<Mutex<Index>>,
    auth: A,
    approvals: Option<kube::Client>,
    signals: Signals,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    max_sidecars: Option<usize>,
) -> Listening {
    let mut service = ConfigService::new(
        index.clone(),
        auth,
        signals,
        metrics.clone(),
        shutdown.clone(),
    );
    if let Some(max) = max_sidecars {
        service = service.with_max_sidecars(max);
    }
    if let Some(client) = approvals {
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "aip-operator".to_owned(),
                instance: None,
            },
        );
        service = service.with_approvals(client, recorder, "test-replica", Duration::from_secs(60));
    }
    let tls = ServerTls::self_signed(&["localhost".to_owned()]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let first = Served::new(tls.clone(), tls.cert_pem.clone()).unwrap();
    let (served, rx) = tokio::sync::watch::channel(Arc::new(first));
    tokio::spawn(aip_operator::grpc::serve(listener, rx, service));
    Listening {
        channel: channel_to(addr, &tls.cert_pem),
        addr,
        tls,
        served,
    }
}

impl Harness {
    /// A pod in the cluster and in the index; its uid.
    async fn pod(&self, name: &str, app: &str) -> String {
        let uid = self
            .cluster
            .pod(&self.ns, name, "runner", json!({"app": app}))
            .await;
        self.index.lock().unwrap().apply_pod(PodMeta {
            namespace: self.ns.clone(),
            name: name.to_owned(),
            uid: uid.clone(),
            labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
            injected: true,
            lock: None,
        });
        uid
    }

    /// A token for pod `pod` (uid) for `audiences`, as the kubelet
    /// projects it.
    async fn token(&self, pod: &str, uid: &str, audiences: &[&str]) -> String {
        self.cluster
            .token(&self.ns, "runner", pod, uid, audiences)
            .await
    }

    fn apply_policy(&self, generation: i64, spec: &AgentPolicySpec) {
        self.index
            .lock()
            .unwrap()
            .apply_policy(&self.ns, "p", Some(generation), spec);
    }

    async fn watch(&self, token: Option<&str>) -> Result<Streaming<Snapshot>, tonic::Status> {
        let mut request = tonic::Request::new(WatchRequest {
            sidecar_version: "test".to_owned(),
            ..WatchRequest::default()
        });
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        ConfigClient::new(self.channel.clone())
            .watch(request)
            .await
            .map(tonic::Response::into_inner)
    }
}

/// The operator's certificate rotates under an open stream: a new bundle
/// reaches the sidecar at once, with the same configuration; a new
/// certificate ends the stream, and the next handshake presents it, which
/// only the new bundle verifies.
#[tokio::test]
async fn a_new_bundle_is_sent_at_once_and_a_new_certificate_ends_the_stream() {
    let h = harness().await;
    let uid = h.pod("agent-1", "a").await;
    h.apply_policy(1, &policy(&["read_file"]));
    let token = h.token("agent-1", &uid, &[AUDIENCE]).await;
    let mut stream = h.watch(Some(&token)).await.unwrap();
    let first = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(first.trust_bundle_pem, h.tls.cert_pem);

    let rotated = ServerTls::self_signed(&["localhost".to_owned()]).unwrap();
    let both = format!("{}{}", h.tls.cert_pem, rotated.cert_pem);
    let serve = |tls: &ServerTls| Arc::new(Served::new(tls.clone(), both.clone()).unwrap());
    h.served.send(serve(&h.tls)).unwrap();
    let second = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(second.trust_bundle_pem, both);
    assert_eq!(second.version, first.version, "the same configuration");

    h.served.send(serve(&rotated)).unwrap();
    let end = next(&mut stream).await.unwrap_err();
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(end.message().contains("new certificate"), "{end:?}");

    let watch_on = |channel: Channel| {
        let token = token.clone();
        async move {
            let mut request = tonic::Request::new(WatchRequest::default());
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            ConfigClient::new(channel).watch(request).await.map(|_| ())
        }
    };
    let stale = watch_on(channel_to(h.addr, &h.tls.cert_pem)).await;
    assert!(
        stale.is_err(),
        "the old CA alone no longer verifies the operator"
    );
    watch_on(channel_to(h.addr, &both)).await.unwrap();
}

/// A client that opens a connection and never finishes its TLS handshake is
/// let go after the deadline, and others are served meanwhile.
#[tokio::test]
async fn a_handshake_that_never_finishes_is_let_go() {
    use tokio::io::AsyncReadExt;
    let h = harness().await;
    let started = std::time::Instant::now();
    let mut silent = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let uid = h.pod("agent-1", "a").await;
    h.apply_policy(1, &policy(&["read_file"]));
    let token = h.token("agent-1", &uid, &[AUDIENCE]).await;
    let mut stream = h.watch(Some(&token)).await.unwrap();
    assert!(
        next(&mut stream).await.unwrap().is_some(),
        "served meanwhile"
    );
    let mut buf = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "closed by the deadline, not at once"
    );
}

async fn next(stream: &mut Streaming<Snapshot>) -> Result<Option<Snapshot>, tonic::Status> {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a message or the end within the patience")
}

#[tokio::test]
async fn a_sidecar_gets_its_pods_config_and_every_change() {
    let mut h = harness().await;
    let uid = h.pod("agent-1", "a").await;
    h.apply_policy(1, &policy(&["read_file"]));
    let token = h.token("agent-1", &uid, &[AUDIENCE]).await;

    let mut stream = h.watch(Some(&token)).await.unwrap();
    let first = next(&mut stream).await.unwrap().unwrap();
    let p = first.policy.as_ref().unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        (h.ns.as_str(), "p")
    );
    assert!(p.document_json.contains("read_file"));

    h.apply_policy(2, &policy(&["read_file", "ls"]));
    let second = next(&mut stream).await.unwrap().unwrap();
    assert!(second.version > first.version);
    assert!(
        second
            .policy
            .as_ref()
            .unwrap()
            .document_json
            .contains("\"ls\"")
    );
    assert_ne!(second.policy.as_ref().unwrap().hash, p.hash);

    // The ack counts as synced and the policy's status writer hears of it.
    let mut report = tonic::Request::new(ReportRequest {
        applied_version: second.version,
        refused_reason: String::new(),
        connections: vec![ConnectionEvidence {
            connection: "gh".to_owned(),
            health: aip_proto::v1::HealthState::NeedsCredentials as i32,
            http_status: 401,
            credential_failures: 1,
            ..ConnectionEvidence::default()
        }],
    });
    report
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    ConfigClient::new(h.channel.clone())
        .report(report)
        .await
        .unwrap();
    assert_eq!(h.policies.recv().await, Some(ObjectKey::new(&h.ns, "p")));
    let view = h.index.lock().unwrap().policy_view(&h.ns, "p").unwrap();
    assert_eq!((view.governed_pods, view.synced_pods), (1, 1));
    let evidence = h.evidence.recv().await.unwrap();
    assert_eq!(evidence.connection, ObjectKey::new(&h.ns, "gh"));
    assert_eq!(
        (evidence.pod.as_str(), evidence.http_status),
        ("agent-1", 401)
    );

    let metrics = h.metrics.encode();
    assert!(
        metrics.contains("aip_operator_connected_sidecars 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("aip_operator_propagation_seconds_count 1"),
        "{metrics}"
    );

    // The pod goes away: its stream ends.
    h.index.lock().unwrap().delete_pod(&h.ns, "agent-1");
    let end = next(&mut stream).await.unwrap_err();
    assert_eq!(end.code(), Code::NotFound, "{end:?}");
}

#[tokio::test]
async fn each_token_gets_its_own_pods_config_only() {
    let h = harness().await;
    h.pod("agent-a", "a").await;
    let uid_b = h.pod("agent-b", "b").await;
    h.apply_policy(1, &policy(&["read_file"]));
    let token_b = h.token("agent-b", &uid_b, &[AUDIENCE]).await;
    let mut stream = h.watch(Some(&token_b)).await.unwrap();
    let snapshot = next(&mut stream).await.unwrap().unwrap();
    assert!(snapshot.policy.is_none(), "agent-b is not governed by p");
    assert_eq!(
        snapshot.deny_reason,
        format!("no AgentPolicy in namespace {} selects this pod", h.ns)
    );
}

#[tokio::test]
async fn wrong_audience_missing_token_and_unknown_pods_get_nothing() {
    let h = harness().await;
    let uid = h.pod("agent-1", "a").await;

    // The API server's own audience: what a pod's default token carries.
    let default = h.token("agent-1", &uid, &[]).await;
    let refused = h.watch(Some(&default)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused.message().starts_with(&format!(
            "the API server did not accept the token: [invalid bearer token, token audiences [\"{}\"] is invalid for the target audiences [\"aip.io/sidecar\"]",
            h.cluster.control_plane().url()
        )) || !h.cluster.control_plane().is_local(),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("audience"),
        "{}",
        refused.message()
    );

    let refused = h.watch(None).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused.message().starts_with("no bearer token"),
        "{}",
        refused.message()
    );

    let refused = h.watch(Some("not-a-token")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);

    // A valid token for a pod the index has not seen (yet): retryable.
    let uid2 = h.cluster.pod(&h.ns, "agent-2", "runner", json!({})).await;
    let token2 = h.token("agent-2", &uid2, &[AUDIENCE]).await;
    let refused = h.watch(Some(&token2)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    // A token for a pod that is gone, though the index still lists it. An
    // unscheduled pod is deleted at once, but the API server looks the
    // bound pod up in its own informer's cache first: until that has seen
    // the deletion the token still passes (and a passing review is then
    // cached for 10 s, by the API server and by the operator for up to
    // 60 s). So the review waits until a watch of ours has seen the pod go,
    // which comes from the same watch cache as the API server's informer.
    let uid3 = h.pod("agent-3", "a").await;
    let token3 = h.token("agent-3", &uid3, &[AUDIENCE]).await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(h.cluster.admin.clone(), &h.ns);
    pods.delete("agent-3", &Default::default()).await.unwrap();
    let gone = kube::runtime::wait::await_condition(
        pods,
        "agent-3",
        kube::runtime::wait::conditions::is_deleted(&uid3),
    );
    tokio::time::timeout(PATIENCE, gone).await.unwrap().unwrap();
    let refused = h.watch(Some(&token3)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(
        refused.message(),
        "the API server did not accept the token: [invalid bearer token, service account token has been invalidated]"
    );

    let metrics = h.metrics.encode();
    assert!(
        metrics.contains("aip_operator_sidecar_auth_failures_total{reason=\"missing\"} 1"),
        "{metrics}"
    );
}

/// A pod's sidecar token re-signed with the control plane's own
/// service-account key, its validity moved an hour into the past: the API
/// server refuses it as expired, and so does the operator.
#[tokio::test]
async fn an_expired_token_is_refused_by_the_api_server() {
    let h = harness().await;
    let Some(dir) = h.cluster.control_plane().dir() else {
        eprintln!("skipped: the signing key of a given cluster is not ours to read");
        return;
    };
    let uid = h.pod("agent-1", "a").await;
    let fresh = h.token("agent-1", &uid, &[AUDIENCE]).await;
    let expired = resigned_in_the_past(&fresh, &dir.join("service-account.key"));
    let refused = h.watch(Some(&expired)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(
        refused.message(),
        "the API server did not accept the token: [invalid bearer token, service account token has expired]"
    );
    // The same claims within their validity are accepted: only the times differ.
    assert!(h.watch(Some(&fresh)).await.is_ok());
}

/// `token` with `iat`, `nbf` and `exp` an hour earlier, signed (ES256,
/// the same key id) with the PKCS#8 key at `key`.
fn resigned_in_the_past(token: &str, key: &std::path::Path) -> String {
    use base64::Engine;
    let part = |i: usize| -> serde_json::Value {
        let text = token.split('.').nth(i).unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    };
    let (header, mut claims) = (part(0), part(1));
    let hour = 3600;
    for time in ["iat", "nbf", "exp"] {
        let t = claims[time].as_i64().unwrap();
        claims[time] = json!(t - hour - 600);
    }
    assert!(claims["exp"].as_i64().unwrap() < time_now(), "{claims}");
    let mut signed = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    signed.typ = None;
    signed.kid = header["kid"].as_str().map(str::to_owned);
    let pem = std::fs::read_to_string(key).unwrap();
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(der)
        .unwrap();
    let key = jsonwebtoken::EncodingKey::from_ec_der(&der);
    jsonwebtoken::encode(&signed, &claims, &key).unwrap()
}

fn time_now() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(now.as_secs()).unwrap()
}

/// Vouches for one pod whatever the token, with a given expiry.
struct Vouch(PodIdentity);

impl Authenticate for Vouch {
    async fn authenticate(&self, _: &str) -> Result<PodIdentity, AuthError> {
        Ok(self.0.clone())
    }
}

/// A server for one injected pod, `agents/agent-1`, whose every token is
/// vouched for (until `expires`).
struct OnePod {
    index: Arc<Mutex<Index>>,
    auth: PodIdentity,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    signals: Signals,
    /// Kept open for the server's sends.
    _received: (
        mpsc::UnboundedReceiver<ObjectKey>,
        mpsc::UnboundedReceiver<aip_operator::grpc::Evidence>,
    ),
}

impl OnePod {
    fn new(expires: Option<std::time::SystemTime>) -> Self {
        let index = Arc::new(Mutex::new(Index::new()));
        index.lock().unwrap().apply_pod(PodMeta {
            namespace: "agents".to_owned(),
            name: "agent-1".to_owned(),
            uid: "u1".to_owned(),
            labels: BTreeMap::new(),
            injected: true,
            lock: None,
        });
        let auth = PodIdentity {
            namespace: "agents".to_owned(),
            pod: "agent-1".to_owned(),
            uid: "u1".to_owned(),
            service_account: "runner".to_owned(),
            expires,
        };
        let (policies, acks) = mpsc::unbounded_channel();
        let (evidence, evidenced) = mpsc::unbounded_channel();
        Self {
            index,
            auth,
            metrics: Arc::new(Metrics::new()),
            shutdown: CancellationToken::new(),
            signals: Signals {
                policies,
                evidence,
                acked: Default::default(),
            },
            _received: (acks, evidenced),
        }
    }

    /// Serves it, with at most `cap` sidecars.
    async fn serve(&self, cap: Option<usize>) -> Listening {
        let auth = Vouch(self.auth.clone());
        let signals = self.signals.clone();
        serve_capped(
            &self.index,
            auth,
            None,
            signals,
            &self.metrics,
            &self.shutdown,
            cap,
        )
        .await
    }
}

#[tokio::test]
async fn the_stream_ends_when_the_token_expires() {
    let expires = std::time::SystemTime::now() + Duration::from_millis(1500);
    let one = OnePod::new(Some(expires));
    let _stop = one.shutdown.clone().drop_guard();
    let channel = one.serve(None).await.channel;
    let mut request = tonic::Request::new(WatchRequest::default());
    request
        .metadata_mut()
        .insert("authorization", "Bearer any".parse().unwrap());
    let mut stream = ConfigClient::new(channel)
        .watch(request)
        .await
        .unwrap()
        .into_inner();
    assert!(
        next(&mut stream).await.unwrap().is_some(),
        "the first snapshot"
    );
    let end = next(&mut stream).await.unwrap_err();
    assert_eq!(end.code(), Code::Unauthenticated);
    assert!(
        end.message().starts_with("the token has expired"),
        "{}",
        end.message()
    );
    assert!(std::time::SystemTime::now() >= expires);
}

/// A replica that serves its maximum refuses the next sidecar at once
/// (accepted and told, RESOURCE_EXHAUSTED naming the cap, not left in the
/// backlog), counts it, and serves it once there is room again on a new
/// connection (what the sidecar opens after such a refusal).
#[tokio::test]
async fn a_sidecar_over_the_cap_is_refused_at_once_and_served_when_there_is_room() {
    let one = OnePod::new(None);
    let _stop = one.shutdown.clone().drop_guard();
    let metrics = one.metrics.clone();
    let listening = one.serve(Some(1)).await;
    let watch = |channel: Channel| async move {
        let mut request = tonic::Request::new(WatchRequest::default());
        request
            .metadata_mut()
            .insert("authorization", "Bearer any".parse().unwrap());
        ConfigClient::new(channel).watch(request).await
    };
    let mut first = watch(listening.channel.clone()).await.unwrap().into_inner();
    assert!(
        next(&mut first).await.unwrap().is_some(),
        "the first is served"
    );

    let started = std::time::Instant::now();
    let second = channel_to(listening.addr, &listening.tls.cert_pem);
    let refused = watch(second.clone()).await.unwrap_err();
    assert!(started.elapsed() < PATIENCE, "answered, not left waiting");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("serves its maximum of 1 sidecars (--max-sidecars)"),
        "{}",
        refused.message()
    );
    let said = metrics.encode();
    assert!(
        said.contains("aip_operator_capacity_refusals_total 1"),
        "{said}"
    );
    assert!(said.contains("aip_operator_grpc_connections 1"), "{said}");
    assert!(said.contains("aip_operator_max_sidecars 1"), "{said}");

    // Room again: the first leaves; a new connection is served.
    drop(first);
    drop(listening.channel);
    drop(second);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let fresh = channel_to(listening.addr, &listening.tls.cert_pem);
        match watch(fresh).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                assert!(next(&mut stream).await.unwrap().is_some());
                break;
            }
            Err(e) if e.code() == Code::ResourceExhausted => {
                assert!(std::time::Instant::now() < deadline, "never served again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

mod approvals {
    use super::*;
    use aip_api::{ApprovalRequest as ApprovalObject, approval_request::Decision};
    use aip_proto::v1::approval_update::Decision as Wire;
    use aip_proto::v1::{ApprovalRequest, ApprovalUpdate, ApprovalWithdrawal};
    use kube::ResourceExt;
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::wait::await_condition;

    async fn setup(timeout_seconds: u32) -> (Harness, String) {
        let h = harness().await;
        common::install_crds(&h.cluster.admin).await;
        let uid = h.pod("agent-1", "a").await;
        let mut spec = policy(&["write_file"]);
        spec.approval = Some(aip_api::agent_policy::ApprovalSettings {
            timeout_seconds: Some(timeout_seconds),
            allowed_service_accounts: Vec::new(),
        });
        h.apply_policy(1, &spec);
        let token = h.token("agent-1", &uid, &[AUDIENCE]).await;
        (h, token)
    }

    /// An ask as a sidecar before explicit withdrawals makes it.
    async fn ask(h: &Harness, token: &str) -> Streaming<ApprovalUpdate> {
        ask_as(h, token, ApprovalRequest::default()).await
    }

    /// An ask as today's sidecar makes it: its own id for the call, and
    /// explicit withdrawals.
    fn explicit(ask_id: &str, resume: &str) -> ApprovalRequest {
        ApprovalRequest {
            ask_id: ask_id.to_owned(),
            resume_name: resume.to_owned(),
            sidecar_instance: "instance-1".to_owned(),
            withdraws_explicitly: true,
            ..ApprovalRequest::default()
        }
    }

    async fn ask_as(h: &Harness, token: &str, base: ApprovalRequest) -> Streaming<ApprovalUpdate> {
        let mut request = tonic::Request::new(ApprovalRequest {
            connection: "fs".to_owned(),
            tool: "fs_write_file".to_owned(),
            arguments_json: r#"{"path":"/tmp/x","content":"[REDACTED:token]"}"#.to_owned(),
            arguments_hash: "sha256:00".to_owned(),
            policy_version: 1,
            ..base
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        ConfigClient::new(h.channel.clone())
            .request_approval(request)
            .await
            .unwrap()
            .into_inner()
    }

    async fn withdraw(
        h: &Harness,
        token: &str,
        withdrawal: ApprovalWithdrawal,
    ) -> Result<ApprovalUpdate, tonic::Status> {
        let mut request = tonic::Request::new(withdrawal);
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        ConfigClient::new(h.channel.clone())
            .withdraw_approval(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Alice's approval of `name`, written straight to its status.
    async fn approved(h: &Harness, name: &str) {
        let api: Api<ApprovalObject> = Api::namespaced(h.cluster.admin.clone(), &h.ns);
        let decided = serde_json::json!({"status": {"decision": "Approved", "decidedBy": "alice"}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(decided))
            .await
            .unwrap();
    }

    /// Waits until ApprovalRequest `name` satisfies `ok`.
    async fn until(
        h: &Harness,
        name: &str,
        ok: impl Fn(&ApprovalObject) -> bool,
    ) -> ApprovalObject {
        let api: Api<ApprovalObject> = Api::namespaced(h.cluster.admin.clone(), &h.ns);
        let cond = await_condition(api, name, move |o: Option<&ApprovalObject>| {
            o.is_some_and(&ok)
        });
        tokio::time::timeout(PATIENCE, cond)
            .await
            .expect("in time")
            .unwrap()
            .unwrap()
    }

    async fn update(stream: &mut Streaming<ApprovalUpdate>) -> ApprovalUpdate {
        tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("an update in time")
            .unwrap()
            .expect("the stream goes on")
    }

    #[tokio::test]
    async fn an_ask_becomes_an_approval_request_and_its_decision_comes_back() {
        let (h, token) = setup(300).await;
        let mut stream = ask(&h, &token).await;
        let pending = update(&mut stream).await;
        assert_eq!(pending.decision, Wire::Pending as i32);
        let api: Api<ApprovalObject> = Api::namespaced(h.cluster.admin.clone(), &h.ns);
        let object = api.get(&pending.name).await.unwrap();
        assert!(
            pending.name.starts_with("fs-write-file-"),
            "{}",
            pending.name
        );
        assert_eq!(object.spec.pod, "agent-1");
        assert_eq!(object.spec.policy, "p");
        assert_eq!(object.spec.service_account, "runner");
        assert_eq!(
            object.spec.arguments,
            r#"{"path":"/tmp/x","content":"[REDACTED:token]"}"#
        );
        let labels = object.metadata.labels.clone().unwrap();
        assert_eq!(
            labels.get("aip.io/tool").map(String::as_str),
            Some("fs_write_file")
        );
        assert_eq!(
            labels.get("aip.io/pod").map(String::as_str),
            Some("agent-1")
        );
        assert!(
            object.metadata.owner_references.is_none(),
            "the evidence outlives the pod"
        );

        let decided = serde_json::json!({"status": {"decision": "Approved", "decidedBy": "alice", "reason": "looks fine"}});
        api.patch_status(
            &pending.name,
            &PatchParams::default(),
            &Patch::Merge(decided),
        )
        .await
        .unwrap();
        let approved = update(&mut stream).await;
        assert_eq!(approved.decision, Wire::Approved as i32);
        assert_eq!(
            (approved.decided_by.as_str(), approved.reason.as_str()),
            ("alice", "looks fine")
        );
        assert!(
            stream.message().await.unwrap().is_none(),
            "the stream ends with the decision"
        );
        let metrics = h.metrics.encode();
        assert!(
            metrics.contains("aip_operator_approval_decision_seconds_count 1"),
            "{metrics}"
        );
    }

    /// A sidecar one release older withdraws nothing explicitly: its
    /// closed stream withdraws the request, as it always did, and says so.
    #[tokio::test]
    async fn an_older_sidecars_closed_stream_withdraws_its_request() {
        let (h, token) = setup(300).await;
        let mut stream = ask(&h, &token).await;
        let pending = update(&mut stream).await;
        drop(stream);
        let object = until(&h, &pending.name, |o| {
            o.status
                .as_ref()
                .is_some_and(|s| s.decision == Decision::Withdrawn)
        })
        .await;
        assert_eq!(
            object.status.unwrap().reason.as_deref(),
            Some("StreamClosed")
        );
    }

    /// Today's sidecar: a broken stream leaves the request Pending, marked
    /// away by the stream that closed; the sidecar resumes it, the mark is
    /// cleared, and a decision made in between reaches the resumed stream.
    /// The update carries the expiry and how long to keep the ask.
    #[tokio::test]
    async fn a_broken_stream_leaves_the_request_pending_until_the_sidecar_resumes_it() {
        let (h, token) = setup(300).await;
        let mut stream = ask_as(&h, &token, explicit("a1", "")).await;
        let pending = update(&mut stream).await;
        assert!(
            pending.expires_at_unix_ms > time_now() * 1000,
            "{pending:?}"
        );
        assert_eq!(pending.keep_without_operator_ms, 120_000);
        let followed = until(&h, &pending.name, |o| {
            o.annotations().contains_key("aip.io/followed-by")
        })
        .await;
        let first = followed.annotations()["aip.io/followed-by"].clone();
        assert!(first.starts_with("test-replica/"), "{first}");
        drop(stream);
        let away = until(&h, &pending.name, |o| {
            o.annotations().contains_key("aip.io/away-since")
        })
        .await;
        assert_eq!(away.status.unwrap().decision, Decision::Pending);

        approved(&h, &pending.name).await;
        let mut resumed = ask_as(&h, &token, explicit("a1", &pending.name)).await;
        assert_eq!(update(&mut resumed).await.decision, Wire::Approved as i32);
        let back = until(&h, &pending.name, |o| {
            !o.annotations().contains_key("aip.io/away-since")
        })
        .await;
        assert_ne!(back.annotations()["aip.io/followed-by"], first);
    }

    /// A create retried with the same ask id (its first answer lost) finds
    /// the request it made: one request, one name.
    #[tokio::test]
    async fn a_retried_create_finds_the_request_it_made() {
        let (h, token) = setup(300).await;
        let mut first = ask_as(&h, &token, explicit("retried", "")).await;
        let one = update(&mut first).await;
        let mut again = ask_as(&h, &token, explicit("retried", "")).await;
        let two = update(&mut again).await;
        assert_eq!(one.name, two.name);
        let api: Api<ApprovalObject> = Api::namespaced(h.cluster.admin.clone(), &h.ns);
        let all = api.list(&Default::default()).await.unwrap();
        assert_eq!(
            all.items.len(),
            1,
            "{:?}",
            all.items
                .iter()
                .map(|o| o.metadata.name.clone())
                .collect::<Vec<_>>()
        );
        assert_eq!(all.items[0].spec.ask_id, "retried");
    }

    /// The sidecar withdraws with a reason, which the request keeps; a
    /// reason that is no withdrawal is refused and named; a decision that
    /// came first stands.
    #[tokio::test]
    async fn a_withdrawal_names_its_reason_and_never_overrides_a_decision() {
        let (h, token) = setup(300).await;
        let mut stream = ask_as(&h, &token, explicit("w1", "")).await;
        let pending = update(&mut stream).await;
        let bad = withdraw(
            &h,
            &token,
            ApprovalWithdrawal {
                name: pending.name.clone(),
                reason: "Denied".to_owned(),
                ..ApprovalWithdrawal::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
        assert!(
            bad.message()
                .contains("\"Denied\" is not a withdrawal reason"),
            "{}",
            bad.message()
        );
        // By ask id alone: the create's answer may never have arrived.
        let after = withdraw(
            &h,
            &token,
            ApprovalWithdrawal {
                ask_id: "w1".to_owned(),
                sidecar_instance: "instance-1".to_owned(),
                tool: "fs_write_file".to_owned(),
                reason: "Cancelled".to_owned(),
                ..ApprovalWithdrawal::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(
            (after.name.as_str(), after.decision),
            (pending.name.as_str(), Wire::Withdrawn as i32)
        );
        assert_eq!(after.reason, "Cancelled");
        assert_eq!(update(&mut stream).await.decision, Wire::Withdrawn as i32);

        let mut stream = ask_as(&h, &token, explicit("w2", "")).await;
        let pending = update(&mut stream).await;
        approved(&h, &pending.name).await;
        let late = withdraw(
            &h,
            &token,
            ApprovalWithdrawal {
                name: pending.name.clone(),
                reason: "GatewayShutdown".to_owned(),
                ..ApprovalWithdrawal::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(late.decision, Wire::Approved as i32);
        let missing = withdraw(
            &h,
            &token,
            ApprovalWithdrawal {
                name: "no-such-request".to_owned(),
                reason: "Cancelled".to_owned(),
                ..ApprovalWithdrawal::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(missing.code(), Code::NotFound);
    }

    #[tokio::test]
    async fn an_undecided_request_expires() {
        let (h, token) = setup(1).await;
        let mut stream = ask(&h, &token).await;
        let pending = update(&mut stream).await;
        let expired = update(&mut stream).await;
        assert_eq!(expired.decision, Wire::Expired as i32);
        let api: Api<ApprovalObject> = Api::namespaced(h.cluster.admin.clone(), &h.ns);
        let object = api.get(&pending.name).await.unwrap();
        assert_eq!(object.status.unwrap().decision, Decision::Expired);
    }
}

//! Kubernetes mode's configuration source against an in-test operator (a
//! real aip.config.v1 gRPC server over TLS on loopback): snapshots become
//! the gateway's configuration and are acked; a lost operator leaves the last
//! configuration in force, or, past --max-staleness, fails closed; the token
//! file is read again at every connection; a snapshot the sidecar cannot
//! compile is refused and reported, keeping the previous one.

#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_proto::v1::config_server::{Config as ConfigApi, ConfigServer};
use aip_proto::v1::{
    ApprovalRequest, ApprovalUpdate, Policy, ReportRequest, ReportResponse, Snapshot, WatchRequest,
};
use aip_sidecar::config::Config;
use aip_sidecar::control::{self as operator, OperatorCa, OperatorSource};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

const PATIENCE: Duration = Duration::from_secs(10);

type Feed = mpsc::Sender<Result<Snapshot, Status>>;

/// The operator's side: each Watch hands the test a sender for that
/// stream; reports and presented tokens are recorded.
type Asked = (
    ApprovalRequest,
    mpsc::Sender<Result<ApprovalUpdate, Status>>,
);

struct Operator {
    asks: mpsc::UnboundedSender<Asked>,
    streams: mpsc::UnboundedSender<Feed>,
    reports: mpsc::UnboundedSender<ReportRequest>,
    tokens: Arc<Mutex<Vec<String>>>,
}

impl Operator {
    fn token<T>(&self, r: &Request<T>) {
        let t = r.metadata().get("authorization").unwrap().to_str().unwrap();
        self.tokens.lock().unwrap().push(t.to_owned());
    }
}

type Snapshots = Pin<Box<dyn Stream<Item = Result<Snapshot, Status>> + Send>>;
type Updates = Pin<Box<dyn Stream<Item = Result<ApprovalUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl ConfigApi for Operator {
    type WatchStream = Snapshots;
    type RequestApprovalStream = Updates;

    async fn watch(&self, r: Request<WatchRequest>) -> Result<Response<Snapshots>, Status> {
        self.token(&r);
        let (tx, rx) = mpsc::channel(4);
        self.streams.send(tx).unwrap();
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn report(&self, r: Request<ReportRequest>) -> Result<Response<ReportResponse>, Status> {
        self.token(&r);
        let _ = self.reports.send(r.into_inner());
        Ok(Response::new(ReportResponse {}))
    }

    async fn request_approval(
        &self,
        r: Request<ApprovalRequest>,
    ) -> Result<Response<Updates>, Status> {
        self.token(&r);
        let ask = r.into_inner();
        if ask.tool == "refused" {
            return Err(Status::failed_precondition("no policy"));
        }
        let (tx, rx) = mpsc::channel(4);
        self.asks.send((ask, tx)).unwrap();
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

struct Harness {
    config: watch::Receiver<Arc<Config>>,
    approvals: Arc<operator::OperatorApprovals>,
    asks: mpsc::UnboundedReceiver<Asked>,
    streams: mpsc::UnboundedReceiver<Feed>,
    reports: mpsc::UnboundedReceiver<ReportRequest>,
    tokens: Arc<Mutex<Vec<String>>>,
    token_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn harness(max_staleness: Option<Duration>) -> Harness {
    // Under cargo's target/tmp: a run that is killed leaves nothing outside.
    let dir = tempfile::Builder::new()
        .prefix("aip-operator-source-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["operator.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, cert.pem()).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();

    let (stx, streams) = mpsc::unbounded_channel();
    let (rtx, reports) = mpsc::unbounded_channel();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let (atx, asks) = mpsc::unbounded_channel();
    let service = Operator {
        asks: atx,
        streams: stx,
        reports: rtx,
        tokens: tokens.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let identity = tonic::transport::Identity::from_pem(cert.pem(), key.serialize_pem());
    let server = tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .unwrap()
        .add_service(ConfigServer::new(service))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown.clone().cancelled_owned(),
        );
    tokio::spawn(server);

    let (_, evidence) = watch::channel(None);
    let watched = operator::watch(
        OperatorSource {
            url: format!("https://{addr}"),
            ca: OperatorCa::File(ca_file),
            ca_cache: None,
            server_name: Some("operator.test".to_owned()),
            token_file: token_file.clone(),
            max_staleness,
        },
        evidence,
        shutdown.clone(),
    )
    .unwrap();
    Harness {
        config: watched.config,
        approvals: watched.approvals,
        asks,
        streams,
        reports,
        tokens,
        token_file,
        _dir: dir,
        shutdown,
    }
}

fn snapshot(version: u64, tools: &[&str]) -> Snapshot {
    let document = serde_json::json!({
        "apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
        "metadata": {"name": "p"}, "spec": {"allowed_tools": tools},
    });
    let policy = aip_policy::AgentPolicy::from_value(&document).unwrap();
    Snapshot {
        version,
        policy: Some(Policy {
            namespace: "agents".to_owned(),
            name: "p".to_owned(),
            hash: aip_policy::hash::policy_hash(&policy),
            document_json: document.to_string(),
        }),
        ..Snapshot::default()
    }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

/// Waits until the gateway's config satisfies `ok`.
async fn config_until(h: &mut Harness, ok: impl Fn(&Config) -> bool) {
    within(h.config.wait_for(|c| ok(c))).await.unwrap();
}

fn allows(config: &Config, tool: &str) -> bool {
    config
        .policy
        .as_ref()
        .is_some_and(|p| p.spec.allowed_tools.iter().flatten().any(|t| t == tool))
}

#[tokio::test]
async fn snapshots_become_the_config_and_are_acked() {
    let mut h = harness(None).await;
    assert!(
        h.config.borrow().policy.is_none(),
        "nothing allowed before the first config"
    );
    let feed = within(h.streams.recv()).await.unwrap();
    feed.send(Ok(snapshot(7, &["read_file"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "read_file")).await;
    let report = within(h.reports.recv()).await.unwrap();
    assert_eq!(
        (report.applied_version, report.refused_reason.as_str()),
        (7, "")
    );
    assert_eq!(h.tokens.lock().unwrap()[0], "Bearer token-1");

    // A policy the sidecar cannot accept is refused and reported; the
    // previous one stays.
    let mut bad = snapshot(8, &["x"]);
    bad.policy.as_mut().unwrap().document_json =
        r#"{"apiVersion":"aip.io/v1alpha1","kind":"AgentPolicy","metadata":{"name":"p"},"spec":{"tool_rules":[{"tool":"x","rate_limit":"lots"}]}}"#.to_owned();
    feed.send(Ok(bad)).await.unwrap();
    let report = within(h.reports.recv()).await.unwrap();
    assert_eq!(report.applied_version, 7);
    assert!(
        report
            .refused_reason
            .contains("spec.tool_rules[0].rate_limit"),
        "{}",
        report.refused_reason
    );
    assert!(allows(&h.config.borrow(), "read_file"));
}

#[tokio::test]
async fn a_lost_operator_leaves_the_last_config_and_reconnects_with_a_fresh_token() {
    let mut h = harness(None).await;
    let feed = within(h.streams.recv()).await.unwrap();
    feed.send(Ok(snapshot(1, &["read_file"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "read_file")).await;

    // The kubelet rotates the token; then the operator drops the stream.
    std::fs::write(&h.token_file, "token-2").unwrap();
    feed.send(Err(Status::unavailable("operator restarting")))
        .await
        .unwrap();
    drop(feed);
    let feed = within(h.streams.recv()).await.unwrap();
    assert!(allows(&h.config.borrow(), "read_file"), "kept while away");
    assert_eq!(h.tokens.lock().unwrap().last().unwrap(), "Bearer token-2");
    feed.send(Ok(snapshot(2, &["ls"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "ls")).await;
}

#[tokio::test]
async fn past_max_staleness_every_call_is_refused_until_the_operator_returns() {
    let mut h = harness(Some(Duration::from_millis(300))).await;
    let feed = within(h.streams.recv()).await.unwrap();
    feed.send(Ok(snapshot(1, &["read_file"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "read_file")).await;
    // The operator goes away and stays away: every reconnection fails.
    feed.send(Err(Status::unavailable("gone"))).await.unwrap();
    drop(feed);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        tokio::select! {
            f = h.streams.recv() => {
                let f = f.unwrap();
                f.send(Err(Status::unavailable("still gone"))).await.unwrap();
            }
            r = h.config.wait_for(|c| c.policy.is_none()) => { r.unwrap(); break; }
            () = tokio::time::sleep_until(deadline) => panic!("never failed closed"),
        }
    }
    assert!(h.config.borrow().policy.is_none());
    // Back: the next snapshot restores service.
    let feed = within(h.streams.recv()).await.unwrap();
    feed.send(Ok(snapshot(3, &["read_file"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "read_file")).await;
}

#[test]
fn an_unchanged_policy_keeps_its_evaluator() {
    let first = operator::from_snapshot(&snapshot(1, &["a"]), &Config::empty()).unwrap();
    let mut same = snapshot(2, &["a"]);
    same.connections = Vec::new();
    let second = operator::from_snapshot(&same, &first).unwrap();
    assert!(Arc::ptr_eq(&first.evaluator, &second.evaluator));
    let third = operator::from_snapshot(&snapshot(3, &["b"]), &second).unwrap();
    assert!(!Arc::ptr_eq(&second.evaluator, &third.evaluator));
}

#[test]
fn keep_previous_keeps_the_policy_in_force_and_denies_without_one() {
    let running = operator::from_snapshot(&snapshot(1, &["a"]), &Config::empty()).unwrap();
    let keep = Snapshot {
        version: 2,
        keep_previous: true,
        deny_reason: "AgentPolicy p is not accepted".to_owned(),
        ..Snapshot::default()
    };
    let kept = operator::from_snapshot(&keep, &running).unwrap();
    assert!(Arc::ptr_eq(&kept.evaluator, &running.evaluator));
    assert!(kept.policy.is_some());
    let fresh = operator::from_snapshot(&keep, &Config::empty()).unwrap();
    assert!(
        fresh.policy.is_none(),
        "nothing to keep: every call is refused"
    );
}

mod approvals {
    use super::*;
    use aip_policy::Approval;
    use aip_proto::v1::approval_update::Decision;
    use aip_sidecar::approvals::{Ask, Remote};

    /// An fs_write ask through the harness's approvals, waiting.
    fn asking(h: &Harness) -> tokio::task::JoinHandle<aip_policy::Approval> {
        let approvals = h.approvals.clone();
        tokio::spawn(async move {
            approvals
                .ask(held("fs_write"), Duration::from_secs(60))
                .await
        })
    }

    fn held(tool: &str) -> Ask {
        Ask {
            tool: tool.to_owned(),
            connection: "fs".to_owned(),
            arguments: serde_json::json!({"path": "/tmp/x", "content": "[REDACTED:token]"}),
            arguments_hash: "sha256:ab".to_owned(),
        }
    }

    fn update(name: &str, decision: Decision) -> Result<ApprovalUpdate, Status> {
        Ok(ApprovalUpdate {
            name: name.to_owned(),
            decision: decision as i32,
            reason: String::new(),
            decided_by: String::new(),
        })
    }

    #[tokio::test]
    async fn an_ask_waits_for_the_operators_decision() {
        let mut h = harness(None).await;
        let waiting = asking(&h);
        let (ask, tx) = within(h.asks.recv()).await.unwrap();
        assert_eq!(
            (ask.tool.as_str(), ask.connection.as_str()),
            ("fs_write", "fs")
        );
        assert_eq!(ask.arguments_hash, "sha256:ab");
        assert!(ask.arguments_json.contains("[REDACTED:token]"));
        assert!(ask.resume_name.is_empty());
        tx.send(update("fs-write-1", Decision::Pending))
            .await
            .unwrap();
        tx.send(update("fs-write-1", Decision::Approved))
            .await
            .unwrap();
        assert_eq!(within(waiting).await.unwrap(), Approval::Approved);
    }

    #[tokio::test]
    async fn a_broken_stream_is_resumed_by_name() {
        let mut h = harness(None).await;
        let waiting = asking(&h);
        let (_, tx) = within(h.asks.recv()).await.unwrap();
        tx.send(update("fs-write-2", Decision::Pending))
            .await
            .unwrap();
        tx.send(Err(Status::unavailable("operator restarting")))
            .await
            .unwrap();
        drop(tx);
        let (resumed, tx) = within(h.asks.recv()).await.unwrap();
        assert_eq!(resumed.resume_name, "fs-write-2");
        tx.send(update("fs-write-2", Decision::Denied))
            .await
            .unwrap();
        assert_eq!(within(waiting).await.unwrap(), Approval::Denied);
    }

    #[tokio::test]
    async fn expiry_and_refusal_never_release_the_call() {
        let mut h = harness(None).await;
        let waiting = asking(&h);
        let (_, tx) = within(h.asks.recv()).await.unwrap();
        tx.send(update("fs-write-3", Decision::Expired))
            .await
            .unwrap();
        assert_eq!(within(waiting).await.unwrap(), Approval::TimedOut);
        let refused = h
            .approvals
            .ask(held("refused"), Duration::from_secs(60))
            .await;
        assert_eq!(refused, Approval::Denied);
    }
}

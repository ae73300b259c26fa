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
    ApprovalRequest, ApprovalUpdate, ApprovalWithdrawal, Policy, ReportRequest, ReportResponse,
    Snapshot, WatchRequest,
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
    withdrawals: mpsc::UnboundedSender<ApprovalWithdrawal>,
    tokens: Arc<Mutex<Vec<String>>>,
    /// While set, approval calls are refused as an operator that is away.
    away: Arc<std::sync::atomic::AtomicBool>,
    /// Watches to refuse as a replica serving its maximum would.
    full: Arc<std::sync::atomic::AtomicUsize>,
    /// Where each Watch came from.
    peers: Arc<Mutex<Vec<Option<std::net::SocketAddr>>>>,
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
        self.peers.lock().unwrap().push(r.remote_addr());
        let full = self.full.load(std::sync::atomic::Ordering::SeqCst);
        if full > 0 {
            self.full
                .store(full - 1, std::sync::atomic::Ordering::SeqCst);
            return Err(Status::resource_exhausted(
                "this operator replica serves its maximum of 1 sidecars (--max-sidecars)",
            ));
        }
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
        if self.away.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::unavailable("no operator"));
        }
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

    async fn withdraw_approval(
        &self,
        r: Request<ApprovalWithdrawal>,
    ) -> Result<Response<ApprovalUpdate>, Status> {
        self.token(&r);
        if self.away.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::unavailable("no operator"));
        }
        let w = r.into_inner();
        let _ = self.withdrawals.send(w.clone());
        Ok(Response::new(ApprovalUpdate {
            name: w.name,
            decision: aip_proto::v1::approval_update::Decision::Withdrawn as i32,
            reason: w.reason,
            ..ApprovalUpdate::default()
        }))
    }
}

struct Harness {
    config: watch::Receiver<Arc<Config>>,
    approvals: Arc<operator::OperatorApprovals>,
    asks: mpsc::UnboundedReceiver<Asked>,
    streams: mpsc::UnboundedReceiver<Feed>,
    reports: mpsc::UnboundedReceiver<ReportRequest>,
    withdrawals: mpsc::UnboundedReceiver<ApprovalWithdrawal>,
    away: Arc<std::sync::atomic::AtomicBool>,
    full: Arc<std::sync::atomic::AtomicUsize>,
    peers: Arc<Mutex<Vec<Option<std::net::SocketAddr>>>>,
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
    let (wtx, withdrawals) = mpsc::unbounded_channel();
    let away = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let full = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peers = Arc::new(Mutex::new(Vec::new()));
    let service = Operator {
        full: full.clone(),
        peers: peers.clone(),
        asks: atx,
        streams: stx,
        reports: rtx,
        withdrawals: wtx,
        tokens: tokens.clone(),
        away: away.clone(),
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
        withdrawals,
        away,
        full,
        peers,
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

/// A replica that serves its maximum refuses the Watch: the sidecar tries
/// again on a new connection (which a Service may send to another replica),
/// not on the one that was refused.
#[tokio::test]
async fn a_refusal_for_capacity_is_tried_again_on_a_new_connection() {
    let mut h = harness(None).await;
    // The harness's first Watch may already be under way: refuse the next
    // two from now on, whichever they are.
    h.full.store(2, std::sync::atomic::Ordering::SeqCst);
    let feed = within(async {
        loop {
            let feed = h.streams.recv().await.unwrap();
            if h.full.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return feed;
            }
            // Accepted before the refusals began: end it, as a restart would.
            let _ = feed.send(Err(Status::unavailable("again"))).await;
        }
    })
    .await;
    feed.send(Ok(snapshot(1, &["read_file"]))).await.unwrap();
    config_until(&mut h, |c| allows(c, "read_file")).await;
    let peers = h.peers.lock().unwrap().clone();
    let n = peers.len();
    assert!(n >= 3, "{peers:?}");
    let (refused, served) = (peers[n - 2], peers[n - 1]);
    assert!(refused.is_some() && served.is_some(), "{peers:?}");
    assert_ne!(
        refused, served,
        "a new connection after the refusal: {peers:?}"
    );
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
    use aip_policy::{Approval, Withdrawal};
    use aip_proto::v1::approval_update::Decision;
    use aip_sidecar::approvals::{Answer, Ask, Ended, Remote};

    /// An fs_write ask through the harness's approvals, waiting; and what
    /// says why its wait would be dropped.
    fn asking(h: &Harness) -> (tokio::task::JoinHandle<Answer>, Ended) {
        let approvals = h.approvals.clone();
        let ask = held("fs_write");
        let ended = ask.ended.clone();
        let waiting =
            tokio::spawn(async move { approvals.ask(ask, Duration::from_secs(60)).await });
        (waiting, ended)
    }

    fn held(tool: &str) -> Ask {
        Ask {
            tool: tool.to_owned(),
            connection: "fs".to_owned(),
            arguments: serde_json::json!({"path": "/tmp/x", "content": "[REDACTED:token]"}),
            arguments_hash: "sha256:ab".to_owned(),
            ended: Ended::default(),
        }
    }

    fn update(name: &str, decision: Decision) -> Result<ApprovalUpdate, Status> {
        Ok(ApprovalUpdate {
            name: name.to_owned(),
            decision: decision as i32,
            ..ApprovalUpdate::default()
        })
    }

    #[tokio::test]
    async fn an_ask_waits_for_the_operators_decision() {
        let mut h = harness(None).await;
        let (waiting, _) = asking(&h);
        let (ask, tx) = within(h.asks.recv()).await.unwrap();
        assert_eq!(
            (ask.tool.as_str(), ask.connection.as_str()),
            ("fs_write", "fs")
        );
        assert_eq!(ask.arguments_hash, "sha256:ab");
        assert!(ask.arguments_json.contains("[REDACTED:token]"));
        assert!(ask.resume_name.is_empty());
        assert_eq!(ask.ask_id.len(), 32, "{ask:?}");
        assert!(ask.withdraws_explicitly);
        tx.send(update("fs-write-1", Decision::Pending))
            .await
            .unwrap();
        tx.send(update("fs-write-1", Decision::Approved))
            .await
            .unwrap();
        let answer = within(waiting).await.unwrap();
        assert_eq!(answer.approval, Approval::Approved);
        assert_eq!(answer.request.as_deref(), Some("fs-write-1"));
        assert!(h.withdrawals.try_recv().is_err(), "nothing to withdraw");
    }

    /// A broken stream is resumed by the request's name and the same ask
    /// id; the decision made meanwhile arrives; nothing is withdrawn.
    #[tokio::test]
    async fn a_broken_stream_is_resumed_by_name() {
        let mut h = harness(None).await;
        let (waiting, _) = asking(&h);
        let (first, tx) = within(h.asks.recv()).await.unwrap();
        tx.send(update("fs-write-2", Decision::Pending))
            .await
            .unwrap();
        tx.send(Err(Status::unavailable("connection reset")))
            .await
            .unwrap();
        drop(tx);
        let (resumed, tx) = within(h.asks.recv()).await.unwrap();
        assert_eq!(resumed.resume_name, "fs-write-2");
        assert_eq!(resumed.ask_id, first.ask_id);
        tx.send(update("fs-write-2", Decision::Denied))
            .await
            .unwrap();
        assert_eq!(within(waiting).await.unwrap().approval, Approval::Denied);
        assert!(h.withdrawals.try_recv().is_err());
    }

    /// An expiry, a refusal and a withdrawal are each named for what they
    /// are; none is a person's denial.
    #[tokio::test]
    async fn expiry_refusal_and_withdrawal_are_named_for_what_happened() {
        let mut h = harness(None).await;
        let (waiting, _) = asking(&h);
        let (_, tx) = within(h.asks.recv()).await.unwrap();
        tx.send(update("fs-write-3", Decision::Expired))
            .await
            .unwrap();
        assert_eq!(within(waiting).await.unwrap().approval, Approval::TimedOut);
        let refused = h
            .approvals
            .ask(held("refused"), Duration::from_secs(60))
            .await;
        assert_eq!(
            refused.approval,
            Approval::Withdrawn(Withdrawal::OperatorRefused)
        );
        let (waiting, _) = asking(&h);
        let (_, tx) = within(h.asks.recv()).await.unwrap();
        let mut withdrawn = update("fs-write-4", Decision::Withdrawn).unwrap();
        withdrawn.reason = "SidecarAway".to_owned();
        tx.send(Ok(withdrawn)).await.unwrap();
        assert_eq!(
            within(waiting).await.unwrap().approval,
            Approval::Withdrawn(Withdrawal::SidecarAway)
        );
        assert!(h.withdrawals.try_recv().is_err());
    }

    /// The operator says when the request expires; with the operator gone
    /// the call is answered as expired at that moment, not later.
    #[tokio::test]
    async fn expiry_holds_without_the_operator() {
        let mut h = harness(None).await;
        let (waiting, _) = asking(&h);
        let (_, tx) = within(h.asks.recv()).await.unwrap();
        let expires = std::time::SystemTime::now() + Duration::from_millis(1500);
        let at_ms = expires
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let mut pending = update("fs-write-5", Decision::Pending).unwrap();
        pending.expires_at_unix_ms = i64::try_from(at_ms).unwrap();
        tx.send(Ok(pending)).await.unwrap();
        h.away.store(true, std::sync::atomic::Ordering::SeqCst);
        tx.send(Err(Status::unavailable("gone"))).await.unwrap();
        drop(tx);
        let answer = within(waiting).await.unwrap();
        let now = std::time::SystemTime::now();
        assert_eq!(answer.approval, Approval::TimedOut);
        let late = now.duration_since(expires).unwrap_or_default();
        let early = expires.duration_since(now).unwrap_or_default();
        assert!(
            late < Duration::from_millis(500) && early < Duration::from_millis(50),
            "answered {late:?} after, {early:?} before the expiry"
        );
    }

    /// Dropping a wait (the agent cancelled) tells the operator why, by
    /// the request's name and the ask's id; an operator away at that
    /// moment is told once it is back.
    #[tokio::test]
    async fn a_dropped_wait_is_withdrawn_with_its_reason_even_after_the_operator_was_away() {
        let mut h = harness(None).await;
        let (waiting, ended) = asking(&h);
        let (ask, tx) = within(h.asks.recv()).await.unwrap();
        tx.send(update("fs-write-6", Decision::Pending))
            .await
            .unwrap();
        // The sidecar resumes by that name: it knows it.
        tx.send(Err(Status::unavailable("reset"))).await.unwrap();
        drop(tx);
        let (resumed, _tx) = within(h.asks.recv()).await.unwrap();
        assert_eq!(resumed.resume_name, "fs-write-6");
        h.away.store(true, std::sync::atomic::Ordering::SeqCst);
        ended.set(Withdrawal::Cancelled).unwrap();
        waiting.abort();
        let _ = waiting.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(h.withdrawals.try_recv().is_err(), "the operator is away");
        h.away.store(false, std::sync::atomic::Ordering::SeqCst);
        let withdrawal = within(h.withdrawals.recv()).await.unwrap();
        assert_eq!(
            (
                withdrawal.name.as_str(),
                withdrawal.reason.as_str(),
                withdrawal.tool.as_str()
            ),
            ("fs-write-6", "Cancelled", "fs_write")
        );
        assert_eq!(withdrawal.ask_id, ask.ask_id);
        within(h.approvals.flush(Duration::from_secs(5))).await;
    }
}

//! The stdio agent transport in-process, between a pipe playing the agent
//! and the fault server run over stdio as the wrapped connection: lines
//! over the size limit are refused without being held, and the lines after
//! them are served; asks send progress and are withdrawn by a cancel.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aip_mcp::{Connection, Endpoint};
use aip_policy::CompileOptions;
use aip_sidecar::agent::stdio;
use aip_sidecar::approvals::LocalApprovals;
use aip_sidecar::audit::Audit;
use aip_sidecar::config::file;
use aip_sidecar::gate::{Gateway, GatewayOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const PATIENCE: Duration = Duration::from_secs(10);

/// A directory of its own under cargo's target/tmp (so that a run that is
/// killed leaves nothing outside target/), removed when the guard drops.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// The wrap in-process around the fault server (over stdio, with
/// `script`), between a duplex pipe playing the agent and the server.
struct Harness {
    /// None while a test writes on its own.
    to_wrap: Option<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    from_wrap: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    running: tokio::task::JoinHandle<()>,
    approvals: Arc<LocalApprovals>,
}

impl Harness {
    fn start(script: &Path, policy_spec: &str) -> Harness {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let fault_server = repo.join("target/debug/aip-fault-server");
        assert!(
            fault_server.exists(),
            "build the workspace first (make build)"
        );
        let command: Vec<String> = vec![
            fault_server.to_str().unwrap().into(),
            "--config".into(),
            script.to_str().unwrap().into(),
            "--stdio".into(),
            "--log".into(),
            "/dev/null".into(),
        ];
        let policy = format!(
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: agent}}\nspec:\n{policy_spec}"
        );
        let mut config = file::parse(&policy, &CompileOptions::default()).unwrap();
        config.connections.push(Arc::new(Connection::new(
            "stdio",
            Endpoint::Stdio { command },
        )));
        let (config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(config));
        let options = GatewayOptions {
            approval_timeout: Duration::from_secs(30),
            ask_progress_interval: Duration::from_millis(50),
            ..GatewayOptions::default()
        };
        let shutdown = tokio_util::sync::CancellationToken::new();
        let audit = Audit::new(Box::new(std::io::sink()));
        let gateway = Gateway::new(config_rx, audit, options, shutdown);
        let approvals = gateway.approvals.clone();
        let (agent, wrapped) = tokio::io::duplex(64 * 1024);
        let (wrap_in, wrap_out) = tokio::io::split(wrapped);
        let running = tokio::spawn(async move {
            stdio::serve(gateway.clone(), wrap_in, wrap_out).await;
            gateway.close_connections().await;
            drop(config_tx);
        });
        let (from_wrap, to_wrap) = tokio::io::split(agent);
        Harness {
            to_wrap: Some(to_wrap),
            from_wrap: BufReader::new(from_wrap).lines(),
            running,
            approvals,
        }
    }

    /// The next message the wrap writes to the agent.
    async fn read(&mut self) -> Value {
        let line = tokio::time::timeout(PATIENCE, self.from_wrap.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }

    async fn send(&mut self, message: &Value) {
        let line = format!("{message}\n");
        let to_wrap = self.to_wrap.as_mut().unwrap();
        to_wrap.write_all(line.as_bytes()).await.unwrap();
    }

    /// The agent hangs up (both halves of its pipe): the wrap ends.
    async fn hang_up(self) {
        drop(self.to_wrap);
        drop(self.from_wrap);
        tokio::time::timeout(PATIENCE, self.running)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_agent_line_is_refused_and_the_next_is_served() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = repo.join("examples/faults/transient-then-success.yaml");
    let mut h = Harness::start(&script, "  {}\n");
    // 5 MiB without a newline until the end: over the 4 MiB message limit.
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}\n",
        "a".repeat(5 * 1024 * 1024)
    );
    let mut to_wrap = h.to_wrap.take().unwrap();
    let writer = tokio::spawn(async move {
        to_wrap.write_all(huge.as_bytes()).await.unwrap();
        let next = json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
        to_wrap
            .write_all(format!("{next}\n").as_bytes())
            .await
            .unwrap();
        to_wrap
    });
    // Each line is handled in its own task: the answers may come in either
    // order.
    let (first, second) = (h.read().await, h.read().await);
    let (refused, pong) = if first["id"].is_null() {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(refused["id"], Value::Null, "{refused}");
    assert_eq!(refused["error"]["code"], -32700);
    let message = refused["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("5242"), "names the size: {message}");
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 8, "result": {}}));
    h.to_wrap = Some(writer.await.unwrap());
    h.hang_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_ask_sends_progress_and_a_cancel_withdraws_it() {
    let tmp = scratch("aip-wrap-ask-");
    let script = tmp.path().join("faults.yaml");
    std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: deploy\n      responses: [{sequence: [{return: first}, {return: second}]}]\n").unwrap();
    let mut h = Harness::start(&script, "  tool_rules: [{tool: deploy, action: ask}]\n");
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "deploy", "arguments": {}, "_meta": {"progressToken": format!("p{id}")}}})
    };
    h.send(&call(1)).await;
    for expected in [1, 2] {
        let note = h.read().await;
        assert_eq!(note["method"], "notifications/progress", "{note}");
        assert_eq!(note["params"]["progressToken"], "p1");
        assert_eq!(note["params"]["progress"], expected);
    }
    let approvals = h.approvals.clone();
    let mut changes = approvals.subscribe();
    h.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
    )
    .await;
    while !approvals.list().is_empty() {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    // A second ask, approved: the server answers it with its first
    // response, so the withdrawn call never reached it.
    h.send(&call(2)).await;
    let id = loop {
        if let Some(p) = approvals.list().first() {
            break p.id.clone();
        }
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    };
    approvals.decide(&id, true).unwrap();
    let response = loop {
        let message = h.read().await;
        assert_ne!(message["id"], 1, "a withdrawn call is never answered");
        if message.get("method").is_none() {
            break message;
        }
    };
    assert_eq!(response["id"], 2);
    assert_eq!(response["result"]["content"][0]["text"], "first");
    h.hang_up().await;
}

/// A client that pipelines faster than its calls end is slowed down, not
/// queued: with `MAX_IN_FLIGHT` asks waiting, the wrap reads no further
/// line, so the client's writes stall and no further ask is made, however
/// many lines it has left to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_client_is_held_back_at_the_in_flight_bound() {
    let tmp = scratch("aip-wrap-bound-");
    let script = tmp.path().join("faults.yaml");
    std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: deploy\n      responses: [{sequence: [{return: done}]}]\n").unwrap();
    let mut h = Harness::start(&script, "  tool_rules: [{tool: deploy, action: ask}]\n");
    let approvals = h.approvals.clone();
    let mut changes = approvals.subscribe();
    const SENT: usize = 20 * stdio::MAX_IN_FLIGHT;
    let mut to_wrap = h.to_wrap.take().unwrap();
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = written.clone();
    let writer = tokio::spawn(async move {
        for id in 0..SENT {
            let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "deploy", "arguments": {"n": id}}});
            to_wrap
                .write_all(format!("{call}\n").as_bytes())
                .await
                .unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    while approvals.list().len() < stdio::MAX_IN_FLIGHT {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    // The bound is reached; the client still has most of its lines to send
    // and cannot: nothing more is read, so nothing more is asked.
    // (The last ask's own change may still be unseen: every change is
    // checked, for half a second.)
    let quiet = async {
        loop {
            changes.changed().await.unwrap();
            assert_eq!(
                approvals.list().len(),
                stdio::MAX_IN_FLIGHT,
                "no ask past the bound"
            );
        }
    };
    let settled = tokio::time::timeout(Duration::from_millis(500), quiet).await;
    assert!(settled.is_err());
    assert_eq!(approvals.list().len(), stdio::MAX_IN_FLIGHT);
    assert!(!writer.is_finished());
    let sent = written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent < SENT / 4, "{sent} of {SENT} lines taken in");
    writer.abort();
    let _ = std::fs::remove_file(&script);
}

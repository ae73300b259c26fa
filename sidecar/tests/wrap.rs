//! The stdio wrap in-process, between a pipe playing the agent and the
//! fault server run over stdio: lines over the size limit are refused
//! without being held, and the lines after them are served.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aip_policy::CompileOptions;
use aip_sidecar::approvals::LocalApprovals;
use aip_sidecar::audit::Audit;
use aip_sidecar::config::file;
use aip_sidecar::wrap::Wrap;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const PATIENCE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_agent_line_is_refused_and_the_next_is_served() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fault_server = repo.join("target/debug/aip-fault-server");
    assert!(
        fault_server.exists(),
        "build the workspace first (make build)"
    );
    let script = repo.join("examples/faults/transient-then-success.yaml");
    let command: Vec<String> = vec![
        fault_server.to_str().unwrap().into(),
        "--config".into(),
        script.to_str().unwrap().into(),
        "--stdio".into(),
        "--log".into(),
        "/dev/null".into(),
    ];
    let policy =
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: agent}\nspec: {}\n";
    let config = file::parse(policy, &CompileOptions::default()).unwrap();
    let (_config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(config));
    let wrap = Wrap {
        config: config_rx,
        audit: Arc::new(Audit::new(Box::new(std::io::sink()))),
        approvals: LocalApprovals::new(),
        approval_timeout: Duration::from_secs(5),
        allow_capabilities: Vec::new(),
    };
    let (agent, wrapped) = tokio::io::duplex(64 * 1024);
    let (wrap_in, wrap_out) = tokio::io::split(wrapped);
    let running = tokio::spawn(async move { wrap.run(&command, wrap_in, wrap_out).await });
    let (from_wrap, mut to_wrap) = tokio::io::split(agent);
    let mut from_wrap = BufReader::new(from_wrap).lines();

    // 5 MiB without a newline until the end: over the 4 MiB message limit.
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}\n",
        "a".repeat(5 * 1024 * 1024)
    );
    let next = json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
    let writer = tokio::spawn(async move {
        to_wrap.write_all(huge.as_bytes()).await.unwrap();
        to_wrap
            .write_all(format!("{next}\n").as_bytes())
            .await
            .unwrap();
        to_wrap
    });
    let mut read = async || -> Value {
        let line = tokio::time::timeout(PATIENCE, from_wrap.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let refused = read().await;
    assert_eq!(refused["id"], Value::Null, "{refused}");
    assert_eq!(refused["error"]["code"], -32700);
    let message = refused["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("5242"), "names the size: {message}");
    let pong = read().await;
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 8, "result": {}}));
    // The agent hangs up (both halves of its pipe): the wrap ends.
    drop(writer.await.unwrap());
    drop(from_wrap);
    tokio::time::timeout(PATIENCE, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

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
        ask_progress_interval: Duration::from_millis(50),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_ask_sends_progress_and_a_cancel_withdraws_it() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fault_server = repo.join("target/debug/aip-fault-server");
    let script = std::env::temp_dir().join(format!("aip-wrap-ask-{}.yaml", std::process::id()));
    std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: deploy\n      responses: [{sequence: [{return: first}, {return: second}]}]\n").unwrap();
    let command: Vec<String> = vec![
        fault_server.to_str().unwrap().into(),
        "--config".into(),
        script.to_str().unwrap().into(),
        "--stdio".into(),
        "--log".into(),
        "/dev/null".into(),
    ];
    let policy = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: agent}\nspec:\n  tool_rules: [{tool: deploy, action: ask}]\n";
    let config = file::parse(policy, &CompileOptions::default()).unwrap();
    let (_config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(config));
    let approvals = LocalApprovals::new();
    let wrap = Wrap {
        config: config_rx,
        audit: Arc::new(Audit::new(Box::new(std::io::sink()))),
        approvals: approvals.clone(),
        approval_timeout: Duration::from_secs(30),
        ask_progress_interval: Duration::from_millis(50),
        allow_capabilities: Vec::new(),
    };
    let (agent, wrapped) = tokio::io::duplex(64 * 1024);
    let (wrap_in, wrap_out) = tokio::io::split(wrapped);
    let running = tokio::spawn(async move { wrap.run(&command, wrap_in, wrap_out).await });
    let (from_wrap, mut to_wrap) = tokio::io::split(agent);
    let mut from_wrap = BufReader::new(from_wrap).lines();
    let mut read = async || -> Value {
        let line = tokio::time::timeout(PATIENCE, from_wrap.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let call = |id: u64| {
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "deploy", "arguments": {}, "_meta": {"progressToken": format!("p{id}")}}})
        )
    };
    to_wrap.write_all(call(1).as_bytes()).await.unwrap();
    for expected in [1, 2] {
        let note = read().await;
        assert_eq!(note["method"], "notifications/progress", "{note}");
        assert_eq!(note["params"]["progressToken"], "p1");
        assert_eq!(note["params"]["progress"], expected);
    }
    let mut changes = approvals.subscribe();
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    to_wrap
        .write_all(format!("{cancel}\n").as_bytes())
        .await
        .unwrap();
    while !approvals.list().is_empty() {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    // A second ask, approved: the server answers it with its first
    // response, so the withdrawn call never reached it.
    to_wrap.write_all(call(2).as_bytes()).await.unwrap();
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
        let message = read().await;
        assert_ne!(message["id"], 1, "a withdrawn call is never answered");
        if message.get("method").is_none() {
            break message;
        }
    };
    assert_eq!(response["id"], 2);
    assert_eq!(response["result"]["content"][0]["text"], "first");
    drop(to_wrap);
    drop(from_wrap);
    tokio::time::timeout(PATIENCE, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

//! `aip-sidecar run` with a stdio server as the connection: the fault server
//! (`--stdio`) as a child process behind the whole gateway, and
//! server-everything from npm. One upstream attempt per agent call, a
//! timed-out call cancelled, a server that exits started afresh.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use aip_sidecar::upstream::health::HealthState;
use common::{Setup, Stack};
use serde_json::{Value, json};

const POLICY: &str = "  allowed_tools: [up_flaky, up_sibling]\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fault server run over stdio, and where it logs its attempts.
struct StdioFaults {
    command: Vec<String>,
    log: PathBuf,
    /// The script's and the log's directory, removed when this drops.
    _scratch: tempfile::TempDir,
}

impl StdioFaults {
    fn new(name: &str, flaky_step: &str) -> StdioFaults {
        let bin = repo().join("target/debug/aip-fault-server");
        assert!(bin.exists(), "build the workspace first (make build)");
        let tmp = common::scratch(&format!("aip-stdio-up-{name}-"));
        let script = tmp.path().join("faults.yaml");
        let log = tmp.path().join("attempts.jsonl");
        std::fs::write(
            &script,
            format!(
                "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: up}}\nspec:
  tools:
    - name: flaky
      responses: [{{sequence: [{flaky_step}, {{return: recovered}}]}}]
    - name: sibling
      responses: [{{sequence: [{{return: s1}}, {{return: s2}}, {{return: s3}}]}}]
"
            ),
        )
        .unwrap();
        let command = [
            bin.to_str().unwrap(),
            "--config",
            script.to_str().unwrap(),
            "--stdio",
            "--log",
            log.to_str().unwrap(),
        ];
        StdioFaults {
            command: command.map(str::to_owned).to_vec(),
            log,
            _scratch: tmp,
        }
    }

    /// How many of this script's server processes are running.
    fn running(&self) -> usize {
        let marker = self.log.to_str().unwrap().as_bytes();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .filter(|cmdline| cmdline.windows(marker.len()).any(|w| w == marker))
            .count()
    }

    fn attempts(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn stack(&self) -> Stack {
        Stack::start(Setup {
            policy: POLICY,
            command: Some(self.command.clone()),
            ..Setup::default()
        })
        .await
    }
}

fn text(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {response}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_a_stdio_server_once_each() {
    let faults = StdioFaults::new("calls", "{return: first}");
    let s = faults.stack().await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["up_flaky", "up_sibling"]);
    let calls = [
        ("up_flaky", "first"),
        ("up_sibling", "s1"),
        ("up_flaky", "recovered"),
    ];
    for (i, (tool, expected)) in calls.into_iter().enumerate() {
        let r = s.call(&session, json!(i + 2), tool, json!({})).await;
        assert_eq!(text(&r), expected, "{tool}");
    }
    let outcomes: Vec<(Value, Value)> = faults
        .attempts()
        .iter()
        .map(|a| (a["tool"].clone(), a["outcome"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (json!("flaky"), json!("delivered")),
            (json!("sibling"), json!("delivered")),
            (json!("flaky"), json!("delivered")),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_is_cancelled_and_the_server_keeps_serving() {
    let faults = StdioFaults::new("timeout", "{return: late, delay_ms: 300000}");
    let s = faults.stack().await;
    let session = s.session().await;
    let failed = s.call(&session, json!(1), "up_flaky", json!({})).await;
    assert_eq!(
        failed["error"]["data"]["reason"], "upstream_timeout",
        "{failed}"
    );
    // Same process: the sequences continue where they were.
    let sibling = s.call(&session, json!(2), "up_sibling", json!({})).await;
    assert_eq!(text(&sibling), "s1");
    let again = s.call(&session, json!(3), "up_flaky", json!({})).await;
    assert_eq!(text(&again), "recovered");
    let first = &faults.attempts()[0];
    assert_eq!(first["outcome"], "canceled_running", "{first}");
    assert_eq!(faults.attempts().len(), 3, "never a replay");
}

/// The flaky tool's first step ends the process: its call fails as
/// unreachable, is not re-sent, and a fresh process serves the next call.
async fn ends_the_process_then_restarts(name: &str, flaky_step: &str) {
    let faults = StdioFaults::new(name, flaky_step);
    let s = faults.stack().await;
    let session = s.session().await;
    let failed = s.call(&session, json!(1), "up_flaky", json!({})).await;
    assert_eq!(
        failed["error"]["data"]["reason"], "upstream_unreachable",
        "{failed}"
    );
    // A new process: its sequences start over.
    let sibling = s.call(&session, json!(2), "up_sibling", json!({})).await;
    assert_eq!(text(&sibling), "s1");
    let flaky: Vec<Value> = faults
        .attempts()
        .into_iter()
        .filter(|a| a["tool"] == "flaky")
        .collect();
    assert_eq!(flaky.len(), 1, "the failed call is not re-sent: {flaky:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_fails_its_call_and_is_started_again() {
    ends_the_process_then_restarts("exit", "{drop: true}").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_too_long_to_hold_stops_the_server_which_starts_again() {
    // 4096-byte responses allowed; past 4x that the line is not held.
    ends_the_process_then_restarts("toolong", "{oversize: {bytes: 20000}}").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_is_refused_and_the_next_call_works() {
    let faults = StdioFaults::new("oversize", "{oversize: {bytes: 10000}}");
    let s = faults.stack().await;
    let session = s.session().await;
    let failed = s.call(&session, json!(1), "up_flaky", json!({})).await;
    assert_eq!(
        failed["error"]["data"]["reason"], "upstream_too_large",
        "{failed}"
    );
    assert!(
        !failed.to_string().contains("xxxxxxxx"),
        "nothing of the body relayed"
    );
    let again = s.call(&session, json!(2), "up_flaky", json!({})).await;
    assert_eq!(text(&again), "recovered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_behind_the_gateway() {
    let everything = repo()
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(everything.exists(), "run `make interop-deps`");
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [ev_echo, ev_get-sum]\n",
        command: Some(vec![
            "node".into(),
            everything.to_str().unwrap().into(),
            "stdio".into(),
        ]),
        prefix: "ev_",
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let mut names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, vec!["ev_echo", "ev_get-sum"]);
    let echo = s
        .call(&session, json!(2), "ev_echo", json!({"message": "hello"}))
        .await;
    assert!(text(&echo).contains("hello"), "{echo}");
    let sum = s
        .call(&session, json!(3), "ev_get-sum", json!({"a": 2, "b": 3}))
        .await;
    assert!(text(&sum).contains('5'), "{sum}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_connection_and_restarts_a_changed_one() {
    let faults = StdioFaults::new("reload", "{return: first}");
    let s = faults.stack().await;
    let session = s.session().await;
    let before = s.gateway.connections()[0].clone();
    assert_eq!(
        text(&s.call(&session, json!(1), "up_sibling", json!({})).await),
        "s1"
    );

    // Only the policy changes: the same process keeps serving (s2, not s1).
    s.reload(&s.config_text.replace("up_flaky, up_sibling", "up_sibling"))
        .await;
    let kept = s.gateway.connections()[0].clone();
    assert!(
        std::sync::Arc::ptr_eq(&before, &kept),
        "the connection is kept"
    );
    assert_eq!(
        text(&s.call(&session, json!(2), "up_sibling", json!({})).await),
        "s2"
    );

    // The connection changes: a fresh process, whose sequences start over;
    // the old one is stopped and waited for.
    let mut retired = s.gateway.retired();
    s.reload(
        &s.config_text
            .replace("timeoutSeconds: 1", "timeoutSeconds: 2"),
    )
    .await;
    let fresh = s.gateway.connections()[0].clone();
    assert!(
        !std::sync::Arc::ptr_eq(&before, &fresh),
        "a changed connection starts afresh"
    );
    let mut health = fresh.subscribe();
    tokio::time::timeout(
        common::PATIENCE,
        health.wait_for(|h| *h == HealthState::Healthy),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        text(&s.call(&session, json!(3), "up_sibling", json!({})).await),
        "s1"
    );
    tokio::time::timeout(common::PATIENCE, retired.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(faults.running(), 1, "only the fresh server runs");
    drop((before, kept));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_connections_stops_the_server_and_waits_for_it() {
    let faults = StdioFaults::new("close", "{return: first}");
    let s = faults.stack().await;
    let session = s.session().await;
    assert_eq!(
        text(&s.call(&session, json!(1), "up_flaky", json!({})).await),
        "first"
    );
    assert_eq!(faults.running(), 1);
    s.gateway.close_connections().await;
    assert_eq!(
        faults.running(),
        0,
        "exited and reaped before close returns"
    );
    assert!(s.gateway.connections().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_the_end_of_its_input_gets_sigterm() {
    let tmp = common::scratch("aip-stubborn-");
    let marker = tmp.path().join("signal");
    let server = repo().join("sidecar/tests/servers/stubborn.py");
    let command = [
        "python3",
        server.to_str().unwrap(),
        marker.to_str().unwrap(),
    ];
    let s = Stack::start(Setup {
        command: Some(command.map(str::to_owned).to_vec()),
        ..Setup::default()
    })
    .await;
    s.gateway.close_connections().await;
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "TERM",
        "stdin closed, then SIGTERM before any kill"
    );
}

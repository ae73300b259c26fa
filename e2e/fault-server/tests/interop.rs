//! An unmodified third-party MCP client — the Python `mcp` SDK from PyPI —
//! lists and calls the fault server's tools over stdio and Streamable HTTP.
//!
//! The SDK lives in a virtualenv that `make pyenv` creates (pinned in
//! e2e/fault-server/tests/requirements.txt); set AIP_PYTHON to use another.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn python() -> PathBuf {
    let path = std::env::var_os("AIP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python")
        });
    assert!(
        path.exists(),
        "no Python with the mcp SDK at {}; run `make pyenv` (or set AIP_PYTHON)",
        path.display()
    );
    path
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults/transient-then-success.yaml")
}

fn run_client(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop_client.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the transient-then-success script must look like to any client.
fn check(report: &Value) {
    assert_eq!(report["server"], "inventory");
    assert_eq!(report["tools"], json!(["get_item"]));
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], true);
    assert_eq!(calls[0]["content"][0]["text"], "upstream busy, try again");
    assert!(
        calls[1]["exception"]
            .as_str()
            .unwrap()
            .contains("temporarily unavailable"),
        "{}",
        calls[1]
    );
    assert_eq!(
        calls[2]["structuredContent"],
        json!({"id": 1, "name": "widget", "qty": 3})
    );
    assert_eq!(
        calls[3]["isError"], true,
        "exhausted fails closed: {}",
        calls[3]
    );
    assert_eq!(report["unknown"]["isError"], true);
}

#[test]
fn python_sdk_over_stdio() {
    let binary = env!("CARGO_BIN_EXE_aip-fault-server");
    let report = run_client(&["stdio", binary, example().to_str().unwrap()]);
    check(&report);
}

#[test]
fn python_sdk_over_streamable_http() {
    let (mut server, addr) = common::spawn_http_binary(&example(), Path::new("/dev/null"));
    let report = run_client(&["http", &format!("http://{addr}/mcp")]);
    let _ = server.kill();
    let _ = server.wait();
    check(&report);
}

// ------------------------------------------------------------------ eras --
//
// The SDK's `Client` negotiates the era itself (tests/interop_eras.py): by
// default it probes server/discover and falls back to initialize only when
// the answer is no evidence of a modern server.

fn run_client_eras(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop_eras.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The transient-then-success script as `Client` sees it, in either era.
fn check_negotiated(report: &Value, version: &str) {
    assert_eq!(report["protocol_version"], version, "{report}");
    assert_eq!(report["tools"], json!(["get_item"]));
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], true, "{}", calls[0]);
    assert_eq!(calls[0]["content"][0]["text"], "upstream busy, try again");
    assert_eq!(
        calls[1]["exception"],
        json!({"code": -32000, "message": "temporarily unavailable"})
    );
    assert_eq!(
        calls[2]["structuredContent"],
        json!({"id": 1, "name": "widget", "qty": 3})
    );
    assert_eq!(calls[3]["isError"], true, "exhausted: {}", calls[3]);
}

/// Runs the client in `mode` against the binary serving the example over
/// HTTP with `extra` flags; the report and the attempt log.
fn over_http(name: &str, mode: &str, extra: &[&str]) -> (Value, Vec<Value>) {
    let tmp = common::scratch(name);
    let log = tmp.path().join("attempts.jsonl");
    let (mut server, addr) = common::spawn_http_binary_with(&example(), &log, extra);
    let report = run_client_eras(&[mode, "http", &format!("http://{addr}/mcp")]);
    let _ = server.kill();
    let _ = server.wait();
    (report, common::read_attempts(&log))
}

fn over_stdio(mode: &str, era: &str) -> Value {
    let binary = env!("CARGO_BIN_EXE_aip-fault-server");
    run_client_eras(&[mode, "stdio", binary, example().to_str().unwrap(), era])
}

fn sessions(attempts: &[Value]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| a["session"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn python_client_auto_mode_ends_up_modern_and_legacy_mode_initializes() {
    let (report, attempts) = over_http("py-auto", "auto", &[]);
    check_negotiated(&report, "2026-07-28");
    assert_eq!(report["server"], "inventory", "serverInfo from _meta");
    assert_eq!(attempts.len(), 4);
    assert!(
        attempts
            .iter()
            .all(|a| a["protocol_version"] == "2026-07-28"),
        "{attempts:?}"
    );
    assert!(
        sessions(&attempts).iter().all(|s| s.starts_with("modern-")),
        "every call its own exchange, no session: {:?}",
        sessions(&attempts)
    );

    let (report, attempts) = over_http("py-legacy", "legacy", &[]);
    check_negotiated(&report, "2025-11-25");
    let sessions = sessions(&attempts);
    assert!(
        sessions
            .iter()
            .all(|s| *s == sessions[0] && !s.starts_with("modern-")),
        "one initialize session: {sessions:?}"
    );
    assert!(
        attempts
            .iter()
            .all(|a| a["protocol_version"] == "2025-11-25")
    );

    check_negotiated(&over_stdio("auto", "both"), "2026-07-28");
    check_negotiated(&over_stdio("legacy", "both"), "2025-11-25");
}

#[test]
fn python_client_against_single_era_servers() {
    // A legacy-only server: the probe's 400 is no modern evidence, so the
    // client falls back to initialize.
    let (report, attempts) = over_http("py-legacy-only", "auto", &["--era", "legacy"]);
    check_negotiated(&report, "2025-11-25");
    assert!(
        attempts
            .iter()
            .all(|a| a["protocol_version"] == "2025-11-25")
    );
    check_negotiated(&over_stdio("auto", "legacy"), "2025-11-25");

    // A modern-only server: auto stays modern; a legacy-only client is
    // told which versions the server speaks.
    let (report, _) = over_http("py-modern-only", "auto", &["--era", "modern"]);
    check_negotiated(&report, "2026-07-28");
    let refused = json!({"code": -32022, "message": "Unsupported protocol version",
        "data": {"supported": ["2026-07-28"], "requested": "2025-11-25"}});
    let (report, attempts) = over_http("py-modern-only-legacy", "legacy", &["--era", "modern"]);
    assert_eq!(report["connect_error"], refused, "{report}");
    assert!(attempts.is_empty());
    assert_eq!(over_stdio("legacy", "modern")["connect_error"], refused);
}

fn run_client_mrtr(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop_mrtr.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn python_client_answers_input_required_and_its_retry_is_checked() {
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults/input-required.yaml");
    let tmp = common::scratch("py-mrtr");
    let log = tmp.path().join("attempts.jsonl");
    let (mut server, addr) = common::spawn_http_binary(&example, &log);
    let url = format!("http://{addr}/mcp");
    let refused = run_client_mrtr(&["http", &url, "--no-elicitation"]);
    let answered = run_client_mrtr(&["http", &url]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(
        refused["error"],
        json!({"code": -32021,
               "message": "Missing required client capability: this call asks for input that needs elicitation",
               "data": {"requiredCapabilities": {"elicitation": {"form": {}}}}})
    );
    assert_eq!(answered["protocol_version"], "2026-07-28");
    assert_eq!(
        answered["asked"][0]["message"], "Your GitHub username?",
        "the SDK's callback was asked: {answered}"
    );
    assert_eq!(
        answered["result"]["structuredContent"],
        json!({"user": "octocat"})
    );
    let outcomes: Vec<Value> = common::read_attempts(&log)
        .iter()
        .map(|a| json!([a["step_index"], a["outcome"]]))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            json!([0, "missing_capability"]),
            json!([0, "delivered"]),
            json!([1, "delivered"])
        ]
    );

    let binary = env!("CARGO_BIN_EXE_aip-fault-server");
    let over_stdio = run_client_mrtr(&["stdio", binary, example.to_str().unwrap()]);
    assert_eq!(
        over_stdio["result"]["structuredContent"],
        json!({"user": "octocat"})
    );
}

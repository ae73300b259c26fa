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

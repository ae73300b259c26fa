//! The binary as an operator runs it: SIGTERM while a call is in flight ends
//! the process promptly with the attempt log on disk.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::sync::mpsc::channel;

use common::{PATIENCE, post, read_attempts, scratch, script, spawn_http_binary};
use serde_json::json;

#[test]
fn sigterm_ends_the_server_promptly_with_the_log_flushed() {
    let tmp = scratch("sigterm");
    let config = tmp.path().join("s.yaml");
    let log = tmp.path().join("attempts.jsonl");
    std::fs::write(&config, script("  tools:\n    - name: t\n      responses: [{sequence: [{return: done}, {return: late, delay_ms: 300000}]}]\n")).unwrap();
    let (mut server, addr) = spawn_http_binary(&config, &log);

    let init = post(
        addr,
        &[],
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
    );
    let session = init.header("mcp-session-id").unwrap().to_owned();
    let call = |id| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "t", "arguments": {}}});
    assert_eq!(
        post(addr, &[("mcp-session-id", &session)], &call(1)).json()["result"]["content"][0]["text"],
        "done"
    );
    // A second call is in flight (300 s delay) when the signal arrives.
    let s = session.clone();
    let in_flight = std::thread::spawn(move || post(addr, &[("mcp-session-id", &s)], &call(2)));

    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (tx, rx) = channel();
    std::thread::spawn(move || tx.send(server.wait().unwrap()).unwrap());
    let exit = rx
        .recv_timeout(PATIENCE)
        .expect("the server exits promptly after SIGTERM");
    assert!(exit.success(), "{exit:?}");
    let _ = in_flight.join();
    let attempts = read_attempts(&log);
    assert_eq!(attempts[0]["outcome"], "delivered");
}

//! The fault server over real loopback HTTP, observed with a raw HTTP/1.1
//! client so that dropped sockets, stalled bodies and SSE framing are seen
//! exactly as a gateway would see them.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aip_fault_server::http::HttpOptions;
use common::{HttpServer, post, request, script};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn call(id: Value, tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
}

const STEPS: &str = "  tools:
    - name: t
      responses:
        - sequence:
            - return: {ok: true}
            - error: tool failed
            - jsonrpc_error: {code: -32042, message: scripted}
            - http: {status: 503}
            - http: {status: 403, headers: {WWW-Authenticate: 'Bearer error=\"insufficient_scope\", scope=\"items:read\"'}, body: denied}
            - drop: true
            - stall_body: {after_bytes: 15}
            - raw_body: not json
            - oversize: {bytes: 5000}
            - sse_close_after_event: {retry_ms: 250}
";

#[test]
fn every_step_kind_on_the_wire() {
    let server = HttpServer::start(&script(STEPS), HttpOptions::default());
    let session = server.session();
    let h = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let next = |id: i64| post(server.addr, &h, &call(json!(id), "t", json!({})));

    let r = next(1);
    assert_eq!(
        (r.status, r.header("content-type")),
        (200, Some("application/json"))
    );
    assert_eq!(r.json()["result"]["structuredContent"], json!({"ok": true}));
    let r = next(2);
    assert_eq!(r.json()["result"]["isError"], true);
    assert_eq!(
        next(3).json()["error"],
        json!({"code": -32042, "message": "scripted"})
    );
    let r = next(4);
    assert_eq!((r.status, r.body.as_str()), (503, ""));
    let r = next(5);
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer error="insufficient_scope", scope="items:read""#)
    );
    assert_eq!(r.body, "denied");
    assert!(next(6).dropped, "drop closes the socket with no response");
    let r = request(
        server.addr,
        "POST",
        &h,
        Some(&call(json!(7), "t", json!({})).to_string()),
        Duration::from_millis(300),
    );
    assert!(r.stalled, "{r:?}");
    assert_eq!(r.body, r#"{"id":7,"jsonrp"#);
    let full_len: usize = r.header("content-length").unwrap().parse().unwrap();
    assert!(full_len > 15);
    let r = next(8);
    assert_eq!((r.status, r.body.as_str()), (200, "not json"));
    assert_eq!(
        next(9).json()["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .len(),
        5000
    );

    // SSE priming event with an id and retry, then the stream closes; the
    // result is delivered on the GET resume with Last-Event-ID.
    let r = next(10);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let event_id = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .unwrap()
        .to_owned();
    assert!(r.body.contains("retry: 250\n"), "{}", r.body);
    assert_eq!(r.sse_data(), vec![String::new()]);
    let resumed = request(
        server.addr,
        "GET",
        &[
            h[0],
            ("last-event-id", &event_id),
            ("accept", "text/event-stream"),
        ],
        None,
        Duration::from_secs(5),
    );
    assert_eq!(resumed.status, 200);
    let data: Value = serde_json::from_str(&resumed.sse_data()[0]).unwrap();
    assert_eq!(
        (
            data["id"].clone(),
            data["result"]["structuredContent"].clone()
        ),
        (json!(10), json!({"resumed": true}))
    );
    // A stream resumes once.
    let again = request(
        server.addr,
        "GET",
        &[h[0], ("last-event-id", &event_id)],
        None,
        Duration::from_secs(5),
    );
    assert_eq!(again.status, 404);

    let steps: Vec<Value> = server
        .attempts()
        .iter()
        .map(|a| a["step"].clone())
        .collect();
    assert_eq!(
        steps,
        [
            "return",
            "error",
            "jsonrpc_error",
            "http",
            "http",
            "drop",
            "stall_body",
            "raw_body",
            "oversize",
            "sse_close_after_event"
        ]
        .map(Value::from)
        .to_vec()
    );
    assert!(
        server
            .attempts()
            .iter()
            .all(|a| a["protocol_version"] == "2025-11-25")
    );
}

#[test]
fn accept_header_chooses_json_or_sse() {
    let yaml = script(
        "  tools:\n    - name: t\n      responses: [{sequence: [{return: 1}, {return: 2}, {return: 3}]}]\n",
    );
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let s = server.session();
    let sse_only = post(
        server.addr,
        &[("mcp-session-id", &s), ("accept", "text/event-stream")],
        &call(json!(1), "t", json!({})),
    );
    assert_eq!(sse_only.header("content-type"), Some("text/event-stream"));
    let data: Value = serde_json::from_str(&sse_only.sse_data()[0]).unwrap();
    assert_eq!(data["id"], 1);
    let both = post(
        server.addr,
        &[("mcp-session-id", &s)],
        &call(json!(2), "t", json!({})),
    );
    assert_eq!(both.header("content-type"), Some("application/json"));

    let preferring = HttpServer::start(&yaml, HttpOptions { prefer_sse: true });
    let s = preferring.session();
    let r = post(
        preferring.addr,
        &[("mcp-session-id", &s)],
        &call(json!(3), "t", json!({})),
    );
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
}

#[test]
fn sessions_and_sequence_state_across_them() {
    let yaml = script(
        "  tools:\n    - name: t\n      responses: [{sequence: [{return: first}, {return: second}]}]\n",
    );
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let a = server.session();
    let text = |r: &common::RawResponse| r.json()["result"]["content"][0]["text"].clone();
    assert_eq!(
        text(&post(
            server.addr,
            &[("mcp-session-id", &a)],
            &call(json!(1), "t", json!({}))
        )),
        "first"
    );
    // A new session continues the same sequence.
    let b = server.session();
    assert_ne!(a, b);
    assert_eq!(
        text(&post(
            server.addr,
            &[("mcp-session-id", &b)],
            &call(json!(1), "t", json!({}))
        )),
        "second"
    );
    // Notifications are accepted with 202 and no body.
    let n = post(
        server.addr,
        &[("mcp-session-id", &b)],
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!((n.status, n.body.as_str()), (202, ""));
    // Missing and unknown sessions.
    assert_eq!(
        post(
            server.addr,
            &[],
            &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        )
        .status,
        400
    );
    assert_eq!(
        post(
            server.addr,
            &[("mcp-session-id", "nope")],
            &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        )
        .status,
        404
    );
    // DELETE ends a session.
    assert_eq!(
        request(
            server.addr,
            "DELETE",
            &[("mcp-session-id", &a)],
            None,
            Duration::from_secs(5)
        )
        .status,
        204
    );
    assert_eq!(
        post(
            server.addr,
            &[("mcp-session-id", &a)],
            &json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})
        )
        .status,
        404
    );
    // Malformed JSON: -32700, and the server keeps serving.
    let bad = request(
        server.addr,
        "POST",
        &[("mcp-session-id", &b)],
        Some("{oops"),
        Duration::from_secs(5),
    );
    assert_eq!(
        (bad.status, bad.json()["error"]["code"].clone()),
        (400, json!(-32700))
    );
    assert_eq!(
        post(
            server.addr,
            &[("mcp-session-id", &b)],
            &json!({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        )
        .json()["result"],
        json!({})
    );
    // GET without Last-Event-ID: no standalone stream here.
    assert_eq!(
        request(
            server.addr,
            "GET",
            &[("mcp-session-id", &b)],
            None,
            Duration::from_secs(5)
        )
        .status,
        405
    );
}

#[test]
fn ping_answers_while_a_delayed_call_runs_and_cancel_ends_it_silently() {
    let yaml = script(
        "  tools:\n    - name: slow\n      responses: [{sequence: [{return: late, delay_ms: 300000}, {return: next}]}]\n",
    );
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let s = server.session();
    let addr = server.addr;
    let session = s.clone();
    let slow = std::thread::spawn(move || {
        post(
            addr,
            &[("mcp-session-id", &session)],
            &call(json!(1), "slow", json!({})),
        )
    });
    server.wait_running(&s, &json!(1));
    let ping = post(
        server.addr,
        &[("mcp-session-id", &s)],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
    );
    assert_eq!(ping.json()["result"], json!({}));
    let list = post(
        server.addr,
        &[("mcp-session-id", &s)],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    );
    assert_eq!(list.json()["result"]["tools"][0]["name"], "slow");
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    assert_eq!(
        post(server.addr, &[("mcp-session-id", &s)], &cancel).status,
        202
    );
    let canceled = slow.join().unwrap();
    assert_eq!(
        (canceled.status, canceled.body.as_str()),
        (202, ""),
        "no JSON-RPC response for a canceled call"
    );
    let next = post(
        server.addr,
        &[("mcp-session-id", &s)],
        &call(json!(4), "slow", json!({})),
    );
    assert_eq!(
        next.json()["result"]["content"][0]["text"],
        "next",
        "the canceled call kept its step"
    );
    assert_eq!(server.attempts()[0]["outcome"], "canceled_running");
}

#[test]
fn bearer_is_required_and_only_its_hash_is_logged() {
    let token = "s3cr3t-token-value";
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    let yaml = script(&format!(
        "  requireBearer: {{sha256: \"{digest}\"}}\n  tools:\n    - name: t\n      responses: [{{sequence: [{{return: ok}}]}}]\n"
    ));
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}});
    let none = post(server.addr, &[], &init);
    assert_eq!(
        (none.status, none.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    let wrong = post(server.addr, &[("authorization", "Bearer nope")], &init);
    assert_eq!(
        (wrong.status, wrong.header("www-authenticate")),
        (401, Some("Bearer error=\"invalid_token\""))
    );
    let auth = format!("Bearer {token}");
    let ok = post(server.addr, &[("authorization", &auth)], &init);
    assert_eq!(ok.status, 200);
    let s = ok.header("mcp-session-id").unwrap().to_owned();
    let r = post(
        server.addr,
        &[("authorization", &auth), ("mcp-session-id", &s)],
        &call(json!(1), "t", json!({})),
    );
    assert_eq!(r.status, 200);
    let lines = server.core.log.lines().join("\n");
    assert!(!lines.contains(token), "the token never reaches the log");
    assert_eq!(
        server.attempts()[0]["auth_sha256"],
        hex::encode(Sha256::digest(auth.as_bytes()))
    );
}

#[test]
fn admin_endpoints() {
    let yaml = script("  tools:\n    - name: t\n      responses: [{sequence: [{return: ok}]}]\n");
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let s = server.session();
    post(
        server.addr,
        &[("mcp-session-id", &s)],
        &call(json!(1), "t", json!({})),
    );
    post(
        server.addr,
        &[("mcp-session-id", &s)],
        &call(json!(2), "missing", json!({})),
    );
    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        use std::io::{Read, Write};
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).unwrap();
        out
    };
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").starts_with("HTTP/1.1 200"));
    let attempts = get("/_fault/attempts");
    let body = attempts.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(body.lines().count(), 2);
    let metrics = get("/metrics");
    assert!(
        metrics.contains("aip_fault_attempts_total{outcome=\"delivered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("aip_fault_attempts_total{outcome=\"unknown_tool\"} 1"),
        "{metrics}"
    );
}

#[test]
fn lists_are_paged_and_resources_and_prompts_served() {
    let spec = "  pageSize: 2
  tools:
    - {name: a, responses: [{sequence: [{return: 1}]}]}
    - {name: b, responses: [{sequence: [{return: 1}]}]}
    - {name: c, responses: [{sequence: [{return: 1}]}]}
  resources:
    - {uri: 'file:///r1', name: r1, text: one}
  prompts:
    - {name: greet, description: Say hello., text: hello}
";
    let server = HttpServer::start(&script(spec), HttpOptions::default());
    let session = server.session();
    let h = [("mcp-session-id", session.as_str())];
    let ask = |id: i64, method: &str, params: Value| {
        post(
            server.addr,
            &h,
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .json()
    };
    let first = ask(1, "tools/list", json!({}));
    let names = |page: &Value| -> Vec<String> {
        page["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&first), ["a", "b"]);
    let cursor = first["result"]["nextCursor"].clone();
    assert_eq!(cursor, "page-2");
    let second = ask(2, "tools/list", json!({"cursor": cursor}));
    assert_eq!(names(&second), ["c"]);
    assert!(second["result"].get("nextCursor").is_none());
    assert_eq!(
        ask(3, "tools/list", json!({"cursor": "page-9"}))["error"]["code"],
        -32602
    );
    assert_eq!(
        ask(4, "resources/read", json!({"uri": "file:///r1"}))["result"]["contents"][0]["text"],
        "one"
    );
    assert_eq!(
        ask(5, "resources/read", json!({"uri": "file:///nope"}))["error"]["code"],
        -32002
    );
    assert_eq!(
        ask(6, "prompts/list", json!({}))["result"]["prompts"],
        json!([{"name": "greet", "description": "Say hello."}])
    );
    assert_eq!(
        ask(7, "prompts/get", json!({"name": "greet"}))["result"]["messages"][0]["content"]["text"],
        "hello"
    );
}

//! Both eras on one endpoint, observed byte for byte over loopback HTTP: a
//! 2026-07-28 request is checked in the order the spec's dual-era servers
//! use (envelope, routing headers, version, method, `Mcp-Param-*`), each
//! refusal with its status, code and the request's id; scripted faults and
//! the bearer check meet modern requests as they meet legacy ones; and the
//! `legacy` and `modern` eras answer the other era's traffic as a
//! single-era server would.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::time::Duration;

use aip_fault_server::http::HttpOptions;
use common::{
    HttpServer, MODERN, RawResponse, meta, modern, post, post_modern, request, routing_headers,
    script,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const TOOLS: &str = "  tools:
    - name: t
      responses: [{sequence: [{return: 1}, {return: 2}, {return: 3}, {return: 4}, {return: 5}, {return: 6}]}]
    - name: grüße
      responses: [{sequence: [{return: hallo}, {return: again}]}]
    - name: regional
      inputSchema:
        type: object
        properties:
          region: {type: string, x-mcp-header: Region}
          count: {type: integer, x-mcp-header: Count}
      responses: [{sequence: [{return: a}, {return: b}, {return: c}]}]
  resources:
    - {uri: 'file:///r1', name: r1, text: one}
";

fn error_of(r: &RawResponse) -> (u16, Value, Value) {
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "an error is JSON: {r:?}"
    );
    let body = r.json();
    (r.status, body["error"]["code"].clone(), body["id"].clone())
}

/// Posts `body` with exactly `headers` (no routing headers added).
fn post_with(server: &HttpServer, headers: &[(&str, &str)], body: &Value) -> RawResponse {
    post(server.addr, headers, body)
}

fn headers_of(body: &Value) -> Vec<(String, String)> {
    routing_headers(body)
}

fn as_refs(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// `headers_of(body)` with `name` replaced by `value` (None: removed).
fn with_header(body: &Value, name: &str, value: Option<&str>) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = headers_of(body)
        .into_iter()
        .filter(|(k, _)| k != name)
        .collect();
    if let Some(v) = value {
        headers.push((name.to_owned(), v.to_owned()));
    }
    headers
}

/// (what, headers, body, expected (status, code))
type Case = (&'static str, Vec<(String, String)>, Value, (u16, i64));

#[test]
fn modern_requests_are_refused_in_the_spec_order_with_status_code_and_id() {
    let server = HttpServer::start(&script(TOOLS), HttpOptions::default());
    let call = modern(
        json!("c-1"),
        "tools/call",
        json!({"name": "t", "arguments": {}}),
    );
    let discover = modern(json!(7), "server/discover", json!({}));
    let v999 = {
        let mut d = discover.clone();
        d["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
        d
    };
    let no_caps = {
        let mut d = discover.clone();
        d["params"]["_meta"]
            .as_object_mut()
            .unwrap()
            .remove("io.modelcontextprotocol/clientCapabilities");
        d
    };
    let discover_headers = headers_of(&discover);
    let cases: Vec<Case> = vec![
        (
            "params without _meta, a valid version header",
            discover_headers.clone(),
            json!({"jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {}}),
            (400, -32602),
        ),
        (
            "no params at all",
            discover_headers.clone(),
            json!({"jsonrpc": "2.0", "id": 7, "method": "server/discover"}),
            (400, -32602),
        ),
        (
            "_meta without clientCapabilities",
            discover_headers.clone(),
            no_caps,
            (400, -32602),
        ),
        (
            "_meta is checked before the headers",
            vec![],
            json!({"jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}}),
            (400, -32602),
        ),
        (
            "no MCP-Protocol-Version header",
            with_header(&discover, "mcp-protocol-version", None),
            discover.clone(),
            (400, -32020),
        ),
        (
            "MCP-Protocol-Version differs from _meta",
            with_header(&discover, "mcp-protocol-version", Some("2026-07-29")),
            discover.clone(),
            (400, -32020),
        ),
        (
            "a header mismatch wins over an unsupported body version",
            with_header(&v999, "mcp-protocol-version", Some(MODERN)),
            v999.clone(),
            (400, -32020),
        ),
        (
            "no Mcp-Method",
            with_header(&discover, "mcp-method", None),
            discover.clone(),
            (400, -32020),
        ),
        (
            "Mcp-Method values are case-sensitive",
            with_header(&discover, "mcp-method", Some("SERVER/DISCOVER")),
            discover.clone(),
            (400, -32020),
        ),
        (
            "Mcp-Method repeated",
            {
                let mut h = headers_of(&discover);
                h.push(("Mcp-Method".to_owned(), "server/discover".to_owned()));
                h
            },
            discover.clone(),
            (400, -32020),
        ),
        (
            "tools/call without Mcp-Name",
            with_header(&call, "mcp-name", None),
            call.clone(),
            (400, -32020),
        ),
        (
            "Mcp-Name differs from params.name",
            with_header(&call, "mcp-name", Some("other")),
            call.clone(),
            (400, -32020),
        ),
        (
            "Mcp-Name in base64 without canonical padding",
            with_header(&call, "mcp-name", Some("=?base64?dA?=")),
            call.clone(),
            (400, -32020),
        ),
        (
            "resources/read: Mcp-Name mirrors params.uri",
            {
                let read = modern(json!(8), "resources/read", json!({"uri": "file:///r1"}));
                with_header(&read, "mcp-name", Some("file:///r2"))
            },
            modern(json!(8), "resources/read", json!({"uri": "file:///r1"})),
            (400, -32020),
        ),
        (
            "an unsupported version, header and body agreeing",
            headers_of(&v999),
            v999.clone(),
            (400, -32022),
        ),
        (
            "ping is gone in 2026-07-28",
            headers_of(&modern(json!(9), "ping", json!({}))),
            modern(json!(9), "ping", json!({})),
            (404, -32601),
        ),
        (
            "initialize with a modern claim",
            headers_of(&modern(json!(10), "initialize", json!({}))),
            modern(json!(10), "initialize", json!({})),
            (404, -32601),
        ),
        (
            "logging/setLevel is gone",
            headers_of(&modern(
                json!(11),
                "logging/setLevel",
                json!({"level": "info"}),
            )),
            modern(json!(11), "logging/setLevel", json!({"level": "info"})),
            (404, -32601),
        ),
        (
            "resources/subscribe is gone",
            headers_of(&modern(
                json!(12),
                "resources/subscribe",
                json!({"uri": "file:///r1"}),
            )),
            modern(
                json!(12),
                "resources/subscribe",
                json!({"uri": "file:///r1"}),
            ),
            (404, -32601),
        ),
        (
            "resources/unsubscribe is gone",
            headers_of(&modern(
                json!(13),
                "resources/unsubscribe",
                json!({"uri": "file:///r1"}),
            )),
            modern(
                json!(13),
                "resources/unsubscribe",
                json!({"uri": "file:///r1"}),
            ),
            (404, -32601),
        ),
        (
            "prompts/list without prompts in the script",
            headers_of(&modern(json!(14), "prompts/list", json!({}))),
            modern(json!(14), "prompts/list", json!({})),
            (404, -32601),
        ),
        (
            "an unknown method",
            headers_of(&modern(json!(15), "tools/frobnicate", json!({}))),
            modern(json!(15), "tools/frobnicate", json!({})),
            (404, -32601),
        ),
    ];
    for (what, headers, body, (status, code)) in &cases {
        let r = post_with(&server, &as_refs(headers), body);
        assert_eq!(
            error_of(&r),
            (*status, json!(code), body["id"].clone()),
            "{what}: {}",
            r.body
        );
    }

    // The messages say what was wrong.
    let r = post_with(
        &server,
        &as_refs(&with_header(&call, "mcp-name", Some("other"))),
        &call,
    );
    assert_eq!(
        r.json()["error"]["message"],
        "Header mismatch: Mcp-Name header value \"other\" does not match the body's params.name \"t\""
    );
    let r = post_with(&server, &as_refs(&headers_of(&v999)), &v999);
    assert_eq!(
        r.json()["error"],
        json!({"code": -32022, "message": "Unsupported protocol version",
               "data": {"supported": ["2026-07-28"], "requested": "v999.0.0"}})
    );

    // Nothing refused reached a tool: no attempt, no step consumed.
    assert!(server.attempts().is_empty(), "{:?}", server.attempts());
    let r = post_modern(server.addr, &call, &[]);
    assert_eq!(r.json()["result"]["content"][0]["text"], "1");
}

#[test]
fn header_values_are_compared_as_meant() {
    let server = HttpServer::start(&script(TOOLS), HttpOptions::default());
    let text = |r: &RawResponse| r.json()["result"]["content"][0]["text"].clone();
    let call = |id: i64, tool: &str| {
        modern(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": {}}),
        )
    };
    // Header names are case-insensitive; values lose RFC 9110 whitespace.
    let body = call(1, "t");
    let r = post_with(
        &server,
        &[
            ("MCP-PROTOCOL-VERSION", MODERN),
            ("MCP-METHOD", "tools/call"),
            ("Mcp-Name", " \t t \t "),
        ],
        &body,
    );
    assert_eq!((r.status, text(&r)), (200, json!("1")), "{}", r.body);
    // A name that is not plain ASCII travels in the base64 form.
    let body = call(2, "grüße");
    let r = post_with(
        &server,
        &as_refs(&with_header(
            &body,
            "mcp-name",
            Some("=?base64?Z3LDvMOfZQ==?="),
        )),
        &body,
    );
    assert_eq!((r.status, text(&r)), (200, json!("hallo")), "{}", r.body);
    // A session id on a modern request is ignored, not validated.
    let body = call(3, "t");
    let r = post_modern(server.addr, &body, &[("mcp-session-id", "no-such-session")]);
    assert_eq!((r.status, text(&r)), (200, json!("2")), "{}", r.body);
    assert!(r.header("mcp-session-id").is_none());
}

#[test]
fn mcp_param_headers_must_mirror_the_annotated_arguments() {
    let server = HttpServer::start(&script(TOOLS), HttpOptions::default());
    let body = modern(
        json!(1),
        "tools/call",
        json!({"name": "regional", "arguments": {"region": "eu-west1", "count": 42}}),
    );
    let refused = [
        (vec![("mcp-param-count", "42")], "Mcp-Param-Region missing"),
        (
            vec![("mcp-param-region", "us-east1"), ("mcp-param-count", "42")],
            "Mcp-Param-Region differs",
        ),
        (
            vec![
                ("mcp-param-region", "eu-west1"),
                ("mcp-param-region", "eu-west1"),
                ("mcp-param-count", "42"),
            ],
            "Mcp-Param-Region repeated",
        ),
        (
            vec![
                ("mcp-param-region", "eu-west1"),
                ("mcp-param-count", "42.5"),
            ],
            "Mcp-Param-Count another number",
        ),
    ];
    for (extra, what) in refused {
        let r = post_modern(server.addr, &body, &extra);
        assert_eq!(
            error_of(&r),
            (400, json!(-32020), json!(1)),
            "{what}: {}",
            r.body
        );
    }
    // An absent (or null) argument must come without its header.
    let only_region = modern(
        json!(2),
        "tools/call",
        json!({"name": "regional", "arguments": {"region": "eu-west1", "count": null}}),
    );
    let r = post_modern(
        server.addr,
        &only_region,
        &[("mcp-param-region", "eu-west1"), ("mcp-param-count", "1")],
    );
    assert_eq!(error_of(&r), (400, json!(-32020), json!(2)), "{}", r.body);
    assert!(server.attempts().is_empty());

    // Integers compare by value; names case-insensitively.
    let r = post_modern(
        server.addr,
        &body,
        &[
            ("Mcp-Param-Region", "eu-west1"),
            ("MCP-PARAM-COUNT", "42.0"),
        ],
    );
    assert_eq!(
        (r.status, r.json()["result"]["content"][0]["text"].clone()),
        (200, json!("a")),
        "{}",
        r.body
    );
    let r = post_modern(
        server.addr,
        &only_region,
        &[("mcp-param-region", "eu-west1")],
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn modern_notifications_responses_and_ids() {
    let server = HttpServer::start(&script(TOOLS), HttpOptions::default());
    let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"_meta": meta(), "progressToken": 1, "progress": 1}});
    let h = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "notifications/progress"),
    ];
    let r = post_with(&server, &h, &note);
    assert_eq!((r.status, r.body.as_str()), (202, ""));
    // A notification at a version this server does not speak is told so.
    let r = post_with(
        &server,
        &[("mcp-protocol-version", "2030-01-01")],
        &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}),
    );
    assert_eq!(error_of(&r), (400, json!(-32022), Value::Null));
    // A client posts requests and notifications, never responses.
    let r = post_with(
        &server,
        &[("mcp-protocol-version", MODERN)],
        &json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
    );
    assert_eq!(error_of(&r), (400, json!(-32600), Value::Null));
    // An id must be a string or a number.
    let mut bad_id = modern(json!(1), "server/discover", json!({}));
    bad_id["id"] = json!({"n": 1});
    let r = post_modern(server.addr, &bad_id, &[]);
    assert_eq!(error_of(&r), (400, json!(-32600), Value::Null));
}

#[test]
fn server_discover_and_the_shape_of_modern_results() {
    let spec = "  caching: {ttlMs: 5000, cacheScope: public}
  pageSize: 1
  tools:
    - {name: a, responses: [{sequence: [{return: {ok: true}}]}]}
    - {name: b, responses: [{sequence: [{return: 1}]}]}
  resources:
    - {uri: 'file:///r1', name: r1, text: one}
  prompts:
    - {name: greet, text: hello}
";
    let server = HttpServer::start(&script(spec), HttpOptions::default());
    let info = json!({"io.modelcontextprotocol/serverInfo": {"name": "test", "version": env!("CARGO_PKG_VERSION")}});
    let ask = |id: i64, method: &str, params: Value| {
        let r = post_modern(server.addr, &modern(json!(id), method, params), &[]);
        assert_eq!(r.status, 200, "{method}: {}", r.body);
        r.json()
    };
    assert_eq!(
        ask(1, "server/discover", json!({})),
        json!({"jsonrpc": "2.0", "id": 1, "result": {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {"listChanged": false}, "resources": {"listChanged": false}, "prompts": {"listChanged": false}},
            "ttlMs": 5000, "cacheScope": "public", "_meta": info}})
    );
    let first = ask(2, "tools/list", json!({}));
    assert_eq!(
        first["result"],
        json!({"resultType": "complete", "tools": [{"name": "a", "inputSchema": {"type": "object"}}],
               "nextCursor": "page-1", "ttlMs": 5000, "cacheScope": "public", "_meta": info})
    );
    let second = ask(3, "tools/list", json!({"cursor": "page-1"}));
    assert_eq!(second["result"]["tools"][0]["name"], "b");
    assert_eq!(second["result"]["ttlMs"], 5000);
    for (method, params, key) in [
        ("resources/list", json!({}), "resources"),
        ("resources/templates/list", json!({}), "resourceTemplates"),
        ("prompts/list", json!({}), "prompts"),
        ("resources/read", json!({"uri": "file:///r1"}), "contents"),
    ] {
        let r = ask(4, method, params)["result"].clone();
        assert!(r.get(key).is_some(), "{method}: {r}");
        assert_eq!(
            (&r["resultType"], &r["ttlMs"], &r["cacheScope"], &r["_meta"]),
            (&json!("complete"), &json!(5000), &json!("public"), &info),
            "{method}"
        );
    }
    // Not cacheable: prompts/get and tools/call carry no hints.
    let prompt = ask(5, "prompts/get", json!({"name": "greet"}))["result"].clone();
    assert_eq!(prompt["messages"][0]["content"]["text"], "hello");
    assert_eq!(
        (prompt.get("ttlMs"), &prompt["resultType"], &prompt["_meta"]),
        (None, &json!("complete"), &info)
    );
    let call = ask(6, "tools/call", json!({"name": "a", "arguments": {}}))["result"].clone();
    assert_eq!(
        call,
        json!({"resultType": "complete", "content": [{"type": "text", "text": "{\"ok\":true}"}],
               "structuredContent": {"ok": true}, "isError": false, "_meta": info})
    );
    // Handler errors stay in-band; 2026-07-28 retired -32002.
    let missing = ask(7, "resources/read", json!({"uri": "file:///nope"}));
    assert_eq!(
        missing["error"],
        json!({"code": -32602, "message": "Resource not found", "data": {"uri": "file:///nope"}})
    );
    assert_eq!(
        ask(8, "tools/list", json!({"cursor": "bogus"}))["error"]["code"],
        -32602
    );

    // The legacy era on the same endpoint is untouched.
    let session = server.session();
    let legacy = post(
        server.addr,
        &[
            ("mcp-session-id", &session),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
    )
    .json();
    assert_eq!(
        legacy["result"],
        json!({"tools": [{"name": "a", "inputSchema": {"type": "object"}}], "nextCursor": "page-1"})
    );
}

const STEPS: &str = "  tools:
    - name: t
      responses:
        - sequence:
            - return: {ok: true}
            - error: tool failed
            - jsonrpc_error: {code: -32000, message: scripted}
            - http: {status: 503, headers: {Retry-After: '1'}}
            - http: {status: 403, headers: {WWW-Authenticate: 'Bearer error=\"insufficient_scope\", scope=\"items:read\"'}, body: denied}
            - drop: true
            - stall_body: {after_bytes: 15}
            - raw_body: not json
            - oversize: {bytes: 5000}
            - sse_close_after_event: {retry_ms: 250}
";

#[test]
fn scripted_faults_meet_modern_requests_as_they_meet_legacy_ones() {
    let server = HttpServer::start(&script(STEPS), HttpOptions::default());
    let call = |id: i64| {
        modern(
            json!(id),
            "tools/call",
            json!({"name": "t", "arguments": {}}),
        )
    };
    let next = |id: i64| post_modern(server.addr, &call(id), &[]);

    let r = next(1);
    assert_eq!(r.json()["result"]["structuredContent"], json!({"ok": true}));
    assert_eq!(r.json()["result"]["resultType"], "complete");
    assert_eq!(r.json()["result"]["isError"], false);
    assert_eq!(next(2).json()["result"]["isError"], true);
    let r = next(3);
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (200, json!({"code": -32000, "message": "scripted"}))
    );
    let r = next(4);
    assert_eq!(
        (r.status, r.header("retry-after"), r.body.as_str()),
        (503, Some("1"), "")
    );
    let r = next(5);
    assert_eq!(
        (r.status, r.header("www-authenticate"), r.body.as_str()),
        (
            403,
            Some(r#"Bearer error="insufficient_scope", scope="items:read""#),
            "denied"
        )
    );
    assert!(next(6).dropped, "drop closes the socket with no response");
    let r = request(
        server.addr,
        "POST",
        &as_refs(&headers_of(&call(7))),
        Some(&call(7).to_string()),
        Duration::from_millis(300),
    );
    assert!(r.stalled, "{r:?}");
    assert_eq!(r.body.len(), 15);
    let r = next(8);
    assert_eq!((r.status, r.body.as_str()), (200, "not json"));
    let r = next(9).json();
    assert_eq!(
        r["result"]["content"][0]["text"].as_str().unwrap().len(),
        5000
    );
    assert_eq!(r["result"]["resultType"], "complete");

    // No resumption in 2026-07-28: the stream opens and ends unanswered.
    let r = next(10);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.body, ": stream opened\n\n");

    let attempts = server.attempts();
    let seen: Vec<(Value, Value)> = attempts
        .iter()
        .map(|a| (a["step"].clone(), a["outcome"].clone()))
        .collect();
    let expected = [
        ("return", "delivered"),
        ("error", "fixture_error"),
        ("jsonrpc_error", "fixture_error"),
        ("http", "fixture_error"),
        ("http", "fixture_error"),
        ("drop", "fixture_error"),
        ("stall_body", "fixture_error"),
        ("raw_body", "fixture_error"),
        ("oversize", "delivered"),
        ("sse_close_after_event", "fixture_error"),
    ]
    .map(|(s, o)| (json!(s), json!(o)))
    .to_vec();
    assert_eq!(seen, expected);
    assert!(attempts.iter().all(|a| a["protocol_version"] == MODERN));
    let sessions: Vec<&str> = attempts
        .iter()
        .map(|a| a["session"].as_str().unwrap())
        .collect();
    assert!(
        sessions.iter().all(|s| s.starts_with("modern-")),
        "{sessions:?}"
    );
    let unique: std::collections::BTreeSet<&&str> = sessions.iter().collect();
    assert_eq!(
        unique.len(),
        sessions.len(),
        "each request is its own exchange"
    );
}

#[test]
fn a_modern_health_check_meets_the_bearer_requirement() {
    let token = "health-token";
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    let yaml = script(&format!(
        "  requireBearer: {{sha256: \"{digest}\"}}\n  tools:\n    - name: t\n      responses: [{{sequence: [{{return: ok}}]}}]\n"
    ));
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let list = modern(json!(1), "tools/list", json!({}));
    let none = post_modern(server.addr, &list, &[]);
    assert_eq!(
        (none.status, none.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    let wrong = post_modern(server.addr, &list, &[("authorization", "Bearer nope")]);
    assert_eq!(
        (wrong.status, wrong.header("www-authenticate")),
        (401, Some("Bearer error=\"invalid_token\""))
    );
    let auth = format!("Bearer {token}");
    let ok = post_modern(server.addr, &list, &[("authorization", &auth)]);
    assert_eq!(ok.json()["result"]["tools"][0]["name"], "t");
}

#[test]
fn closing_a_modern_response_cancels_its_call() {
    let yaml = script(
        "  tools:\n    - name: slow\n      responses: [{sequence: [{return: late, delay_ms: 300000}, {return: next}]}]\n",
    );
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let body = modern(
        json!(1),
        "tools/call",
        json!({"name": "slow", "arguments": {}}),
    )
    .to_string();
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {}\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        server.addr,
        body.len()
    );
    for (k, v) in headers_of(&serde_json::from_str(&body).unwrap()) {
        head += &format!("{k}: {v}\r\n");
    }
    write!(stream, "{head}\r\n{body}").unwrap();
    let (session, _) = server.wait_running_id(&json!(1));
    assert!(session.starts_with("modern-"), "{session}");
    drop(stream);
    server.wait_idle();
    let attempts = server.attempts();
    assert_eq!(
        (attempts.len(), attempts[0]["outcome"].clone()),
        (1, json!("canceled_running"))
    );
    // The canceled call kept its step.
    let r = post_modern(
        server.addr,
        &modern(
            json!(2),
            "tools/call",
            json!({"name": "slow", "arguments": {}}),
        ),
        &[],
    );
    assert_eq!(r.json()["result"]["content"][0]["text"], "next");
}

#[test]
fn a_legacy_only_server_answers_modern_requests_as_2025_11_25_servers_do() {
    let yaml = script(&format!("  era: legacy\n{TOOLS}"));
    let server = HttpServer::start(&yaml, HttpOptions::default());
    // No session: 400, the JSON-RPC error a dual-era client falls back on.
    for method in ["server/discover", "tools/list"] {
        let r = post_modern(server.addr, &modern(json!(1), method, json!({})), &[]);
        assert_eq!(error_of(&r), (400, json!(-32600), Value::Null), "{method}");
        assert_eq!(
            r.json()["error"]["message"],
            "missing Mcp-Session-Id header"
        );
    }
    // initialize is initialize, whatever _meta it carries.
    let init = modern(
        json!(2),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let r = post(server.addr, &[], &init);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["protocolVersion"], "2025-11-25");
    let session = r.header("mcp-session-id").unwrap().to_owned();
    // In a session, server/discover is a method it never had.
    let r = post(
        server.addr,
        &[("mcp-session-id", &session)],
        &modern(json!(3), "server/discover", json!({})),
    );
    assert_eq!(r.json()["error"]["code"], -32601);
}

#[test]
fn a_modern_only_server_refuses_legacy_traffic_naming_its_versions() {
    let yaml = script(&format!("  era: modern\n{TOOLS}"));
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let init = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let r = post(server.addr, &[], &init);
    assert_eq!(error_of(&r), (400, json!(-32022), json!("init")));
    assert_eq!(
        r.json()["error"]["data"],
        json!({"supported": ["2026-07-28"], "requested": "2025-11-25"})
    );
    assert!(r.header("mcp-session-id").is_none());
    // A request without an envelope is named by its header version.
    let r = post(
        server.addr,
        &[
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-session-id", "x"),
        ],
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
    );
    assert_eq!(error_of(&r), (400, json!(-32022), json!(5)));
    assert_eq!(r.json()["error"]["data"]["requested"], "2025-11-25");
    // Legacy notifications are accepted and dropped; responses refused.
    let r = post(
        server.addr,
        &[],
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!((r.status, r.body.as_str()), (202, ""));
    let r = post(
        server.addr,
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
    );
    assert_eq!(error_of(&r), (400, json!(-32600), Value::Null));
    // No GET stream, no sessions to DELETE.
    for method in ["GET", "DELETE"] {
        let r = request(
            server.addr,
            method,
            &[("mcp-session-id", "x")],
            None,
            Duration::from_secs(5),
        );
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some("POST")),
            "{method}"
        );
    }
    // Modern traffic is served.
    let r = post_modern(
        server.addr,
        &modern(json!(6), "server/discover", json!({})),
        &[],
    );
    assert_eq!(
        r.json()["result"]["supportedVersions"],
        json!(["2026-07-28"])
    );
}

#[test]
fn a_dual_era_server_keeps_get_and_delete_for_legacy_sessions() {
    let server = HttpServer::start(&script(TOOLS), HttpOptions::default());
    let session = server.session();
    let r = request(
        server.addr,
        "GET",
        &[("mcp-session-id", &session)],
        None,
        Duration::from_secs(5),
    );
    assert_eq!(
        r.status, 405,
        "no standalone stream, but the session is known"
    );
    let r = request(
        server.addr,
        "DELETE",
        &[("mcp-session-id", &session)],
        None,
        Duration::from_secs(5),
    );
    assert_eq!(r.status, 204);
    let r = request(server.addr, "GET", &[], None, Duration::from_secs(5));
    assert_eq!(r.status, 404, "GET without a session is legacy handling");
}

#[test]
fn the_era_flag_overrides_the_document() {
    let tmp = common::scratch("era-flag");
    let dir = tmp.path();
    let config = dir.join("legacy.yaml");
    std::fs::write(&config, script(&format!("  era: legacy\n{TOOLS}"))).unwrap();
    let log = dir.join("attempts.jsonl");
    let (mut child, addr) = common::spawn_http_binary_with(&config, &log, &["--era", "modern"]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}});
    let r = post(addr, &[], &init);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(error_of(&r), (400, json!(-32022), json!(1)));
    assert_eq!(r.json()["error"]["data"]["requested"], "2025-06-18");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aip-fault-server"))
        .arg("--config")
        .arg(&config)
        .args(["--era", "sometimes", "--check"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "invalid value 'sometimes' for '--era <ERA>': must be both, legacy or modern"
        ),
        "{stderr}"
    );
}

const HEALTH: &str = "  toolsList:
    sequence:
      - http: {status: 503, headers: {Retry-After: '2'}}
      - jsonrpc_error: {code: -32603, message: catalog unavailable}
      - list: true
      - http: {status: 403, headers: {WWW-Authenticate: 'Bearer error=\"insufficient_scope\"'}}
      - drop: true
      - raw_body: '{\"jsonrpc\":\"2.0\",\"id\":'
      - stall_body: {after_bytes: 10}
  tools:
    - name: t
      responses: [{sequence: [{return: 1}]}]
";

#[test]
fn scripted_health_checks_fail_as_the_script_says_in_either_era() {
    let server = HttpServer::start(&script(HEALTH), HttpOptions::default());
    let session = server.session();
    let legacy_list = |id: i64| {
        post(
            server.addr,
            &[
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}),
        )
    };
    let modern_list = |id: i64| {
        post_modern(
            server.addr,
            &modern(json!(id), "tools/list", json!({})),
            &[],
        )
    };

    let r = modern_list(1);
    assert_eq!((r.status, r.header("retry-after")), (503, Some("2")));
    let r = legacy_list(2);
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (
            200,
            json!({"code": -32603, "message": "catalog unavailable"})
        )
    );
    let r = modern_list(3).json();
    assert_eq!(
        (
            &r["result"]["tools"][0]["name"],
            &r["result"]["resultType"],
            &r["result"]["ttlMs"]
        ),
        (&json!("t"), &json!("complete"), &json!(0))
    );
    let r = legacy_list(4);
    assert_eq!(r.status, 403);
    assert!(modern_list(5).dropped);
    let r = legacy_list(6);
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, r#"{"jsonrpc":"2.0","id":"#)
    );
    let r = request(
        server.addr,
        "POST",
        &as_refs(&headers_of(&modern(json!(7), "tools/list", json!({})))),
        Some(&modern(json!(7), "tools/list", json!({})).to_string()),
        Duration::from_millis(300),
    );
    assert!(r.stalled && r.body.len() == 10, "{r:?}");
    // Past the script, every health check gets the listing.
    assert_eq!(modern_list(8).json()["result"]["tools"][0]["name"], "t");
    assert_eq!(legacy_list(9).json()["result"]["tools"][0]["name"], "t");

    let attempts = server.attempts();
    let lines: Vec<Value> = attempts
        .iter()
        .map(|a| {
            json!([
                a["method"],
                a["tool"],
                a["step_index"],
                a["step"],
                a["outcome"],
                a["protocol_version"]
            ])
        })
        .collect();
    assert_eq!(
        lines,
        vec![
            json!(["tools/list", null, 0, "http", "fixture_error", MODERN]),
            json!([
                "tools/list",
                null,
                1,
                "jsonrpc_error",
                "fixture_error",
                "2025-11-25"
            ]),
            json!(["tools/list", null, 2, "list", "delivered", MODERN]),
            json!(["tools/list", null, 3, "http", "fixture_error", "2025-11-25"]),
            json!(["tools/list", null, 4, "drop", "fixture_error", MODERN]),
            json!([
                "tools/list",
                null,
                5,
                "raw_body",
                "fixture_error",
                "2025-11-25"
            ]),
            json!(["tools/list", null, 6, "stall_body", "fixture_error", MODERN]),
        ],
        "one line per scripted step, none once the script is played"
    );
}

#[test]
fn a_slow_health_check_holds_up_nothing_else() {
    let yaml = script(
        "  toolsList:\n    sequence: [{list: true, delay_ms: 300000}]\n  tools:\n    - name: t\n      responses: [{sequence: [{return: 1}]}]\n",
    );
    let server = HttpServer::start(&yaml, HttpOptions::default());
    let slow = modern(json!(1), "tools/list", json!({})).to_string();
    let mut held = std::net::TcpStream::connect(server.addr).unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        slow.len()
    );
    for (k, v) in headers_of(&serde_json::from_str(&slow).unwrap()) {
        head += &format!("{k}: {v}\r\n");
    }
    write!(held, "{head}\r\n{slow}").unwrap();
    // The step is chosen (and logged) when the request arrives.
    server.wait_attempts(1);
    assert_eq!(server.attempts()[0]["delay_ms"], 300000);
    let call = post_modern(
        server.addr,
        &modern(
            json!(2),
            "tools/call",
            json!({"name": "t", "arguments": {}}),
        ),
        &[],
    );
    assert_eq!(call.json()["result"]["content"][0]["text"], "1");
    let list = post_modern(server.addr, &modern(json!(3), "tools/list", json!({})), &[]);
    assert_eq!(list.json()["result"]["tools"][0]["name"], "t");
    drop(held);
}

const MRTR: &str = "  tools:
    - name: login
      responses:
        - sequence:
            - input_required:
                inputRequests:
                  who: {method: elicitation/create, params: {mode: form, message: Who?, requestedSchema: {type: object}}}
                requestState: s-1
            - return: welcome
              expect_retry:
                requestState: s-1
                inputResponses: {who: {action: accept, content: {name: octocat}}}
    - name: visit
      responses:
        - sequence:
            - input_required:
                inputRequests:
                  open: {method: elicitation/create, params: {mode: url, message: Sign in, url: 'https://example.com/a'}}
                  folders: {method: roots/list}
";

#[test]
fn multi_round_trip_steps_check_the_retry_and_the_declared_capabilities() {
    let server = HttpServer::start(&script(MRTR), HttpOptions::default());
    let with_caps = |id: i64, tool: &str, caps: Value, extra: Value| {
        let mut body = modern(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": {}}),
        );
        body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = caps;
        for (k, v) in extra.as_object().unwrap() {
            body["params"][k] = v.clone();
        }
        post_modern(server.addr, &body, &[])
    };
    let form = json!({"elicitation": {}});
    // Undeclared capability: 400 -32021 naming what is needed.
    let r = with_caps(1, "login", json!({}), json!({}));
    assert_eq!(error_of(&r), (400, json!(-32021), json!(1)));
    assert_eq!(
        r.json()["error"]["data"],
        json!({"requiredCapabilities": {"elicitation": {"form": {}}}})
    );
    // URL mode needs `url`; `{}` is form only. Roots are asked for too.
    let r = with_caps(2, "visit", form.clone(), json!({}));
    assert_eq!(
        r.json()["error"]["data"],
        json!({"requiredCapabilities": {"elicitation": {"url": {}}, "roots": {}}})
    );
    // A legacy call cannot be given input: a tool error.
    let session = server.session();
    let legacy = post(
        server.addr,
        &[("mcp-session-id", &session)],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "login", "arguments": {}}}),
    )
    .json();
    assert_eq!(legacy["result"]["isError"], true, "{legacy}");

    // The first round.
    let r = with_caps(4, "login", form.clone(), json!({}));
    assert_eq!(r.status, 200);
    let result = r.json()["result"].clone();
    assert_eq!(
        (
            &result["resultType"],
            &result["requestState"],
            &result["inputRequests"]["who"]["method"]
        ),
        (
            &json!("input_required"),
            &json!("s-1"),
            &json!("elicitation/create")
        )
    );
    assert!(result.get("ttlMs").is_none(), "not cacheable: {result}");
    // Retries that are not the one expected: -32602 in-band, nothing consumed.
    let answer = json!({"who": {"action": "accept", "content": {"name": "octocat"}}});
    for (extra, what) in [
        (
            json!({"inputResponses": answer}),
            "requestState is missing from the retry",
        ),
        (
            json!({"inputResponses": answer, "requestState": "forged"}),
            "requestState does not match the one issued",
        ),
        (
            json!({"requestState": "s-1"}),
            "inputResponses.who is missing",
        ),
        (
            json!({"requestState": "s-1", "inputResponses": {"who": {"action": "decline"}}}),
            "inputResponses.who is not the response the script expects",
        ),
    ] {
        let r = with_caps(5, "login", form.clone(), extra);
        assert_eq!(
            (r.status, r.json()["error"].clone()),
            (
                200,
                json!({"code": -32602, "message": format!("Invalid params: {what}")})
            ),
        );
    }
    // The retry as issued (extra responses ignored) gets the result.
    let r = with_caps(
        6,
        "login",
        form,
        json!({"requestState": "s-1", "inputResponses": {"who": {"action": "accept", "content": {"name": "octocat"}}, "extra": {}}}),
    );
    assert_eq!(r.json()["result"]["content"][0]["text"], "welcome");
    let outcomes: Vec<(Value, Value)> = server
        .attempts()
        .iter()
        .map(|a| (a["step_index"].clone(), a["outcome"].clone()))
        .collect();
    let expected = [
        (0, "missing_capability"),
        (0, "missing_capability"),
        (0, "wrong_era"),
        (0, "delivered"),
        (1, "retry_mismatch"),
        (1, "retry_mismatch"),
        (1, "retry_mismatch"),
        (1, "retry_mismatch"),
        (1, "delivered"),
    ]
    .map(|(i, o)| (json!(i), json!(o)))
    .to_vec();
    assert_eq!(outcomes, expected);
}

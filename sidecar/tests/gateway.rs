//! The gateway on real loopback, between a raw HTTP agent and the fault
//! server: every decision and error code with its exact error object,
//! tools/list filtering, DLP, monitor mode, approvals, and the agent-facing
//! transport rules.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aip_mcp::Upstream;
use aip_sidecar::upstream::health::HealthState;
use common::{PATIENCE, Setup, Stack, raw};
use serde_json::{Value, json};

const TOOLS: &str = "  tools:
    - name: read
      description: Read a thing.
      responses: [{sequence: [{return: {owner: ops@acme.io, n: 1}}, {return: again}, {return: third}]}]
    - name: write
      responses: [{sequence: [{return: written}]}]
    - name: deploy
      description: Ship it.
      responses: [{sequence: [{return: deployed}, {return: deployed twice}]}]
    - name: fetch
      responses: [{sequence: [{return: fetched}, {return: fetched 2}]}]
    - name: leaky
      responses: [{sequence: [{jsonrpc_error: {code: -32000, message: 'denied for ops@acme.io', data: {who: ops@acme.io}}}]}]
";

const POLICY: &str = "  allowed_tools: [up_read, up_leaky]
  protected_paths: [/etc/shadow]
  tool_rules:
    - {tool: up_write, action: block}
    - {tool: up_deploy, action: ask}
    - {tool: up_fetch, rate_limit: 2/hour, allow_args: {url: '^https://'}}
  dlp:
    patterns:
      - {name: Email, regex: '[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}'}
";

async fn stack() -> Stack {
    Stack::start(Setup {
        faults: TOOLS,
        policy: POLICY,
        ..Setup::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_is_prefixed_and_filtered() {
    let s = stack().await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        vec!["up_deploy", "up_fetch", "up_leaky", "up_read"],
        "write is blocked, so hidden"
    );
    let deploy = tools.iter().find(|t| t["name"] == "up_deploy").unwrap();
    assert_eq!(deploy["description"], "[requires human approval] Ship it.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_and_error_code_with_its_exact_error_object() {
    let s = stack().await;
    let session = s.session().await;
    let ok = s.call(&session, json!("a-1"), "up_read", json!({})).await;
    assert_eq!(ok["id"], "a-1");
    assert_eq!(
        ok["result"]["structuredContent"],
        json!({"owner": "[REDACTED:Email]", "n": 1})
    );

    let cases = [
        (
            "up_write",
            json!({}),
            json!({"code": -32001, "message": "Forbidden", "data": {"tool": "up_write", "reason": "Tool is blocked by policy"}}),
        ),
        (
            "up_nope",
            json!({}),
            json!({"code": -32001, "message": "Forbidden", "data": {"tool": "up_nope", "reason": "Tool not in allowed_tools list"}}),
        ),
        (
            "up_fetch",
            json!({"url": "http://plain"}),
            json!({"code": -32001, "message": "Forbidden", "data": {"tool": "up_fetch", "reason": "Argument 'url' does not match allow_args"}}),
        ),
        (
            "up_read",
            json!({"path": "/var/../etc/shadow"}),
            json!({"code": -32007, "message": "Access denied: protected path", "data": {"tool": "up_read", "reason": "Argument 'path' refers to a protected path"}}),
        ),
    ];
    for (i, (tool, args, error)) in cases.into_iter().enumerate() {
        let r = s.call(&session, json!(i), tool, args).await;
        assert_eq!(
            r,
            json!({"jsonrpc": "2.0", "id": i, "error": error}),
            "{tool}"
        );
    }
    // Rate limit 2/hour: the refused fetch above took a token too (the limit
    // is checked first), so one more passes and the next is refused.
    assert_eq!(
        s.call(&session, json!(10), "up_fetch", json!({"url": "https://x"}))
            .await["result"]["content"][0]["text"],
        "fetched"
    );
    let limited = s
        .call(&session, json!(11), "up_fetch", json!({"url": "https://x"}))
        .await;
    assert_eq!(limited["error"]["code"], -32002);
    assert_eq!(limited["error"]["message"], "Rate limit exceeded");
    // Method gate.
    let m = s.request(&session, json!("m"), "resources/read").await;
    assert_eq!(
        m,
        json!({"jsonrpc": "2.0", "id": "m", "error": {"code": -32006, "message": "Method not allowed",
        "data": {"method": "resources/read", "reason": "Method not in allowed_methods"}}})
    );
    // Only the allowed calls reached the upstream.
    let tools: Vec<Value> = s.attempts().iter().map(|a| a["tool"].clone()).collect();
    assert_eq!(tools, vec![json!("read"), json!("fetch")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_messages_and_data_are_redacted() {
    let s = stack().await;
    let session = s.session().await;
    let r = s.call(&session, json!(1), "up_leaky", json!({})).await;
    assert_eq!(
        r["error"],
        json!({"code": -32000, "message": "denied for [REDACTED:Email]", "data": {"who": "[REDACTED:Email]"}})
    );
    assert!(
        s.audit_lines()
            .iter()
            .any(|l| l["event"] == "DLP_TRIGGERED" && l["dlp_match_count"] == 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_mode_forwards_what_enforce_would_block_and_records_it() {
    let policy = POLICY.replace("  allowed_tools:", "  mode: monitor\n  allowed_tools:");
    let s = Stack::start(Setup {
        faults: TOOLS,
        policy: &policy,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let r = s.call(&session, json!(1), "up_write", json!({})).await;
    assert_eq!(r["result"]["content"][0]["text"], "written");
    let line = s
        .audit_lines()
        .into_iter()
        .find(|l| l["tool"] == "up_write")
        .unwrap();
    assert_eq!(
        (line["decision"].clone(), line["violation"].clone()),
        (json!("ALLOW_MONITOR"), json!(true))
    );
    // Protected paths are enforced even in monitor mode.
    let p = s
        .call(&session, json!(2), "up_read", json!({"p": "/etc/shadow"}))
        .await;
    assert_eq!(p["error"]["code"], -32007);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_approved_and_denied_while_other_calls_complete() {
    let s = std::sync::Arc::new(stack().await);
    let session = s.session().await;
    for (approve, expected) in [(true, json!({"text": "deployed"})), (false, json!(-32004))] {
        let mut changes = s.gateway.approvals.subscribe();
        let (s2, session2) = (s.clone(), session.clone());
        let asking = tokio::spawn(async move {
            s2.call(&session2, json!("ask"), "up_deploy", json!({"env": "prod"}))
                .await
        });
        let pending = loop {
            if let Some(p) = s.gateway.approvals.list().into_iter().next() {
                break p;
            }
            tokio::time::timeout(PATIENCE, changes.changed())
                .await
                .unwrap()
                .unwrap();
        };
        assert_eq!(pending.tool, "up_deploy");
        assert_eq!(pending.connection, "up");
        // Meanwhile another call of the same agent completes.
        let other = s.call(&session, json!("other"), "up_read", json!({})).await;
        assert!(other.get("result").is_some(), "{other}");
        s.gateway.approvals.decide(&pending.id, approve).unwrap();
        let r = asking.await.unwrap();
        if approve {
            assert_eq!(r["result"]["content"][0]["text"], "deployed");
        } else {
            assert_eq!(r["error"]["code"], expected);
            assert_eq!(r["error"]["message"], "User denied");
        }
        let _ = expected;
    }
    let deploys = s
        .attempts()
        .iter()
        .filter(|a| a["tool"] == "deploy")
        .count();
    assert_eq!(deploys, 1, "only the approved ask was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_times_out_with_the_approval_timeout_error() {
    let s = Stack::start(Setup {
        faults: TOOLS,
        policy: POLICY,
        approval_timeout: Duration::from_millis(200),
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let r = s.call(&session, json!(9), "up_deploy", json!({})).await;
    assert_eq!(
        r["error"],
        json!({"code": -32005, "message": "User approval timeout",
        "data": {"tool": "up_deploy", "reason": "No approval decision before the timeout"}})
    );
    assert!(s.attempts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_shapes_never_reach_the_upstream() {
    let s = stack().await;
    let session = s.session().await;
    let h = [("mcp-session-id", session.as_str())];
    for (body, code) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","Method":"tools/list","params":{"name":"up_read","arguments":{}}}"#,
            -32700,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"up_read","arguments":{},"argumentſ":{"path":"/etc/shadow"}}}"#,
            -32700,
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"up_read","\u006eame":"up_write","arguments":{}}}"#,
            -32700,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"up_read","arguments":{"n":12345678901234567890}}}"#,
            -32700,
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"up_read","arguments":{}}} {"x":1}"#,
            -32700,
        ),
        (
            r#"[{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"up_read","arguments":{}}}]"#,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"up_read","arguments":{"x":NaN}}}"#,
            -32700,
        ),
    ] {
        let r = s.post(&h, body).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["error"]["code"], code, "{body}");
    }
    assert!(s.attempts().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_answers_as_an_mcp_server_must() {
    let s = stack().await;
    let session = s.session().await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    assert_eq!(
        s.post(&[("mcp-session-id", "nope")], ping).await.status,
        404
    );
    assert_eq!(s.post(&[], ping).await.status, 400);
    assert_eq!(
        s.post(
            &[
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "1999-01-01")
            ],
            ping
        )
        .await
        .status,
        400
    );
    assert_eq!(
        s.post(
            &[
                ("mcp-session-id", &session),
                ("origin", "http://evil.example")
            ],
            ping
        )
        .await
        .status,
        403
    );
    // Parsed as URLs: user information before a foreign host does not make
    // it loopback; a Host that names another site is DNS rebinding.
    for (header, value) in [
        ("origin", "http://localhost:80@evil.example"),
        ("origin", "http://127.0.0.1@evil.example:8808"),
        ("host", "evil.example:8808"),
        ("host", "localhost.evil.example"),
    ] {
        let refused = s
            .post(&[("mcp-session-id", &session), (header, value)], ping)
            .await;
        assert_eq!(refused.status, 403, "{header}: {value}");
    }
    let ok = s
        .post(
            &[
                ("mcp-session-id", &session),
                ("origin", "http://localhost:3000"),
                ("mcp-protocol-version", "2025-06-18"),
            ],
            ping,
        )
        .await;
    assert_eq!(ok.json(), json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    let sse = s
        .post(
            &[
                ("mcp-session-id", &session),
                ("accept", "text/event-stream"),
            ],
            ping,
        )
        .await;
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        raw(s.addr, "DELETE", &[("mcp-session-id", &session)], "")
            .await
            .status,
        204
    );
    assert_eq!(
        s.post(&[("mcp-session-id", &session)], ping).await.status,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_valid_credentials_means_no_tools_and_nothing_sent() {
    let s = Stack::start(Setup {
        faults: TOOLS,
        policy: POLICY,
        connection: "  bearerToken:\n    valueFrom: {env: AIP_SURELY_UNSET_VARIABLE}\n",
        expect: HealthState::NeedsCredentials,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    assert_eq!(
        s.request(&session, json!(1), "tools/list").await["result"]["tools"],
        json!([])
    );
    assert!(s.attempts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_decisions_failures_and_latency_with_bounded_labels() {
    let faults =
        "  tools:\n    - name: read\n      responses: [{sequence: [{return: ok}, {drop: true}]}]\n";
    let s = Stack::start(Setup {
        faults,
        policy: "  allowed_tools: [up_read]\n",
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    s.call(&session, json!(1), "up_read", json!({})).await;
    s.call(&session, json!(2), "up_read", json!({})).await;
    s.call(&session, json!(3), "made_up_tool_name_12345", json!({}))
        .await;
    let text = s.gateway.metrics.encode();
    for expected in [
        r#"aip_sidecar_decisions_total{decision="ALLOW",tool="up_read",mode="enforce"} 2"#,
        r#"aip_sidecar_decisions_total{decision="BLOCK",tool="other",mode="enforce"} 1"#,
        r#"aip_sidecar_upstream_failures_total{connection="up",class="network"} 1"#,
        r#"aip_sidecar_upstream_call_seconds_count{connection="up"} 2"#,
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
    assert!(
        !text.contains("made_up_tool_name"),
        "agent input never becomes a label"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_credentials_never_reach_the_upstream_only_the_connections() {
    use sha2::{Digest, Sha256};
    let faults = "  tools:\n    - name: read\n      responses: [{sequence: [{return: ok}]}]\n";
    let tmp = common::scratch("aip-gw-token-");
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "connection-token\n").unwrap();
    let connection = format!(
        "  bearerToken:\n    valueFrom: {{file: {}}}\n",
        token_file.display()
    );
    let s = Stack::start(Setup {
        faults,
        policy: "  allowed_tools: [up_read]\n",
        connection: &connection,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "up_read", "arguments": {}}});
    let r = s
        .post(
            &[
                ("mcp-session-id", &session),
                ("authorization", "Bearer agent-secret"),
                ("cookie", "sid=agent-cookie"),
            ],
            &body.to_string(),
        )
        .await;
    assert_eq!(r.json()["result"]["content"][0]["text"], "ok");
    let sent = &s.attempts()[0]["auth_sha256"];
    assert_eq!(
        *sent,
        json!(hex::encode(Sha256::digest(b"Bearer connection-token"))),
        "the connection's own credential was sent"
    );
    assert_ne!(
        *sent,
        json!(hex::encode(Sha256::digest(b"Bearer agent-secret")))
    );
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    for secret in ["agent-secret", "agent-cookie", "connection-token"] {
        assert!(!audit.contains(secret), "{secret} reached the audit log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_connections_ends_the_upstream_session_with_delete() {
    session_ended_by(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_connection_ends_its_old_session() {
    session_ended_by(true).await;
}

/// The upstream session of the stack's connection ends with DELETE when the
/// gateway closes its connections, or when a reload replaces it.
async fn session_ended_by(reload: bool) {
    // A legacy server: a modern one has no session to end.
    let faults = format!("  era: legacy\n{TOOLS}");
    let s = Stack::start(Setup {
        faults: &faults,
        policy: POLICY,
        ..Setup::default()
    })
    .await;
    let connection = s.gateway.connections()[0].clone();
    let Upstream::Http(upstream) = &connection.upstream else {
        panic!("an HTTP connection")
    };
    let id = upstream.session().await.unwrap().id.unwrap();
    let fault: std::net::SocketAddr = s.fault_url
        ["http://".len()..s.fault_url.len() - "/mcp".len()]
        .parse()
        .unwrap();
    let ping = || async {
        let headers = [
            ("mcp-session-id", id.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        raw(
            fault,
            "POST",
            &headers,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        )
        .await
        .status
    };
    assert_eq!(ping().await, 200, "the session is live upstream");
    if reload {
        let mut retired = s.gateway.retired();
        s.reload(
            &s.config_text
                .replace("timeoutSeconds: 1", "timeoutSeconds: 2"),
        )
        .await;
        tokio::time::timeout(PATIENCE, retired.changed())
            .await
            .unwrap()
            .unwrap();
    } else {
        s.gateway.close_connections().await;
    }
    assert_eq!(ping().await, 404, "the upstream ended it on DELETE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_collide_after_normalization_are_hidden_refused_and_reported() {
    let s = Stack::start(Setup {
        faults: "  tools:
    - {name: get_item, responses: [{sequence: [{return: lower}]}]}
    - {name: GET_ITEM, responses: [{sequence: [{return: upper}]}]}
    - {name: Ok, responses: [{sequence: [{return: fine}]}]}
",
        policy: "  allowed_tools: [up_get_item, up_ok]\n",
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let names: Vec<&Value> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["name"])
        .collect();
    assert_eq!(
        names,
        vec![&json!("up_Ok")],
        "byte-identical, collisions hidden"
    );
    for tool in ["up_get_item", "up_GET_ITEM"] {
        let r = s.call(&session, json!(2), tool, json!({})).await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
    }
    assert!(s.attempts().is_empty(), "nothing reached the upstream");
    let fine = s.call(&session, json!(3), "up_Ok", json!({})).await;
    assert_eq!(fine["result"]["content"][0]["text"], "fine");
    let mut reported = s.gateway.colliding_tools();
    reported.sort();
    assert_eq!(
        reported,
        [
            ("up".to_owned(), "up_GET_ITEM".to_owned()),
            ("up".to_owned(), "up_get_item".to_owned())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_the_new_policy_blocks_is_withdrawn_and_answered_as_withdrawn() {
    let s = std::sync::Arc::new(stack().await);
    let session = s.session().await;
    let mut changes = s.gateway.approvals.subscribe();
    let (s2, session2) = (s.clone(), session.clone());
    let asking = tokio::spawn(async move {
        s2.call(
            &session2,
            json!("held"),
            "up_deploy",
            json!({"env": "prod"}),
        )
        .await
    });
    while s.gateway.approvals.list().is_empty() {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    let blocking = s.config_text.replace(
        "{tool: up_deploy, action: ask}",
        "{tool: up_deploy, action: block}",
    );
    s.reload(&blocking).await;
    let r = tokio::time::timeout(PATIENCE, asking)
        .await
        .unwrap()
        .unwrap();
    // Not a person's denial, and not the new rule's refusal either: the
    // ask was withdrawn because the policy changed.
    assert_eq!(r["error"]["code"], -32015, "{r}");
    assert_eq!(r["error"]["message"], "Approval withdrawn", "{r}");
    assert_eq!(r["error"]["data"]["cause"], "PolicyChanged", "{r}");
    assert!(
        s.gateway.approvals.list().is_empty(),
        "the ask was withdrawn"
    );
    assert!(
        s.attempts().iter().all(|a| a["tool"] != "deploy"),
        "never forwarded"
    );
    let line = s
        .audit_lines()
        .into_iter()
        .find(|l| l["tool"] == "up_deploy")
        .unwrap();
    assert_eq!(
        (line["decision"].as_str(), line["cause"].as_str()),
        (Some("APPROVAL_WITHDRAWN"), Some("PolicyChanged")),
        "{line}"
    );
}

/// Waits until some ask is pending at the stack's gateway.
async fn until_held(s: &Stack) {
    let mut changes = s.gateway.approvals.subscribe();
    while s.gateway.approvals.list().is_empty() {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
}

/// A gateway told to stop answers a held call at once with -32016, named
/// for what happened (no drain can help an ask), and audits it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_answered_at_once_when_the_gateway_stops() {
    let s = std::sync::Arc::new(stack().await);
    let session = s.session().await;
    let (s2, session2) = (s.clone(), session.clone());
    let asking = tokio::spawn(async move {
        s2.call(
            &session2,
            json!("held"),
            "up_deploy",
            json!({"env": "prod"}),
        )
        .await
    });
    until_held(&s).await;
    let stopped = std::time::Instant::now();
    s.stop();
    let r = tokio::time::timeout(PATIENCE, asking)
        .await
        .unwrap()
        .unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "answered {:?} after the stop",
        stopped.elapsed()
    );
    assert_eq!(r["error"]["code"], -32016, "{r}");
    assert_eq!(r["error"]["message"], "Gateway shutting down", "{r}");
    assert_eq!(r["error"]["data"]["cause"], "GatewayShutdown", "{r}");
    let line = s
        .audit_lines()
        .into_iter()
        .find(|l| l["tool"] == "up_deploy")
        .unwrap();
    assert_eq!(line["decision"], "GATEWAY_SHUTDOWN", "{line}");
    assert!(s.attempts().iter().all(|a| a["tool"] != "deploy"));
}

/// A held call the agent cancels gets no answer (it asked for none), yet
/// its end is audited and counted as the agent's cancellation, never as a
/// person's denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_held_call_is_audited_as_cancelled() {
    let s = std::sync::Arc::new(stack().await);
    let session = s.session().await;
    let (s2, session2) = (s.clone(), session.clone());
    let asking = tokio::spawn(async move {
        s2.call(&session2, json!(41), "up_deploy", json!({"env": "prod"}))
            .await
    });
    until_held(&s).await;
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41}});
    let r = s
        .post(&[("mcp-session-id", &session)], &cancel.to_string())
        .await;
    assert_eq!(r.status, 202);
    // The audit file has no event to wait on: it is read until the line is
    // there, for at most PATIENCE.
    let deadline = std::time::Instant::now() + PATIENCE;
    let line = loop {
        let found = s
            .audit_lines()
            .into_iter()
            .find(|l| l["tool"] == "up_deploy");
        if let Some(line) = found {
            break line;
        }
        assert!(std::time::Instant::now() < deadline, "no audit line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (line["decision"].as_str(), line["cause"].as_str()),
        (Some("APPROVAL_WITHDRAWN"), Some("Cancelled")),
        "{line}"
    );
    assert!(s.gateway.approvals.list().is_empty());
    let metrics = s.gateway.metrics.encode();
    assert!(
        metrics.contains("decision=\"APPROVAL_WITHDRAWN\""),
        "{metrics}"
    );
    asking.abort();
}

/// Go's `encoding/json` reads `Arguments` as `arguments`: a call whose
/// protected path hides behind a case variant would reach such a server
/// with its arguments while the policy saw none. Refused, never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_variant_keys_are_refused_before_the_policy() {
    let s = stack().await;
    let session = s.session().await;
    for (body, key) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"up_read","Arguments":{"path":"/etc/shadow"}}}"#,
            "Arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"up_read","ARGUMENTS":{"path":"/etc/shadow"}}}"#,
            "ARGUMENTS",
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"up_read","argumentſ":{"path":"/etc/shadow"}}}"#,
            "argumentſ",
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"Name":"up_read","arguments":{"path":"/etc/shadow"}}}"#,
            "Name",
        ),
    ] {
        let r = s.post(&[("mcp-session-id", &session)], body).await.json();
        assert_eq!(r["error"]["code"], -32602, "{body}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("{key:?}")), "{message}");
    }
    assert_eq!(
        s.attempts(),
        Vec::<Value>::new(),
        "nothing reached the server"
    );
    let refusals = s
        .audit_lines()
        .into_iter()
        .filter(|l| l.to_string().contains("reads as"))
        .count();
    assert_eq!(refusals, 4, "each refusal is audited");
}

/// A gateway allowing `policy`'s tools of a scripted server that `answer`s,
/// reached with the bearer `token` (read from a file of its own, in the
/// directory returned, which is removed when it drops).
async fn with_bearer(
    token: &str,
    policy: &str,
    answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static,
) -> (
    Stack,
    tokio_util::sync::CancellationToken,
    tempfile::TempDir,
) {
    let tmp = common::scratch("aip-bearer-");
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let url = common::scripted_server(answer, shutdown.clone()).await;
    let s = Stack::start(Setup {
        policy,
        url: Some(url),
        connection: &format!(
            "  bearerToken:\n    valueFrom: {{file: {}}}\n",
            token_file.display()
        ),
        ..Setup::default()
    })
    .await;
    (s, shutdown, tmp)
}

/// The same server echoing the token in what it streams during a call: a
/// log message and a progress notification reach the agent redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_echoed_in_notifications_during_a_call_never_reach_the_agent() {
    use base64::Engine;
    let token = "tok-n0t1f-ref1ected-4a2";
    let b64 = base64::engine::general_purpose::STANDARD.encode(token);
    let (echo, echo_b64) = (token.to_owned(), b64.clone());
    let (s, shutdown, _tmp) = with_bearer(token, "  allowed_tools: [up_echo]\n", move |m| {
        match m["method"].as_str() {
            Some("initialize") => (
                200,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "logging": {}},
                    "serverInfo": {"name": "s", "version": "1"}}),
            ),
            Some("tools/list") => (
                200,
                json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}),
            ),
            Some("tools/call") => (
                200,
                json!({"__sse": [
                    {"jsonrpc": "2.0", "method": "notifications/message", "params": {
                        "level": "debug", "data": {"sent": format!("Authorization: Bearer {echo}")}}},
                    {"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                        "progressToken": m["params"]["_meta"]["progressToken"], "progress": 1,
                        "message": format!("authenticated as {echo_b64}")}},
                ], "__result": {"content": [{"type": "text", "text": "done"}]}}),
            ),
            _ => (200, json!({})),
        }
    })
    .await;
    let session = s.session().await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "up_echo", "arguments": {}, "_meta": {"progressToken": "agent-tok"}}});
    let mut stream = s.stream(&session, &call).await;
    let mut notes = Vec::new();
    let response = loop {
        let message = stream.next().await.unwrap();
        if message.get("method").is_none() {
            break message;
        }
        notes.push(message);
    };
    assert_eq!(
        response["result"]["content"][0]["text"], "done",
        "{response}"
    );
    let methods: Vec<&str> = notes.iter().filter_map(|n| n["method"].as_str()).collect();
    assert_eq!(
        methods,
        ["notifications/message", "notifications/progress"],
        "{notes:?}"
    );
    assert_eq!(notes[1]["params"]["progressToken"], "agent-tok");
    for note in &notes {
        let shown = note.to_string();
        assert!(!shown.contains(token) && !shown.contains(&b64), "{shown}");
        assert!(shown.contains("[REDACTED:credential]"), "{shown}");
    }
    shutdown.cancel();
}

/// A server that echoes the connection's own bearer token (raw, base64,
/// percent-encoded) in results, errors and descriptions never hands it to
/// the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_echoing_the_connections_credentials_never_reaches_the_agent() {
    use base64::Engine;
    let token = "tok-3c4o-ref1ected-9f7";
    let b64 = base64::engine::general_purpose::STANDARD.encode(token);
    let (echo, echo_b64) = (token.to_owned(), b64.clone());
    let policy = "  allowed_tools: [up_echo, up_fail]\n";
    let (s, shutdown, _tmp) = with_bearer(token, policy, move |m| {
        match m["method"].as_str() {
            Some("initialize") => (
                200,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "s", "version": "1"}}),
            ),
            Some("tools/list") => (
                200,
                json!({"tools": [{"name": "echo", "description": format!("called with Bearer {echo}"),
                    "inputSchema": {"type": "object"}},
                    {"name": "fail", "inputSchema": {"type": "object"}}]}),
            ),
            Some("tools/call") if m["params"]["name"] == "fail" => (
                200,
                json!({"__error": {"code": -32000, "message": format!("rejected token {echo}"),
                    "data": {"authorization": format!("Bearer {echo_b64}")}}}),
            ),
            Some("tools/call") => (
                200,
                json!({"content": [{"type": "text", "text": format!("you sent Authorization: Bearer {echo}")}],
                    "structuredContent": {"seen": echo_b64, "url": format!("https://x/?t={}", echo.replace('-', "%2D"))}}),
            ),
            _ => (200, json!({})),
        }
    })
    .await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let reply = s.call(&session, json!(2), "up_echo", json!({})).await;
    // An error the server sends echoing it, in its message and its data.
    let failed = s.call(&session, json!(3), "up_fail", json!({})).await;
    assert!(failed.get("error").is_some(), "{failed}");
    for shown in [list.to_string(), reply.to_string(), failed.to_string()] {
        assert!(!shown.contains(token) && !shown.contains(&b64), "{shown}");
        assert!(shown.contains("[REDACTED:credential]"), "{shown}");
    }
    assert!(
        !reply["result"]["structuredContent"]["url"]
            .to_string()
            .contains("3c4o")
    );
    shutdown.cancel();
}

/// What reaches a server is what MCP defines: a key a method's params do
/// not have (`args` beside `arguments`, which a lenient server might read
/// and the policy never did) is dropped, `_meta` kept; and a
/// `notifications/...` carrying an id is refused -32600, never forwarded as
/// the request it looks like to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_mcp_defines_reaches_the_server() {
    let (s, received, shutdown) = echo_stack().await;
    let seen = || -> Vec<Value> {
        let received = received.lock().unwrap();
        // A body that is not JSON (a GET's, none) is no message.
        received
            .iter()
            .filter_map(|b| serde_json::from_str(b).ok())
            .collect()
    };
    let session = s.session().await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "up_echo", "arguments": {"path": "/tmp/x"}, "_meta": {"progressToken": "p"},
        "args": {"path": "/etc/shadow"}, "input": "x"}});
    let r = s
        .post(&[("mcp-session-id", &session)], &call.to_string())
        .await;
    assert_eq!(r.json()["result"]["content"][0]["text"], "ok", "{r:?}");
    let forwarded = seen()
        .into_iter()
        .find(|m| m["method"] == "tools/call")
        .unwrap();
    let mut keys: Vec<&String> = forwarded["params"].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["_meta", "arguments", "name"], "{forwarded}");

    for note in [
        json!({"jsonrpc": "2.0", "id": 9, "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 10, "method": "notifications/cancelled", "params": {"requestId": 3}}),
    ] {
        let r = s
            .post(&[("mcp-session-id", &session)], &note.to_string())
            .await;
        assert_eq!(r.json()["error"]["code"], -32600, "{r:?}");
        assert_eq!(r.json()["id"], note["id"], "{r:?}");
    }
    // (The gateway's own notifications/initialized, of its handshake with
    // the server, is not one of them.)
    let notes = seen()
        .iter()
        .filter(|m| {
            m["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("notifications/"))
                && (m.get("id").is_some() || m["method"] == "notifications/cancelled")
        })
        .count();
    assert_eq!(notes, 0, "nothing of either reached the server");
    shutdown.cancel();
}

/// The gateway allowing `up_echo` of a server that answers every call
/// with `ok`, the bodies the server received (each as it came), and what
/// stops the server.
async fn echo_stack() -> (
    Stack,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio_util::sync::CancellationToken,
) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (url, received) = common::recording_server(
        |m| match m["method"].as_str() {
            Some("tools/call") => (200, json!({"content": [{"type": "text", "text": "ok"}]})),
            _ => common::echo_handshake(m).unwrap_or((200, json!({}))),
        },
        shutdown.clone(),
    )
    .await;
    let s = Stack::start(Setup {
        url: Some(url),
        policy: "  allowed_tools: [up_echo]\n",
        ..Setup::default()
    })
    .await;
    (s, received, shutdown)
}

/// A call nothing must change in reaches the server as the agent wrote it
/// (spacing, key order, escapes, number spellings), with only its id and
/// the tool's name the gateway's; a call the gateway must change more (an
/// undefined params key dropped) is written anew without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nothing_changes_in_reaches_the_server_as_the_agent_wrote_it() {
    let (s, received, shutdown) = echo_stack().await;
    let session = s.session().await;
    let sent = |body: &str| {
        let received = received.lock().unwrap();
        let call = received
            .iter()
            .rev()
            .find(|b| b.contains("tools/call"))
            .cloned();
        let call = call.unwrap_or_else(|| panic!("no call reached the server for {body}"));
        let id = serde_json::from_str::<Value>(&call).unwrap()["id"].clone();
        (call, id)
    };

    let body = "{ \"params\" : {\"arguments\": {\"b\": \"caf\\u00e9 \\/\", \"a\": 1.50e1},\n \"name\": \"up_echo\"},\n  \"method\":\"tools/call\", \"id\": 9, \"jsonrpc\": \"2.0\" }";
    let r = s.post(&[("mcp-session-id", &session)], body).await;
    assert_eq!(r.json()["result"]["content"][0]["text"], "ok", "{r:?}");
    let (call, id) = sent(body);
    assert!(
        id.is_string() && id != json!(9),
        "the gateway's own id: {call}"
    );
    let expected = body
        .replace("\"up_echo\"", "\"echo\"")
        .replace("\"id\": 9", &format!("\"id\": {id}"));
    assert_eq!(call, expected, "the agent's bytes, id and name spliced");

    // `args` is not a params key of tools/call: dropped, so the text is
    // written from what the gateway decided on.
    let body = r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"up_echo","arguments":{"b":"caf\u00e9"},"args":{"x":1}}}"#;
    let r = s.post(&[("mcp-session-id", &session)], body).await;
    assert_eq!(r.json()["result"]["content"][0]["text"], "ok", "{r:?}");
    let (call, _) = sent(body);
    assert!(!call.contains("args"), "{call}");
    assert!(call.contains("\"café\""), "written anew: {call}");
    shutdown.cancel();
}

/// A server's result that nothing must change in reaches the agent as the
/// server wrote it (its spacing, key order, number spellings) under the
/// agent's id; one with a finding is redacted and written anew; a client
/// that accepts only SSE gets the text on one `data:` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_nothing_changes_in_is_passed_on_as_the_server_wrote_it() {
    const RESULT: &str = r#"{"content" : [ {"type":"text", "text":"§TEXT§"} ],
  "isError":false, "n": 1.50e1 }"#;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let url = common::scripted_server(
        move |m| match m["method"].as_str() {
            Some("tools/call") => {
                let text = m["params"]["arguments"]["text"]
                    .as_str()
                    .unwrap_or_default();
                let result = RESULT.replace("§TEXT§", text);
                let raw = format!(
                    "{{\n  \"result\": {result},\n  \"jsonrpc\":\"2.0\", \"id\" : {{id}} }}"
                );
                (200, json!({ "__raw": raw }))
            }
            _ => common::echo_handshake(m).unwrap_or((200, json!({}))),
        },
        shutdown.clone(),
    )
    .await;
    let s = Stack::start(Setup {
        url: Some(url),
        policy: "  allowed_tools: [up_echo]\n  dlp:\n    patterns:\n      - {name: Email, regex: '[a-z]+@[a-z]+\\.[a-z]{2,}'}\n",
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let call = |id: u64, text: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "up_echo", "arguments": {"text": text}}})
        .to_string()
    };
    let r = s
        .post(&[("mcp-session-id", &session)], &call(7, "plain"))
        .await;
    let expected = format!(
        "{{\n  \"result\": {},\n  \"jsonrpc\":\"2.0\", \"id\" : 7 }}",
        RESULT.replace("§TEXT§", "plain")
    );
    assert_eq!(r.body, expected, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));

    let r = s
        .post(
            &[("mcp-session-id", &session)],
            &call(8, "mail bob@example.com"),
        )
        .await;
    let v = r.json();
    assert_eq!(v["id"], 8);
    assert_eq!(
        v["result"]["content"][0]["text"], "mail [REDACTED:Email]",
        "{r:?}"
    );
    assert!(!r.body.contains("bob@example.com"));

    let r = s
        .post(
            &[
                ("mcp-session-id", &session),
                ("accept", "text/event-stream"),
            ],
            &call(9, "plain"),
        )
        .await;
    let data = r
        .body
        .strip_prefix("data: ")
        .unwrap()
        .strip_suffix("\n\n")
        .unwrap();
    assert!(!data.contains('\n'), "{r:?}");
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["id"], 9);
    assert_eq!(v["result"]["n"], 15.0);
    shutdown.cancel();
}

/// The same server echoing the token spelled the ways a reflected value
/// gets mangled on its way — percent-encoded in lower case, in hex, in
/// upper case, inside a longer base64 text, JSON-escaped in a text, and cut
/// in two across the result's two text items — reaches the agent with none
/// of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_echoed_in_any_spelling_or_cut_in_two_never_reaches_the_agent() {
    use base64::Engine;
    let token = "tok/9x2-mang1ed+sp3lling";
    let token_for_server = token.to_owned();
    let (s, shutdown, _tmp) = with_bearer(token, "  allowed_tools: [up_echo]\n", move |m| {
        let token = token_for_server.as_str();
        match m["method"].as_str() {
            Some("initialize") => (
                200,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "s", "version": "1"}}),
            ),
            Some("tools/list") => (
                200,
                json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}),
            ),
            Some("tools/call") => {
                let percent = percent_encoding::utf8_percent_encode(
                    token,
                    percent_encoding::NON_ALPHANUMERIC,
                )
                .to_string()
                .to_lowercase();
                let hex: String = token.bytes().map(|b| format!("{b:02X}")).collect();
                let embedded = base64::engine::general_purpose::STANDARD
                    .encode(format!("{{\"user\":\"ops\",\"token\":\"{token}\"}}"));
                let (head, tail) = token.split_at(11);
                (
                    200,
                    json!({"content": [
                    {"type": "text", "text": format!("first half {head}")},
                    {"type": "text", "text": format!("{tail} second half")}],
                    "structuredContent": {
                        "url": format!("https://x/?t={percent}"),
                        "hex": hex,
                        "shout": token.to_uppercase(),
                        "blob": embedded,
                        "json": format!("{{\"t\":\"{}\"}}", token.replace('/', "\\/")),
                    }}),
                )
            }
            _ => (200, json!({})),
        }
    })
    .await;
    let session = s.session().await;
    let reply = s.call(&session, json!(2), "up_echo", json!({})).await;
    let result = &reply["result"];
    assert_eq!(
        result["content"][0]["text"], "first half [REDACTED:credential]",
        "{reply}"
    );
    assert_eq!(
        result["content"][1]["text"], "[REDACTED:credential] second half",
        "{reply}"
    );
    let shown = &result["structuredContent"];
    for field in ["url", "hex", "shout", "blob", "json"] {
        let text = shown[field].as_str().unwrap();
        assert!(text.contains("[REDACTED:credential]"), "{field}: {text}");
    }
    let text = reply.to_string();
    for piece in ["9x2", "mang1ed", "sp3lling", "9X2", "SP3LLING"] {
        assert!(!text.contains(piece), "{piece} in {text}");
    }
    shutdown.cancel();
}

/// An approver elsewhere that never decides and records, when the gateway
/// drops its wait, the reason it was given.
struct Recording {
    asked: tokio::sync::Notify,
    dropped: std::sync::Mutex<Vec<Option<aip_policy::Withdrawal>>>,
}

struct Records(std::sync::Arc<Recording>, aip_sidecar::approvals::Ended);

impl Drop for Records {
    fn drop(&mut self) {
        self.0.dropped.lock().unwrap().push(self.1.get().copied());
    }
}

struct Remote(std::sync::Arc<Recording>);

impl aip_sidecar::approvals::Remote for Remote {
    fn ask(
        &self,
        ask: aip_sidecar::approvals::Ask,
        _: Duration,
    ) -> aip_sidecar::approvals::BoxFuture<'_, aip_sidecar::approvals::Answer> {
        let records = Records(self.0.clone(), ask.ended.clone());
        self.0.asked.notify_one();
        Box::pin(async move {
            let _records = records;
            std::future::pending().await
        })
    }
}

/// The reason a dropped wait carries to the operator is the one that
/// ended it: the gateway stopping, the policy changing, the agent
/// cancelling (not the default for a closed connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_carries_the_reason_that_ended_it() {
    use aip_policy::Withdrawal;
    for (cause, expected) in [
        ("stop", Withdrawal::GatewayShutdown),
        ("policy", Withdrawal::PolicyChanged),
        ("cancel", Withdrawal::Cancelled),
    ] {
        let s = std::sync::Arc::new(stack().await);
        let recording = std::sync::Arc::new(Recording {
            asked: tokio::sync::Notify::new(),
            dropped: std::sync::Mutex::new(Vec::new()),
        });
        s.gateway
            .approvals
            .route_to(std::sync::Arc::new(Remote(recording.clone())));
        let session = s.session().await;
        let (s2, session2) = (s.clone(), session.clone());
        let asking = tokio::spawn(async move {
            s2.call(&session2, json!(5), "up_deploy", json!({"env": "prod"}))
                .await
        });
        tokio::time::timeout(PATIENCE, recording.asked.notified())
            .await
            .unwrap();
        match cause {
            "stop" => s.stop(),
            "policy" => {
                let blocking = s.config_text.replace(
                    "{tool: up_deploy, action: ask}",
                    "{tool: up_deploy, action: block}",
                );
                s.reload(&blocking).await;
            }
            _ => {
                let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}});
                s.post(&[("mcp-session-id", &session)], &cancel.to_string())
                    .await;
            }
        }
        let deadline = std::time::Instant::now() + PATIENCE;
        while recording.dropped.lock().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{cause}: never dropped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            recording.dropped.lock().unwrap()[0],
            Some(expected),
            "{cause}"
        );
        asking.abort();
    }
}

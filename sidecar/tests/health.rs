//! The connection-health rules through the whole gateway: a failure belongs
//! to the call that saw it. Each row of the failure table, a sibling tool
//! that keeps working, credential evidence that hides the connection's tools,
//! a 403 that gates one tool only, and never more than one upstream
//! tools/call per agent call.

#![allow(clippy::unwrap_used)]

mod common;

use aip_sidecar::upstream::health::HealthState;
use common::{Setup, Stack};
use serde_json::{Value, json};

const POLICY: &str = "  allowed_tools: [up_flaky, up_sibling]\n";

fn faults(flaky_step: &str) -> String {
    format!(
        "  tools:
    - name: flaky
      responses: [{{sequence: [{flaky_step}, {{return: recovered}}]}}]
    - name: sibling
      responses: [{{sequence: [{{return: s1}}, {{return: s2}}, {{return: s3}}]}}]
"
    )
}

async fn row(step: &str, reason: &str, http_status: Option<u16>) -> Stack {
    let s = Stack::start(Setup {
        faults: &faults(step),
        policy: POLICY,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let failed = s.call(&session, json!(1), "up_flaky", json!({})).await;
    let error = &failed["error"];
    assert_eq!(error["data"]["reason"], reason, "{step}: {failed}");
    assert_eq!(error["data"]["connection"], "up");
    assert_eq!(error["data"]["tool"], "up_flaky");
    assert_eq!(
        error["data"].get("http_status").and_then(Value::as_u64),
        http_status.map(u64::from),
        "{step}"
    );
    assert!(
        !failed.to_string().to_lowercase().contains("session"),
        "no dead-session wording: {failed}"
    );
    // The sibling tool keeps working, and so does the flaky one.
    assert_eq!(
        s.call(&session, json!(2), "up_sibling", json!({})).await["result"]["content"][0]["text"],
        "s1",
        "{step}"
    );
    assert_eq!(
        s.call(&session, json!(3), "up_flaky", json!({})).await["result"]["content"][0]["text"],
        "recovered",
        "{step}"
    );
    let listed = s.request(&session, json!(4), "tools/list").await["result"]["tools"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(listed, 2, "{step}: nothing hidden");
    let flaky_attempts = s.attempts().iter().filter(|a| a["tool"] == "flaky").count();
    assert_eq!(
        flaky_attempts, 2,
        "{step}: one upstream call per agent call, never a replay"
    );
    assert_eq!(
        s.gateway.connections()[0].health().state,
        HealthState::Healthy,
        "{step}"
    );
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_drop() {
    row("{drop: true}", "upstream_unreachable", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_before_headers() {
    row("{return: late, delay_ms: 300000}", "upstream_timeout", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_during_the_body() {
    row("{stall_body: {after_bytes: 7}}", "upstream_timeout", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_503_and_other_statuses() {
    row("{http: {status: 503}}", "upstream_http_error", Some(503)).await;
    row("{http: {status: 404}}", "upstream_http_error", Some(404)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_and_oversized() {
    row(
        "{raw_body: '{\"jsonrpc\": \"2.0\", '}",
        "upstream_malformed",
        None,
    )
    .await;
    row("{oversize: {bytes: 10000}}", "upstream_too_large", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonrpc_error_and_a_tool_error_pass_through() {
    let s = Stack::start(Setup {
        faults: &faults("{jsonrpc_error: {code: -32042, message: scripted}}, {error: tool broke}"),
        policy: POLICY,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    assert_eq!(
        s.call(&session, json!(1), "up_flaky", json!({})).await["error"],
        json!({"code": -32042, "message": "scripted"})
    );
    assert_eq!(
        s.call(&session, json!(2), "up_flaky", json!({})).await["result"]["isError"],
        true
    );
    assert_eq!(
        s.gateway.connections()[0].health().state,
        HealthState::Healthy
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_gates_that_tool_only() {
    let challenge = r#"{http: {status: 403, headers: {WWW-Authenticate: 'Bearer error="insufficient_scope", scope="flaky:write"'}}}"#;
    let s = Stack::start(Setup {
        faults: &faults(challenge),
        policy: POLICY,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let denied = s.call(&session, json!(1), "up_flaky", json!({})).await;
    assert_eq!(denied["error"]["data"]["reason"], "upstream_forbidden");
    assert_eq!(denied["error"]["data"]["required_scope"], "flaky:write");
    // The gated tool is hidden and refused without another upstream call...
    let again = s.call(&session, json!(2), "up_flaky", json!({})).await;
    assert_eq!(again["error"]["data"]["reason"], "upstream_forbidden");
    let names: Vec<Value> = s.request(&session, json!(3), "tools/list").await["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("up_sibling")]);
    assert_eq!(
        s.attempts().iter().filter(|a| a["tool"] == "flaky").count(),
        1
    );
    // ...and the sibling keeps working on a connection that stays healthy.
    assert_eq!(
        s.call(&session, json!(4), "up_sibling", json!({})).await["result"]["content"][0]["text"],
        "s1"
    );
    assert_eq!(
        s.gateway.connections()[0].health().state,
        HealthState::Healthy
    );
    assert_eq!(
        s.gateway.connections()[0].gates()["flaky"]
            .required_scope
            .as_deref(),
        Some("flaky:write")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_on_a_call_is_credential_evidence() {
    let s = Stack::start(Setup {
        faults: &faults("{http: {status: 401}}"),
        policy: POLICY,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let r = s.call(&session, json!(1), "up_flaky", json!({})).await;
    assert_eq!(r["error"]["data"]["reason"], "upstream_auth_failed");
    assert_eq!(
        s.gateway.connections()[0].health().state,
        HealthState::NeedsCredentials
    );
    // Every tool of the connection is hidden and refused, nothing more is sent.
    assert_eq!(
        s.request(&session, json!(2), "tools/list").await["result"]["tools"],
        json!([])
    );
    let sibling = s.call(&session, json!(3), "up_sibling", json!({})).await;
    assert_eq!(sibling["error"]["data"]["reason"], "upstream_auth_failed");
    assert_eq!(s.attempts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_at_initialize_lists_nothing_and_sends_no_call() {
    let digest = "0".repeat(64);
    let faults = format!(
        "  requireBearer: {{sha256: \"{digest}\"}}\n{}",
        faults("{return: never}")
    );
    let s = Stack::start(Setup {
        faults: &faults,
        policy: POLICY,
        connection: "  bearerToken:\n    valueFrom: {env: HOME}\n",
        expect: HealthState::NeedsCredentials,
        ..Setup::default()
    })
    .await;
    let health = s.gateway.connections()[0].health();
    assert_eq!(
        (health.reason.as_deref(), health.http_status),
        (Some("upstream_auth_failed"), Some(401))
    );
    let session = s.session().await;
    assert_eq!(
        s.request(&session, json!(1), "tools/list").await["result"]["tools"],
        json!([])
    );
    assert!(s.attempts().is_empty());
}

/// A credential that cannot even list the tools is as bad as one refused at
/// initialize: NeedsCredentials with the status, never Unreachable (and then
/// Healthy again with the same credential), and no call is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_or_403_to_the_health_checks_tools_list_is_credential_evidence() {
    for status in [401u16, 403] {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let url = common::scripted_server(
            move |m| match m["method"].as_str() {
                Some("initialize") => (
                    200,
                    json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "s", "version": "1"}}),
                ),
                Some("tools/list") => (status, Value::Null),
                _ => (200, json!({})),
            },
            shutdown.clone(),
        )
        .await;
        let s = Stack::start(Setup {
            policy: POLICY,
            url: Some(url),
            expect: HealthState::NeedsCredentials,
            ..Setup::default()
        })
        .await;
        let connection = s.gateway.connections()[0].clone();
        let health = connection.health();
        assert_eq!(
            (health.reason.as_deref(), health.http_status),
            (Some("upstream_auth_failed"), Some(status)),
            "{status}"
        );
        // Another check with the same credential changes nothing.
        connection.check().await;
        assert_eq!(connection.health().state, HealthState::NeedsCredentials);
        shutdown.cancel();
    }
}

/// A result that is not a CallToolResult is the call's failure
/// (upstream_malformed), never a success with whatever it held, and the
/// connection stays healthy. DLP reads every string of what is relayed,
/// whatever field it sits in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tool_results_fail_their_call_and_nothing_unscanned_is_relayed() {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let url = common::scripted_server(
        |m| match (m["method"].as_str(), m["params"]["name"].as_str()) {
            (Some("initialize"), _) => (
                200,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "s", "version": "1"}}),
            ),
            (Some("tools/list"), _) => {
                let tools: Vec<Value> =
                    ["object", "untyped", "number", "structured", "flag", "meta"]
                        .iter()
                        .map(|n| json!({"name": n, "inputSchema": {"type": "object"}}))
                        .collect();
                (200, json!({ "tools": tools }))
            }
            (Some("tools/call"), Some(name)) => (
                200,
                match name {
                    "object" => json!({"content": {"type": "text", "text": "ops@acme.io"}}),
                    "untyped" => json!({"content": [{"text": "ops@acme.io"}]}),
                    "number" => json!({"content": [{"type": "text", "text": 7}]}),
                    "structured" => json!({"content": [], "structuredContent": ["ops@acme.io"]}),
                    "flag" => json!({"content": [], "isError": "ops@acme.io"}),
                    _ => json!({"content": [{"type": "text", "text": "ok",
                        "annotations": {"audience": ["ops@acme.io"]}}],
                        "_meta": {"owner": "ops@acme.io"}}),
                },
            ),
            _ => (200, json!({})),
        },
        shutdown.clone(),
    )
    .await;
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [up_object, up_untyped, up_number, up_structured, up_flag, up_meta]\n  dlp:\n    patterns: [{name: Email, regex: '[a-z]+@[a-z]+\\.io'}]\n",
        url: Some(url),
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    for tool in [
        "up_object",
        "up_untyped",
        "up_number",
        "up_structured",
        "up_flag",
    ] {
        let reply = s.call(&session, json!(tool), tool, json!({})).await;
        assert_eq!(
            reply["error"]["data"]["reason"], "upstream_malformed",
            "{tool}: {reply}"
        );
        assert!(!reply.to_string().contains("acme"), "{tool}: {reply}");
    }
    let reply = s.call(&session, json!("meta"), "up_meta", json!({})).await;
    assert_eq!(
        reply["result"]["_meta"]["owner"], "[REDACTED:Email]",
        "{reply}"
    );
    assert_eq!(
        reply["result"]["content"][0]["annotations"]["audience"][0],
        "[REDACTED:Email]"
    );
    assert_eq!(
        s.gateway.connections()[0].health().state,
        HealthState::Healthy,
        "a malformed result says nothing about the connection"
    );
    shutdown.cancel();
}

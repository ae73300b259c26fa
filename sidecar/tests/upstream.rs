//! The upstream HTTP client against the real fault server on loopback: every
//! row of the connection-health failure table, session reuse and discard, and
//! exactly one upstream tools/call per call (read from the attempt log).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use aip_fault_server::core::Core;
use aip_fault_server::http::{HttpOptions, serve};
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use aip_mcp::http::HttpUpstream;
use aip_mcp::{ConnectionEffect, Failure};
use aip_policy::CompileOptions;
use aip_sidecar::config::file;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Fault {
    core: Arc<Core>,
    url: String,
    shutdown: CancellationToken,
}

impl Drop for Fault {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Fault {
    /// A fault server of the legacy era only: these tests are of the
    /// session a 2025-11-25 server gives (a modern one has none).
    async fn start(tools: &str) -> Fault {
        let yaml = format!(
            "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: up}}\nspec:\n  era: legacy\n{tools}"
        );
        let core = Core::new(
            Script::from_yaml(&yaml, Transport::Http).unwrap(),
            AttemptLog::new(Box::new(std::io::sink()), false),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(core.clone().run(shutdown.clone()));
        tokio::spawn(serve(
            core.clone(),
            listener,
            HttpOptions::default(),
            shutdown.clone(),
        ));
        Fault {
            core,
            url,
            shutdown,
        }
    }

    fn attempts(&self) -> Vec<Value> {
        self.core
            .log
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn upstream(&self, extra: &str) -> HttpUpstream {
        let text = format!(
            "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: up}}\nspec:\n  url: {}\n  timeoutSeconds: 1\n  maxResponseBytes: 4096\n{extra}",
            self.url
        );
        let config = file::parse(&text, &CompileOptions::default()).unwrap();
        HttpUpstream::new(config.connections[0].clone()).unwrap()
    }
}

fn call(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "t", "arguments": {}}})
}

fn steps(steps: &str) -> String {
    format!("  tools:\n    - name: t\n      responses: [{{sequence: [{steps}]}}]\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_is_reused_across_calls() {
    let fault = Fault::start(&steps("{return: a}, {return: b}")).await;
    let up = fault.upstream("");
    for id in 1..=2 {
        let x = up.request(&call(id), None).await.unwrap();
        assert_eq!(x.response()["id"], id);
    }
    let sessions: Vec<Value> = fault
        .attempts()
        .iter()
        .map(|a| a["session"].clone())
        .collect();
    assert_eq!(sessions[0], sessions[1]);
    assert_eq!(fault.attempts()[0]["protocol_version"], "2025-11-25");
}

/// (script step, expected failure, session kept)
async fn failing(step: &str, expected: Failure, session_kept: bool) {
    let fault = Fault::start(&steps(&format!("{step}, {{return: after}}"))).await;
    let up = fault.upstream("");
    let failure = up.request(&call(1), None).await.unwrap_err();
    // Network and malformed failures carry the transport's own detail text.
    match expected {
        Failure::Network(_) | Failure::Malformed(_) => {
            assert_eq!(failure.class(), expected.class(), "{step}: {failure:?}")
        }
        _ => assert_eq!(failure, expected, "{step}"),
    }
    let ok = up.request(&call(2), None).await.unwrap();
    assert_eq!(
        ok.response()["result"]["content"][0]["text"],
        "after",
        "{step}: the next call works"
    );
    let attempts = fault.attempts();
    assert_eq!(
        attempts.len(),
        2,
        "{step}: exactly one upstream tools/call per call: {attempts:?}"
    );
    assert_eq!(attempts[0]["request_id"], 1);
    assert_eq!(
        attempts[0]["session"] == attempts[1]["session"],
        session_kept,
        "{step}: session rule"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_drop_discards_the_session() {
    failing("{drop: true}", Failure::Network(String::new()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_before_headers_and_during_the_body_discard_the_session() {
    failing("{return: late, delay_ms: 3000}", Failure::Timeout, false).await;
    failing("{stall_body: {after_bytes: 5}}", Failure::Timeout, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_malformed_and_oversized_keep_the_session() {
    failing("{http: {status: 503}}", Failure::HttpStatus(503), true).await;
    failing("{http: {status: 429}}", Failure::HttpStatus(429), true).await;
    failing(
        "{raw_body: 'not json'}",
        Failure::Malformed(String::new()),
        true,
    )
    .await;
    failing(
        "{oversize: {bytes: 5000}}",
        Failure::TooLarge { limit: 4096 },
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_gates_one_tool_and_unauthorized_needs_credentials() {
    let challenge = r#"{http: {status: 403, headers: {WWW-Authenticate: 'Bearer error="insufficient_scope", scope="items:write"'}}}"#;
    failing(
        challenge,
        Failure::Forbidden {
            scope: Some("items:write".into()),
        },
        true,
    )
    .await;
    assert_eq!(
        Failure::Forbidden {
            scope: Some("s".into())
        }
        .connection_effect(),
        ConnectionEffect::GateTool {
            scope: Some("s".into())
        }
    );
    failing("{http: {status: 401}}", Failure::AuthFailed, false).await;
    assert_eq!(
        Failure::AuthFailed.connection_effect(),
        ConnectionEffect::NeedsCredentials
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_and_jsonrpc_errors_are_answers_not_failures() {
    let fault = Fault::start(&steps(
        "{error: broke}, {jsonrpc_error: {code: -32042, message: nope}}",
    ))
    .await;
    let up = fault.upstream("");
    let a = up.request(&call(1), None).await.unwrap();
    assert_eq!(a.response()["result"]["isError"], true);
    let b = up.request(&call(2), None).await.unwrap();
    assert_eq!(b.response()["error"]["code"], -32042);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_closed_after_an_event_id_is_resumed_not_failed() {
    let fault = Fault::start(&steps("{sse_close_after_event: {retry_ms: 20}}")).await;
    let up = fault.upstream("");
    let x = up.request(&call(1), None).await.unwrap();
    assert_eq!(
        x.response()["result"]["structuredContent"],
        json!({"resumed": true})
    );
    assert_eq!(fault.attempts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_initialize_sends_no_tool_call() {
    let digest = "0".repeat(64);
    let fault = Fault::start(&format!(
        "  requireBearer: {{sha256: \"{digest}\"}}\n{}",
        steps("{return: never}")
    ))
    .await;
    let up =
        fault.upstream("  headers:\n    - name: Authorization\n      valueFrom: {env: HOME}\n");
    let failure = up.request(&call(1), None).await.unwrap_err();
    assert_eq!(failure, Failure::InitAuthFailed(401));
    assert_eq!(
        failure.connection_effect(),
        ConnectionEffect::NeedsCredentials
    );
    assert!(
        fault.attempts().is_empty(),
        "no tools/call reached the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_credentials_send_nothing() {
    let fault = Fault::start(&steps("{return: never}")).await;
    let up = fault.upstream("  bearerToken:\n    valueFrom: {env: AIP_SURELY_UNSET_VARIABLE}\n");
    let failure = up.request(&call(1), None).await.unwrap_err();
    assert!(
        matches!(failure, Failure::CredentialsMissing(_)),
        "{failure:?}"
    );
    assert_eq!(
        failure.connection_effect(),
        ConnectionEffect::NeedsCredentials
    );
    assert!(fault.attempts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_for_a_known_session_drops_it_without_resending() {
    let fault = Fault::start(&steps("{return: one}, {return: two}")).await;
    let up = fault.upstream("");
    up.request(&call(1), None).await.unwrap();
    // The server forgets the session (as after a restart or DELETE).
    let session = up.session().await.unwrap().id.unwrap();
    delete_session(&fault.url, &session).await;
    assert_eq!(
        up.request(&call(2), None).await.unwrap_err(),
        Failure::HttpStatus(404)
    );
    let x = up.request(&call(3), None).await.unwrap();
    assert_eq!(x.response()["result"]["content"][0]["text"], "two");
    assert_eq!(
        fault.attempts().len(),
        2,
        "the call that met the 404 was not resent"
    );
}

async fn delete_session(url: &str, session: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "DELETE /mcp HTTP/1.1\r\nhost: {addr}\r\nmcp-session-id: {session}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 204"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_is_cancelled_upstream() {
    let fault = Fault::start(&steps("{return: late, delay_ms: 300000}")).await;
    let up = fault.upstream("");
    assert_eq!(
        up.request(&call(1), None).await.unwrap_err(),
        Failure::Timeout
    );
    // The worker logs the cancellation as it stops: wait for it to go idle.
    let mut running = fault.core.running();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        running.wait_for(Option::is_none),
    )
    .await
    .unwrap()
    .unwrap();
    let attempts = fault.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        attempts[0]["outcome"], "canceled_running",
        "the upstream was told to stop"
    );
}

/// An upstream whose tools/list comes in two pages.
async fn paginating_upstream() -> String {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let m: Value = serde_json::from_slice(&body).unwrap();
                        let result = match (
                            m["method"].as_str(),
                            m.pointer("/params/cursor").and_then(Value::as_str),
                        ) {
                            (Some("initialize"), _) => {
                                json!({"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "p", "version": "1"}})
                            }
                            (Some("tools/list"), None) => {
                                json!({"tools": [{"name": "a", "inputSchema": {}}], "nextCursor": "page-2"})
                            }
                            (Some("tools/list"), Some("page-2")) => {
                                json!({"tools": [{"name": "b", "inputSchema": {}}]})
                            }
                            _ => json!({}),
                        };
                        let reply = match m.get("id") {
                            Some(id) => {
                                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
                            }
                            None => String::new(),
                        };
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            bytes::Bytes::from(reply),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_follow_the_tools_list_cursor() {
    let url = paginating_upstream().await;
    let text = format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: p}}\nspec:\n  url: {url}\n"
    );
    let config = file::parse(&text, &CompileOptions::default()).unwrap();
    let up = HttpUpstream::new(config.connections[0].clone()).unwrap();
    let names: Vec<Value> = up
        .health_check()
        .await
        .unwrap()
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("b")]);
}

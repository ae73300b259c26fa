//! Traces over OTLP: the real `aip-sidecar run` binary, pointed at an
//! in-process OTLP/gRPC collector, exports a span per agent message and one
//! per upstream request (its child), flushed on SIGTERM; the server is told
//! of the upstream span as the call's parent.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(20);
/// The trace and span the agent's call carries.
const AGENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hands every export to the test.
struct Collector(mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|a| a.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector() {
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    // The collector.
    let (exports, mut exported) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    let stop = shutdown.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(exports)))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                stop.cancelled_owned(),
            ),
    );
    // The upstream, keeping every call it is sent.
    let calls = Arc::new(Mutex::new(Vec::<Value>::new()));
    let seen = calls.clone();
    let upstream = common::scripted_server(
        move |m| match m["method"].as_str() {
            Some("initialize") => (
                200,
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "up", "version": "1"}}),
            ),
            Some("tools/list") => (
                200,
                json!({"tools": [{"name": "read", "inputSchema": {"type": "object"}}]}),
            ),
            Some("tools/call") => {
                seen.lock().unwrap().push(m.clone());
                (200, json!({"content": [{"type": "text", "text": "ok"}]}))
            }
            _ => (200, json!({})),
        },
        shutdown.clone(),
    )
    .await;
    // The sidecar, as shipped.
    let tmp = common::scratch("aip-otlp-");
    let dir = tmp.path();
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: agent}}\nspec:\n  allowed_tools: [up_read]\n---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: up}}\nspec:\n  url: {upstream}\n  toolPrefix: up_\n")).unwrap();
    let mut sidecar = Command::new(env!("CARGO_BIN_EXE_aip-sidecar"))
        .args(["run", "--config", config.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--audit", "/dev/null", "--approval-token-file"])
        .arg(dir.join("token"))
        .args(["--otlp-endpoint", &collector])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(sidecar.stderr.take().unwrap());
    // Both the address line and the first healthy check, in either order.
    let (agent, healthy) = tokio::task::spawn_blocking(move || {
        let (mut agent, mut healthy) = (None, false);
        let mut lines = stderr.lines();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(rest) = line.split("agents at http://").nth(1) {
                agent = rest.split('/').next().map(str::to_owned);
            }
            healthy |= line.contains("connection state changed") && line.contains("Healthy");
            if agent.is_some() && healthy {
                break;
            }
        }
        // Keep reading, so the sidecar never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        (agent, healthy)
    })
    .await
    .unwrap();
    assert!(healthy, "the connection became healthy");
    let agent: std::net::SocketAddr = agent.unwrap().parse().unwrap();

    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let session = post(agent, None, &initialize.to_string()).await.0.unwrap();
    // The agent's own trace, in W3C trace context in `_meta`.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "up_read", "arguments": {},
        "_meta": {"traceparent": format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01")}}});
    let (_, body) = post(agent, Some(&session), &call.to_string()).await;
    assert!(body.contains("\"ok\""), "{body}");

    // SIGTERM: the sidecar drains, flushes its spans and exits.
    let pid = rustix::process::Pid::from_raw(sidecar.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || sidecar.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");

    let mut spans = Vec::new();
    let mut service = None;
    while let Ok(export) = exported.try_recv() {
        for resource in export.resource_spans {
            if let Some(r) = &resource.resource {
                service = r
                    .attributes
                    .iter()
                    .find(|a| a.key == "service.name")
                    .and_then(|a| a.value.clone());
            }
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }
    assert!(
        matches!(service.and_then(|v| v.value), Some(Any::StringValue(s)) if s == "aip-sidecar")
    );
    let message = spans
        .iter()
        .find(|s| {
            s.name == "mcp.message" && attribute(s, "rpc.method").as_deref() == Some("tools/call")
        })
        .unwrap_or_else(|| panic!("a tools/call span: {spans:?}"));
    assert_eq!(attribute(message, "mcp.tool").as_deref(), Some("up_read"));
    assert_eq!(attribute(message, "aip.decision").as_deref(), Some("ALLOW"));
    let upstream = spans
        .iter()
        .find(|s| s.name == "mcp.upstream")
        .unwrap_or_else(|| panic!("an upstream span: {spans:?}"));
    assert_eq!(attribute(upstream, "aip.connection").as_deref(), Some("up"));
    assert_eq!(attribute(upstream, "aip.outcome").as_deref(), Some("ok"));
    assert_eq!(upstream.trace_id, message.trace_id, "one trace");
    assert_eq!(hex(&message.trace_id), AGENT_TRACE, "the agent's trace");
    assert_eq!(
        hex(&message.parent_span_id),
        AGENT_SPAN,
        "the gateway's span is a child of the agent's"
    );
    assert_eq!(
        upstream.parent_span_id, message.span_id,
        "the upstream call is a child"
    );
    // W3C propagation: the server sees the agent's trace with the gateway's
    // upstream span as the parent, not the agent's span.
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["params"]["_meta"]["traceparent"],
        format!("00-{AGENT_TRACE}-{}-01", hex(&upstream.span_id)),
        "{}",
        calls[0]
    );
}

/// One POST to the agent side; (session id issued, body).
async fn post(
    addr: std::net::SocketAddr,
    session: Option<&str>,
    body: &str,
) -> (Option<String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(s) = session {
        head += &format!("mcp-session-id: {s}\r\n");
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let session = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .map(str::to_owned);
    (session, body.to_owned())
}

//! A whole stack on loopback: the fault server as the upstream, the gateway
//! with its agent-facing HTTP server, and a raw HTTP client playing the agent.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aip_fault_server::core::Core;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use aip_policy::CompileOptions;
use aip_sidecar::agent::http as agent_http;
use aip_sidecar::audit::Audit;
use aip_sidecar::config::file;
use aip_sidecar::gate::{Gateway, GatewayOptions};
use aip_sidecar::upstream::health::HealthState;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub const PATIENCE: Duration = Duration::from_secs(10);

pub struct Stack {
    pub fault: Arc<Core>,
    pub fault_url: String,
    pub gateway: Arc<Gateway>,
    pub addr: SocketAddr,
    pub audit: PathBuf,
    /// The audit file's directory, removed when the stack drops.
    _scratch: tempfile::TempDir,
    /// The configuration file's text, as loaded.
    pub config_text: String,
    config_tx: tokio::sync::watch::Sender<Arc<aip_sidecar::config::Config>>,
    shutdown: CancellationToken,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub struct Setup<'a> {
    /// FaultServer `spec:` body.
    pub faults: &'a str,
    /// AgentPolicy `spec:` body.
    pub policy: &'a str,
    /// Extra ToolConnection `spec:` lines.
    pub connection: &'a str,
    pub approval_timeout: Duration,
    /// Wait for this health state before returning.
    pub expect: HealthState,
    /// Point the connection here instead of at the fault server.
    pub url: Option<String>,
    /// The connection's tool prefix.
    pub prefix: &'a str,
    /// Run this stdio server as the connection instead of using a URL.
    pub command: Option<Vec<String>>,
    /// How often a waiting ask sends progress.
    pub ask_progress_interval: Duration,
    /// More YAML documents for the configuration (`{fault_url}` stands for
    /// the fault server's URL); every connection must become healthy.
    pub more: &'a str,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            faults: "",
            policy: "",
            connection: "",
            approval_timeout: Duration::from_secs(60),
            expect: HealthState::Healthy,
            url: None,
            prefix: "up_",
            command: None,
            ask_progress_interval: Duration::from_secs(5),
            more: "",
        }
    }
}

impl Stack {
    pub async fn start(setup: Setup<'_>) -> Stack {
        let shutdown = CancellationToken::new();
        // With an external upstream the fault server idles; it still needs a tool.
        let faults = if setup.faults.is_empty() {
            "  tools: [{name: unused, responses: [{sequence: [{return: 1}]}]}]\n"
        } else {
            setup.faults
        };
        let yaml = format!(
            "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: up}}\nspec:\n{faults}"
        );
        let fault = Core::new(
            Script::from_yaml(&yaml, Transport::Http).unwrap(),
            AttemptLog::new(Box::new(std::io::sink()), true),
        );
        let fault_url = aip_fault_server::http::start_on_loopback(fault.clone(), shutdown.clone())
            .await
            .unwrap();

        let policy = if setup.policy.is_empty() {
            "  {}"
        } else {
            setup.policy
        };
        let url = setup.url.clone().unwrap_or_else(|| fault_url.clone());
        // Real servers get real limits; the fault server gets tight ones so
        // timeouts and size limits are quick to reach.
        let endpoint = match &setup.command {
            Some(argv) => format!("command: {}", json!(argv)),
            None => format!("url: {url}"),
        };
        let real = setup.url.is_some()
            || (setup.command.as_ref()).is_some_and(|c| !c[0].ends_with("aip-fault-server"));
        let (timeout, max_bytes) = if real { (10, 1_000_000) } else { (1, 4096) };
        let config_text = format!(
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: agent}}\nspec:\n{policy}\n---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: up}}\nspec:\n  {endpoint}\n  toolPrefix: {}\n  timeoutSeconds: {timeout}\n  maxResponseBytes: {max_bytes}\n{}",
            setup.prefix, setup.connection
        );
        let config_text = if setup.more.is_empty() {
            config_text
        } else {
            format!(
                "{config_text}---\n{}",
                setup.more.replace("{fault_url}", &fault_url)
            )
        };
        let options = CompileOptions {
            home: Some("/home/agent".into()),
            ..CompileOptions::default()
        };
        let config =
            file::parse(&config_text, &options).unwrap_or_else(|e| panic!("{e}\n{config_text}"));
        let (config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(config));
        let dir = scratch("aip-gw-audit-");
        let audit = dir.path().join("audit.jsonl");
        let sink = std::fs::File::create(&audit).unwrap();
        let gateway = Gateway::new(
            config_rx,
            Audit::new(Box::new(sink)),
            GatewayOptions {
                approval_timeout: setup.approval_timeout,
                ask_progress_interval: setup.ask_progress_interval,
                ..GatewayOptions::default()
            },
            shutdown.clone(),
        );
        for (i, connection) in gateway.connections().iter().enumerate() {
            let expect = if i == 0 {
                setup.expect
            } else {
                HealthState::Healthy
            };
            let mut health = connection.subscribe();
            if tokio::time::timeout(PATIENCE, health.wait_for(|s| *s == expect))
                .await
                .is_err()
            {
                let h = connection.health();
                panic!(
                    "the connection does not reach {expect:?}: it is {:?} ({})",
                    h.state,
                    h.reason.unwrap_or_default()
                );
            }
        }

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(agent_http::serve(
            gateway.clone(),
            listener,
            agent_http::default_limits(),
            shutdown.clone(),
            TaskTracker::new(),
        ));
        Stack {
            fault,
            fault_url,
            gateway,
            addr,
            audit,
            _scratch: dir,
            config_text,
            config_tx,
            shutdown,
        }
    }

    /// Publishes a new configuration, as a reload of the file would, and
    /// waits until the gateway has applied it.
    pub async fn reload(&self, config_text: &str) {
        let config = file::parse(config_text, &CompileOptions::default())
            .unwrap_or_else(|e| panic!("{e}\n{config_text}"));
        let mut applied = self.gateway.applied();
        applied.mark_unchanged();
        self.config_tx.send_replace(Arc::new(config));
        tokio::time::timeout(PATIENCE, applied.changed())
            .await
            .expect("the gateway applies the new configuration")
            .unwrap();
    }

    /// Stops the gateway as SIGTERM would (the stack's servers with it).
    pub fn stop(&self) {
        self.shutdown.cancel();
    }

    /// The upstream attempts, as the fault server logged them.
    pub fn attempts(&self) -> Vec<Value> {
        self.fault
            .log
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn audit_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// initialize + notifications/initialized; the session id.
    pub async fn session(&self) -> String {
        let r = self.post(&[], &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string()).await;
        assert_eq!(r.status, 200, "{r:?}");
        let session = r.header("mcp-session-id").unwrap().to_owned();
        let n = self
            .post(
                &[("mcp-session-id", &session)],
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            )
            .await;
        assert_eq!(n.status, 202);
        session
    }

    pub async fn post(&self, headers: &[(&str, &str)], body: &str) -> RawResponse {
        raw(self.addr, "POST", headers, body).await
    }

    /// A tools/call in `session`; the JSON-RPC response.
    pub async fn call(&self, session: &str, id: Value, tool: &str, args: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
        let r = self
            .post(&[("mcp-session-id", session)], &body.to_string())
            .await;
        assert_eq!(
            r.status, 200,
            "upstream failures are JSON-RPC errors in a 200: {r:?}"
        );
        r.json()
    }

    /// `message` posted in `session`, answered as an event stream (the
    /// gateway streams a call that has something to say before its result).
    pub async fn stream(&self, session: &str, message: &Value) -> Sse {
        let stream = Sse::open(
            self.addr,
            "POST",
            &[("mcp-session-id", session)],
            &message.to_string(),
        )
        .await;
        assert_eq!(stream.status, 200);
        assert_eq!(stream.content_type, "text/event-stream");
        stream
    }

    pub async fn request(&self, session: &str, id: Value, method: &str) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method});
        self.post(&[("mcp-session-id", session)], &body.to_string())
            .await
            .json()
    }
}

/// A directory of its own under cargo's target/tmp (so that a run that is
/// killed leaves nothing outside target/), removed when the guard drops.
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

#[derive(Debug, Default)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// One HTTP/1.1 exchange on a fresh connection.
pub async fn raw(
    addr: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head += &format!("host: {addr}\r\n");
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("accept"))
    {
        head += "accept: application/json, text/event-stream\r\n";
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
        .await
        .expect("a response")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap_or("")
        .split(' ')
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let headers: Vec<(String, String)> = headers;
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    RawResponse {
        status,
        headers,
        body: if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    }
}

/// The payload of a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A response read as it streams: its status and content type, then its
/// SSE messages one at a time.
pub struct Sse {
    pub status: u16,
    pub content_type: String,
    body: hyper::body::Incoming,
    buffer: String,
}

impl Sse {
    pub async fn open(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> Sse {
        use http_body_util::Full;
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri("/mcp")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request
            .body(Full::new(bytes::Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(PATIENCE, sender.send_request(request))
            .await
            .expect("response headers")
            .unwrap();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Sse {
            status: response.status().as_u16(),
            content_type,
            body: response.into_body(),
            buffer: String::new(),
        }
    }

    /// The next message (the data of the next event); None when the body
    /// ends.
    pub async fn next(&mut self) -> Option<Value> {
        use http_body_util::BodyExt;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Some(serde_json::from_str(&data).unwrap());
            }
            let frame = tokio::time::timeout(PATIENCE, self.body.frame())
                .await
                .expect("the stream goes on")?
                .unwrap();
            if let Some(chunk) = frame.data_ref() {
                self.buffer.push_str(std::str::from_utf8(chunk).unwrap());
            }
        }
    }

    /// The rest of the body as text, when it is not a stream.
    pub async fn text(self) -> String {
        use http_body_util::BodyExt;
        let bytes = self.body.collect().await.unwrap().to_bytes();
        format!("{}{}", self.buffer, String::from_utf8_lossy(&bytes))
    }
}

/// What a [`scripted_server`] with one tool, `echo`, answers to the
/// handshake: `initialize` and `tools/list`; None for the rest.
pub fn echo_handshake(m: &Value) -> Option<(u16, Value)> {
    match m["method"].as_str() {
        Some("initialize") => Some((
            200,
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "s", "version": "1"}}),
        )),
        Some("tools/list") => Some((
            200,
            json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}),
        )),
        _ => None,
    }
}

/// An MCP server over HTTP answering each JSON-RPC message with what
/// `answer` says (an HTTP status and, for 200, the result): for the failure
/// rows the fault server's scripts cannot express (a tools/list refused).
/// A result of `{"__sse": [N...], "__result": R}` is sent as an event stream:
/// the messages N, then R as the response; `{"__raw": "TEXT"}` sends TEXT
/// as the body as it is, `{id}` in it replaced by the request's id. Serves
/// until `shutdown`; returns its URL.
pub async fn scripted_server(
    answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static,
    shutdown: CancellationToken,
) -> String {
    recording_server(answer, shutdown).await.0
}

/// [`scripted_server`], and the bodies it received, each as it came.
pub async fn recording_server(
    answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static,
    shutdown: CancellationToken,
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use http_body_util::{BodyExt, Full};
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = received.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                a = listener.accept() => a.unwrap(),
                () = shutdown.cancelled() => return,
            };
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (answer, log) = (answer.clone(), log.clone());
                        async move {
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            log.lock()
                                .unwrap()
                                .push(String::from_utf8_lossy(&body).into_owned());
                            let message: Value =
                                serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let (status, result) = match message.get("id") {
                                Some(_) => answer(&message),
                                None => (202, Value::Null),
                            };
                            // A result of {"__error": E} is sent as the JSON-RPC error E.
                            let events = result.get("__sse").and_then(Value::as_array);
                            let text = if let Some(events) = events {
                                let done = json!({"jsonrpc": "2.0", "id": message["id"], "result": result["__result"]});
                                events
                                    .iter()
                                    .chain([&done])
                                    .map(|e| format!("data: {e}\n\n"))
                                    .collect()
                            } else if let Some(raw) = result.get("__raw").and_then(Value::as_str) {
                                raw.replace("{id}", &message["id"].to_string())
                            } else if status == 200 && result.get("__error").is_some() {
                                json!({"jsonrpc": "2.0", "id": message["id"], "error": result["__error"]})
                                    .to_string()
                            } else if status == 200 {
                                json!({"jsonrpc": "2.0", "id": message["id"], "result": result})
                                    .to_string()
                            } else {
                                String::new()
                            };
                            let mut r = hyper::Response::new(Full::new(bytes::Bytes::from(text)));
                            *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            let kind = if events.is_some() {
                                "text/event-stream"
                            } else {
                                "application/json"
                            };
                            r.headers_mut()
                                .insert("content-type", kind.parse().unwrap());
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, received)
}

/// The tasks extension's name.
pub const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A 2026-07-28 request's `_meta`: `agent` is its clientInfo name, `tasks`
/// whether it declares the tasks extension.
pub fn meta(agent: &str, tasks: bool) -> Value {
    let mut capabilities = json!({});
    if tasks {
        capabilities["extensions"] = json!({TASKS: {}});
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": agent, "version": "1"},
    })
}

/// A modern request with its mirrored headers, as a conforming client
/// sends it; `agent` is its clientInfo name.
pub async fn modern(
    s: &Stack,
    agent: &str,
    tasks: bool,
    method: &str,
    params: Value,
) -> RawResponse {
    modern_with(s, meta(agent, tasks), method, params).await
}

/// A modern request with this `_meta`.
pub async fn modern_with(s: &Stack, meta: Value, method: &str, mut params: Value) -> RawResponse {
    params["_meta"] = meta;
    let name = ["name", "uri", "taskId"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str))
        .map(str::to_owned);
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let mut headers = vec![
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    s.post(&headers, &body.to_string()).await
}

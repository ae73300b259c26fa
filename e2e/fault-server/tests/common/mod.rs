//! Shared harness: a spawned stdio server driven as an MCP client, an
//! in-process HTTP server on loopback, and a raw HTTP/1.1 client that sees
//! exactly what went over the wire (dropped sockets, partial bodies).

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use aip_fault_server::core::Core;
use aip_fault_server::http::{self, HttpOptions};
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// How long any single expected event may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A directory of the test's own under cargo's target/tmp (so that a run
/// that is killed leaves nothing outside target/), removed when it drops.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("aip-fault-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

pub fn script(tools: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: test}}\nspec:\n{tools}"
    )
}

// ---------------------------------------------------------------- stdio --

pub struct StdioServer {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Receiver<String>,
    pub log: PathBuf,
    /// The script's and the log's directory, removed after the process.
    _scratch: tempfile::TempDir,
}

impl StdioServer {
    pub fn spawn(name: &str, yaml: &str) -> StdioServer {
        StdioServer::spawn_with(name, yaml, &[])
    }

    /// Spawns with extra command-line arguments (e.g. `--era modern`).
    pub fn spawn_with(name: &str, yaml: &str, extra: &[&str]) -> StdioServer {
        let tmp = scratch(name);
        let config = tmp.path().join("script.yaml");
        std::fs::write(&config, yaml).unwrap();
        let log = tmp.path().join("attempts.jsonl");
        let mut child = Command::new(env!("CARGO_BIN_EXE_aip-fault-server"))
            .arg("--config")
            .arg(&config)
            .arg("--stdio")
            .arg("--log")
            .arg(&log)
            .args(extra)
            .env("RUST_LOG", "aip_fault_server=debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = pump(child.stdout.take().unwrap());
        let stderr = pump(child.stderr.take().unwrap());
        let stdin = child.stdin.take();
        StdioServer {
            child,
            stdin,
            lines,
            stderr,
            log,
            _scratch: tmp,
        }
    }

    pub fn send(&mut self, message: &Value) {
        self.send_raw(&message.to_string());
    }

    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn call(&mut self, id: Value, tool: &str, args: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": args}}));
    }

    pub fn cancel(&mut self, id: Value) {
        self.send(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": id, "reason": "test"}}),
        );
    }

    pub fn initialize(&mut self) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        let r = self.recv();
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r
    }

    /// The next line the server writes, as JSON.
    pub fn recv(&mut self) -> Value {
        let line = self.recv_line().expect("a line from the server");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    pub fn recv_line(&mut self) -> Option<String> {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(l) => Some(l),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("no line from the server within {PATIENCE:?}"),
        }
    }

    /// Whether stdout has ended (the server closed it).
    pub fn stdout_closed(&mut self) -> bool {
        matches!(
            self.lines.recv_timeout(PATIENCE),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    /// Waits for the debug line saying the call with `id` started running.
    pub fn wait_running(&mut self, id: &Value) {
        let needle = format!("request_id={id}");
        loop {
            let line = self
                .stderr
                .recv_timeout(PATIENCE)
                .expect("a running event on stderr");
            if line.contains("call running") && line.contains(&needle) {
                return;
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    pub fn attempts(&self) -> Vec<Value> {
        read_attempts(&self.log)
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_attempts(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Lines of a reader, delivered on a channel by a thread (ends at EOF).
fn pump(reader: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        loop {
            let mut buf = Vec::new();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf)
                        .trim_end_matches('\n')
                        .to_owned();
                    if tx.send(text).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// The binary serving `config` over HTTP on a free loopback port, its
/// attempt log appended to `log`. Returns the child and the address it
/// announced on stderr.
pub fn spawn_http_binary(config: &std::path::Path, log: &std::path::Path) -> (Child, SocketAddr) {
    spawn_http_binary_with(config, log, &[])
}

/// [`spawn_http_binary`] with extra command-line arguments.
pub fn spawn_http_binary_with(
    config: &std::path::Path,
    log: &std::path::Path,
    extra: &[&str],
) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aip-fault-server"))
        .arg("--config")
        .arg(config)
        .args(["--http", "127.0.0.1:0", "--log"])
        .arg(log)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("aip-fault-server: listening on http://")
        .and_then(|rest| rest.strip_suffix("/mcp"))
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .parse()
        .unwrap();
    // Keep reading so that later diagnostics never hit a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, addr)
}

// ----------------------------------------------------------------- http --

pub struct HttpServer {
    pub addr: SocketAddr,
    pub core: Arc<Core>,
    shutdown: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl HttpServer {
    pub fn start(yaml: &str, options: HttpOptions) -> HttpServer {
        let script = Script::from_yaml(yaml, Transport::Http).unwrap();
        let core = Core::new(script, AttemptLog::new(Box::new(std::io::sink()), true));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(core.clone().run(shutdown.clone()));
        runtime.spawn(http::serve(
            core.clone(),
            listener,
            options,
            shutdown.clone(),
        ));
        HttpServer {
            addr,
            core,
            shutdown,
            runtime: Some(runtime),
        }
    }

    pub fn attempts(&self) -> Vec<Value> {
        self.core
            .log
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Blocks until the call `id` of `session` is being played.
    pub fn wait_running(&self, session: &str, id: &Value) {
        let key = Core::call_key(session, id);
        let mut rx = self.core.running();
        self.runtime.as_ref().unwrap().block_on(async {
            tokio::time::timeout(PATIENCE, rx.wait_for(|r| r.as_ref() == Some(&key)))
                .await
                .expect("the call starts running")
                .unwrap();
        });
    }

    /// Blocks until a call with request id `id` is being played, whatever
    /// its session (a modern request's is `modern-N`); returns its key.
    pub fn wait_running_id(&self, id: &Value) -> (String, String) {
        let id = id.to_string();
        let mut rx = self.core.running();
        self.runtime.as_ref().unwrap().block_on(async {
            let key = tokio::time::timeout(
                PATIENCE,
                rx.wait_for(|r| r.as_ref().is_some_and(|(_, i)| *i == id)),
            )
            .await
            .expect("the call starts running")
            .unwrap();
            key.clone().unwrap()
        })
    }

    /// Blocks until the attempt log has at least `n` lines.
    pub fn wait_attempts(&self, n: u64) {
        let mut rx = self.core.log.written();
        self.runtime.as_ref().unwrap().block_on(async {
            tokio::time::timeout(PATIENCE, rx.wait_for(|w| *w >= n))
                .await
                .expect("the attempts are logged")
                .unwrap();
        });
    }

    /// Blocks until no call is being played.
    pub fn wait_idle(&self) {
        let mut rx = self.core.running();
        self.runtime.as_ref().unwrap().block_on(async {
            tokio::time::timeout(PATIENCE, rx.wait_for(Option::is_none))
                .await
                .expect("the worker goes idle")
                .unwrap();
        });
    }

    /// initialize; returns the session id.
    pub fn session(&self) -> String {
        let r = post(
            self.addr,
            &[],
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        r.header("mcp-session-id").unwrap().to_owned()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[derive(Debug, Default)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The connection closed before any byte of a response arrived.
    pub dropped: bool,
    /// The body stopped short of its Content-Length and nothing more came.
    pub stalled: bool,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body, parsed.
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim_start().to_owned())
            .collect()
    }
}

pub const JSON_AND_SSE: (&str, &str) = ("accept", "application/json, text/event-stream");

pub fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> RawResponse {
    request(
        addr,
        "POST",
        headers,
        Some(&body.to_string()),
        Duration::from_secs(10),
    )
}

/// One HTTP/1.1 request on a fresh connection. `wait` bounds how long a
/// body may sit without progress before it counts as stalled.
pub fn request(
    addr: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    wait: Duration,
) -> RawResponse {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut head = format!("{method} /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    let has_accept = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("accept"));
    if !has_accept {
        head += &format!("{}: {}\r\n", JSON_AND_SSE.0, JSON_AND_SSE.1);
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    if let Some(b) = body {
        head += &format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            b.len()
        );
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    if let Some(b) = body {
        stream.write_all(b.as_bytes()).unwrap();
    }
    let mut raw = Vec::new();
    let mut stalled = false;
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                stalled = true;
                break;
            }
            Err(_) => break,
        }
    }
    parse_response(&raw, stalled)
}

fn parse_response(raw: &[u8], stalled: bool) -> RawResponse {
    if raw.is_empty() {
        return RawResponse {
            dropped: true,
            ..RawResponse::default()
        };
    }
    let text = String::from_utf8_lossy(raw);
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
    RawResponse {
        status,
        headers,
        body: body.to_owned(),
        dropped: false,
        stalled,
    }
}

// --------------------------------------------------------------- modern --

pub const MODERN: &str = "2026-07-28";

/// The per-request envelope of a 2026-07-28 request.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    })
}

/// A modern request: `params` with the envelope added.
pub fn modern(id: Value, method: &str, mut params: Value) -> Value {
    if params.is_null() {
        params = json!({});
    }
    params["_meta"] = meta();
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// The routing headers a conforming client sends with `body`.
pub fn routing_headers(body: &Value) -> Vec<(String, String)> {
    let method = body["method"].as_str().unwrap_or_default().to_owned();
    let version = body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
        .as_str()
        .unwrap_or(MODERN)
        .to_owned();
    let mut headers = vec![
        ("mcp-protocol-version".to_owned(), version),
        ("mcp-method".to_owned(), method.clone()),
    ];
    let name = match method.as_str() {
        "tools/call" | "prompts/get" => body["params"]["name"].as_str(),
        "resources/read" => body["params"]["uri"].as_str(),
        _ => None,
    };
    if let Some(name) = name {
        headers.push(("mcp-name".to_owned(), name.to_owned()));
    }
    headers
}

/// POSTs a modern request with the headers a conforming client sends,
/// plus `extra`.
pub fn post_modern(addr: SocketAddr, body: &Value, extra: &[(&str, &str)]) -> RawResponse {
    let routing = routing_headers(body);
    let mut headers: Vec<(&str, &str)> = routing
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    headers.extend_from_slice(extra);
    post(addr, &headers, body)
}

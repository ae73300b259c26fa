//! An MCP agent over Streamable HTTP, as simple as a test needs: one
//! HTTP/1.1 exchange per message on a fresh connection.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Agent {
    pub addr: SocketAddr,
    pub session: String,
    next_id: u64,
}

impl Agent {
    /// initialize + notifications/initialized.
    pub async fn connect(addr: SocketAddr) -> Agent {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
        let (status, headers, _) = post(addr, &[], &init).await;
        assert_eq!(status, 200);
        let session = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
            .map(|(_, v)| v.clone())
            .expect("a session id");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _, _) = post(addr, &[("mcp-session-id", &session)], &note).await;
        assert_eq!(status, 202);
        Agent {
            addr,
            session,
            next_id: 1,
        }
    }

    /// Another handle on an existing session.
    pub fn resume(addr: SocketAddr, session: &str) -> Agent {
        Agent {
            addr,
            session: session.to_owned(),
            next_id: 1_000 + u64::from(rand_id()),
        }
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let body =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let (status, _, body) = post(
            self.addr,
            &[
                ("mcp-session-id", &self.session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            &body,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    }

    /// A tools/call with the request id `id`.
    pub async fn call_as(&self, id: u64, tool: &str, arguments: Value) -> Value {
        self.held_call_as(id, tool, arguments, Duration::from_secs(20))
            .await
    }

    /// A tools/call with the request id `id` that may be held for up to
    /// `patience` from the moment it is sent: while a person decides, and
    /// in a story that restarts the operator meanwhile, for that too. The
    /// story bounds the wait after its decision with a deadline of its own.
    pub async fn held_call_as(
        &self,
        id: u64,
        tool: &str,
        arguments: Value,
        patience: Duration,
    ) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        let (_, _, body) = post_within(
            self.addr,
            &[
                ("mcp-session-id", &self.session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            &body,
            patience,
        )
        .await;
        serde_json::from_str(&body).unwrap_or(Value::Null)
    }

    /// A notification (no answer but 202).
    pub async fn notify(&self, method: &str, params: Value) {
        let body = json!({"jsonrpc": "2.0", "method": method, "params": params});
        let (status, _, _) = post(
            self.addr,
            &[
                ("mcp-session-id", &self.session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            &body,
        )
        .await;
        assert_eq!(status, 202);
    }

    /// A tools/call that may take up to `patience` (a held call).
    pub async fn call_within(&mut self, tool: &str, arguments: Value, patience: Duration) -> Value {
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        let (_, _, body) = post_within(
            self.addr,
            &[
                ("mcp-session-id", &self.session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            &body,
            patience,
        )
        .await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    }

    pub async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
    }

    pub async fn tool_names(&mut self) -> Vec<String> {
        let listed = self.request("tools/list", json!({})).await;
        listed["result"]["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A 2026-07-28 request (no session: version, capabilities and client in
/// `_meta`, mirrored in the headers) from the client named `client`, which
/// declares the tasks extension when `tasks`; the HTTP status and the body.
pub async fn modern(
    addr: SocketAddr,
    client: &str,
    tasks: bool,
    method: &str,
    mut params: Value,
) -> (u16, Value) {
    let capabilities = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
    });
    let name = ["name", "taskId"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str))
        .map(str::to_owned);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut headers = vec![
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    let (status, _, body) = post(addr, &headers, &body).await;
    let body = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (status, body)
}

/// One HTTP/1.1 POST to /mcp; (status, headers, body).
async fn post(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Vec<(String, String)>, String) {
    post_within(addr, headers, body, Duration::from_secs(20)).await
}

/// [`post`], answered within `patience`.
async fn post_within(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: &Value,
    patience: Duration,
) -> (u16, Vec<(String, String)>, String) {
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let read = tokio::time::timeout(patience, read_response(&mut stream, &mut raw))
        .await
        .expect("a response in time");
    // `kubectl port-forward` ends a connection the pod closed with a reset,
    // after the whole response: only a reset before any byte is an error.
    if let Err(e) = read {
        assert!(!raw.is_empty(), "no response from {addr}: {e}");
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// Reads one HTTP response into `raw`: up to its Content-Length when it has
/// one (the answer is there the moment it is: `kubectl port-forward` closes
/// the local end of a connection the pod closed only a second later), else
/// to the end of the connection.
async fn read_response(
    stream: &mut tokio::net::TcpStream,
    raw: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| raw.len() >= end + 4 + n) {
                return Ok(());
            }
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static N: AtomicU16 = AtomicU16::new(0);
    N.fetch_add(100, Ordering::Relaxed)
}

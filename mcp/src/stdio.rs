//! A stdio MCP server as an upstream of the gateway (standalone mode): the
//! child process is the session. It is started and initialized on first use
//! (single-flight), requests are matched to their callers by id, and a
//! process that ends fails its pending calls as unreachable and is started
//! afresh on next use. A tool call is never re-sent.

use aip_service::sync::lock;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::connection::{Connection, Endpoint};
use crate::failure::Failure;
use crate::jsonrpc::{self, Limits};
use crate::lines::{self, Line};
use crate::protocol::{ACCEPTED_VERSIONS, Exchange, PROTOCOL_VERSION, Related};

pub struct StdioUpstream {
    connection: Arc<Connection>,
    process: tokio::sync::Mutex<Option<Arc<Process>>>,
    next_id: AtomicU64,
    /// Signalled when the server says its tool list changed.
    list_changed: Arc<Notify>,
    /// What the server declared it offers at initialize.
    capabilities: std::sync::Mutex<Value>,
}

struct Process {
    to_server: mpsc::UnboundedSender<String>,
    /// Callers by request id (JSON text); a fast hasher, seeded per process.
    pending: Mutex<Pending>,
    /// Cancelled when the server's stdout ends: the process is gone.
    ended: CancellationToken,
    /// Cancelled to stop the server: its stdin is closed and it is given
    /// `EXIT_GRACE` to exit before it is killed.
    stop: CancellationToken,
    /// Cancelled once the child has exited (or been killed) and reaped.
    exited: CancellationToken,
    list_changed: Arc<Notify>,
}

type Pending = HashMap<String, Waiter, foldhash::fast::RandomState>;

/// A caller waiting for its response, and where the server messages
/// attributed to its request go meanwhile.
struct Waiter {
    reply: oneshot::Sender<Value>,
    progress_token: Option<Value>,
    related: Option<Related>,
}

/// Lines up to this many times `maxResponseBytes` are read whole so that an
/// oversized response fails only its own call; a longer one cannot be
/// attributed without holding it, so the process is stopped instead.
const HOLD_FACTOR: usize = 4;

impl StdioUpstream {
    pub fn new(connection: Arc<Connection>) -> Result<StdioUpstream, String> {
        match &connection.endpoint {
            Endpoint::Stdio { command } if !command.is_empty() => {}
            _ => {
                return Err(format!(
                    "connection {} is not a stdio connection",
                    connection.name
                ));
            }
        }
        Ok(StdioUpstream {
            connection,
            process: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
            list_changed: Arc::new(Notify::new()),
            capabilities: std::sync::Mutex::new(serde_json::json!({})),
        })
    }

    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The capabilities the server declared.
    pub fn server_capabilities(&self) -> Value {
        aip_service::sync::lock(&self.capabilities).clone()
    }

    pub fn list_changed(&self) -> &Notify {
        &self.list_changed
    }

    /// Stops the server, if one runs, and waits until it has exited: stdin
    /// closed, then killed after `EXIT_GRACE`.
    pub async fn close(&self) {
        let Some(process) = self.process.lock().await.take() else {
            return;
        };
        process.stop.cancel();
        process.exited.cancelled().await;
    }

    /// Sends one request and waits for its response, within the
    /// connection's timeout. A call that times out is cancelled.
    pub async fn request(
        &self,
        message: &Value,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let mut used: Option<Arc<Process>> = None;
        let outcome = tokio::time::timeout(self.connection.timeout, async {
            let process = self.process().await?;
            used = Some(process.clone());
            self.exchange(&process, message, related).await
        })
        .await
        .unwrap_or(Err(Failure::Timeout));
        if let (Err(Failure::Timeout), Some(p)) = (&outcome, &used) {
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": id, "reason": "the gateway's deadline passed"}});
            let _ = p.to_server.send(text(&cancel));
        }
        outcome
    }

    pub async fn notify(&self, message: &Value) -> Result<(), Failure> {
        let process = self.process().await?;
        process.to_server.send(text(message)).map_err(|_| ended())
    }

    /// Starts the server if it is not running, then lists its tools (all
    /// pages) within the health deadline.
    pub async fn health_check(&self) -> Result<Vec<Value>, Failure> {
        tokio::time::timeout(self.connection.health_deadline, async {
            let process = self.process().await?;
            crate::protocol::list_all_tools(|mut list| {
                list["id"] = json!(self.fresh_id("list"));
                let process = &process;
                async move { self.exchange(process, &list, None).await }
            })
            .await
        })
        .await
        .unwrap_or(Err(Failure::Timeout))
    }

    fn fresh_id(&self, kind: &str) -> String {
        format!(
            "aip-{kind}-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The running process, started and initialized if there is none (or
    /// the last one ended).
    async fn process(&self) -> Result<Arc<Process>, Failure> {
        let mut slot = self.process.lock().await;
        if let Some(p) = slot.as_ref().filter(|p| !p.ended.is_cancelled()) {
            return Ok(p.clone());
        }
        let process = self.start()?;
        let init = json!({"jsonrpc": "2.0", "id": self.fresh_id("init"), "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": crate::protocol::client_capabilities(&self.connection),
            "clientInfo": {"name": "aip-sidecar", "version": env!("CARGO_PKG_VERSION")}}});
        let x = self
            .exchange(&process, &init, None)
            .await
            .map_err(|f| Failure::InitFailed(Box::new(f)))?;
        let version = x
            .response()
            .pointer("/result/protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !ACCEPTED_VERSIONS.contains(&version) {
            let f = Failure::Malformed(format!("unsupported protocol version {version:?}"));
            return Err(Failure::InitFailed(Box::new(f)));
        }
        if let Some(c) = x
            .response()
            .pointer("/result/capabilities")
            .filter(|c| c.is_object())
        {
            *aip_service::sync::lock(&self.capabilities) = c.clone();
        }
        let _ = process
            .to_server
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string());
        *slot = Some(process.clone());
        Ok(process)
    }

    fn start(&self) -> Result<Arc<Process>, Failure> {
        let Endpoint::Stdio { command } = &self.connection.endpoint else {
            return Err(Failure::Network("not a stdio connection".into()));
        };
        let (child, mut stdin, stdout) = spawn(command).map_err(Failure::Network)?;
        let (to_server, mut lines) = mpsc::unbounded_channel::<String>();
        let process = Arc::new(Process {
            to_server,
            pending: Mutex::new(Pending::default()),
            ended: CancellationToken::new(),
            stop: CancellationToken::new(),
            exited: CancellationToken::new(),
            list_changed: self.list_changed.clone(),
        });
        tokio::spawn(supervise(
            child,
            process.stop.clone(),
            process.exited.clone(),
        ));
        let stop = process.stop.clone();
        tokio::spawn(async move {
            // Whatever is queued goes out in one write: a pipelining caller
            // costs one system call per batch, not per line.
            const BATCH: usize = 256 * 1024;
            let mut buf = Vec::with_capacity(16 * 1024);
            loop {
                let line = tokio::select! {
                    line = lines.recv() => match line { Some(l) => l, None => return },
                    // Returning drops stdin: the server sees end of input.
                    () = stop.cancelled() => return,
                };
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                while buf.len() < BATCH {
                    let Ok(more) = lines.try_recv() else { break };
                    buf.extend_from_slice(more.as_bytes());
                    buf.push(b'\n');
                }
                if stdin
                    .write_all(&buf)
                    .await
                    .and(stdin.flush().await)
                    .is_err()
                {
                    return;
                }
                buf.clear();
                // The server's answer usually follows within microseconds.
                aip_service::busy_poll::touch();
            }
        });
        let reader = process.clone();
        let limit = self.connection.max_response_bytes;
        let name = self.connection.name.clone();
        tokio::spawn(async move {
            let mut stdout = BufReader::new(stdout);
            loop {
                let line = tokio::select! {
                    l = lines::next_line(&mut stdout, limit.saturating_mul(HOLD_FACTOR)) => l,
                    () = reader.stop.cancelled() => break,
                };
                match line {
                    Ok(Some(Line::Complete(line))) => reader.deliver(&line, limit, &name),
                    Ok(Some(Line::TooLong { bytes })) => {
                        tracing::error!(connection = %name, bytes, "the stdio server wrote a line too long to hold; it is stopped");
                        reader.stop.cancel();
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            reader.ended.cancel();
            reader.stop.cancel(); // a server that closed its stdout is done
            lock(&reader.pending).clear(); // every waiter sees the process gone
        });
        Ok(process)
    }

    async fn exchange(
        &self,
        process: &Process,
        message: &Value,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        let key = message.get("id").map(text).unwrap_or_default();
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            reply: tx,
            progress_token: crate::protocol::progress_token(message).cloned(),
            related: related.cloned(),
        };
        lock(&process.pending).insert(key.clone(), waiter);
        // A caller that stops waiting (deadline, agent cancel, shutdown)
        // takes its entry with it; an answer that comes later is dropped.
        let _forget = Forget {
            pending: &process.pending,
            key,
        };
        process.to_server.send(text(message)).map_err(|_| ended())?;
        let response = tokio::select! {
            r = rx => r.map_err(|_| ended())?,
            () = process.ended.cancelled() => return Err(ended()),
        };
        if response.get("aip_too_large").is_some() {
            return Err(Failure::TooLarge {
                limit: self.connection.max_response_bytes,
            });
        }
        match (response.get("result"), response.get("error")) {
            (Some(Value::Object(_)), None) | (None, Some(Value::Object(_))) => {
                Ok(Exchange::new(response, None))
            }
            _ => Err(Failure::Malformed(
                "the response has no valid result or error".into(),
            )),
        }
    }
}

/// Removes a waiter from the pending map when its caller goes away.
struct Forget<'a> {
    pending: &'a Mutex<Pending>,
    key: String,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.key);
    }
}

impl Drop for StdioUpstream {
    /// Stops the server of a connection that was removed or changed.
    fn drop(&mut self) {
        if let Some(p) = self.process.get_mut() {
            p.stop.cancel();
        }
    }
}

impl Process {
    /// Routes one line from the server to the caller waiting for it.
    fn deliver(&self, line: &[u8], limit: usize, connection: &str) {
        let value = match jsonrpc::parse_value(
            line,
            Limits {
                max_bytes: usize::MAX,
                max_depth: 64,
            },
        ) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(connection, error = %e, "the stdio server wrote a line that is not acceptable JSON; dropped");
                return;
            }
        };
        let Some(id) = value.get("id") else {
            self.attribute(value);
            return;
        };
        if value.get("method").is_some() {
            self.attribute_request(value);
            return;
        }
        if let Some(waiter) = lock(&self.pending).remove(&text(id)) {
            let delivered = if line.len() > limit {
                json!({"aip_too_large": line.len()})
            } else {
                value
            };
            let _ = waiter.reply.send(delivered);
        }
    }

    /// Passes a progress notification to the one pending call that asked
    /// for progress with its token (the gateway makes tokens unique; an
    /// ambiguous or unknown one is dropped, never shown to the wrong agent).
    /// stdio carries no other sign of which request a notification is
    /// about, so other notifications are not relayed.
    fn attribute(&self, note: Value) {
        if note.get("method").and_then(Value::as_str) == Some(crate::protocol::TOOLS_LIST_CHANGED) {
            self.list_changed.notify_one();
            return;
        }
        if note.get("method").and_then(Value::as_str) != Some("notifications/progress") {
            return;
        }
        let Some(token) = note.get("params").and_then(|p| p.get("progressToken")) else {
            return;
        };
        let pending = lock(&self.pending);
        let mut matching = pending
            .values()
            .filter(|w| w.progress_token.as_ref() == Some(token));
        if let (Some(waiter), None) = (matching.next(), matching.next())
            && let Some(related) = &waiter.related
        {
            let _ = related.send(note);
        }
    }

    /// A request the server makes of the client goes to the one pending
    /// call that takes related messages: while only one is outstanding, the
    /// request can only be about it. Otherwise (none, or several: stdio
    /// cannot tell which) it is refused, so the server need not wait.
    fn attribute_request(&self, request: Value) {
        let pending = lock(&self.pending);
        let mut relaying = pending.values().filter_map(|w| w.related.as_ref());
        if let (Some(related), None) = (relaying.next(), relaying.next()) {
            let _ = related.send(request);
            return;
        }
        drop(pending);
        let refusal = json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601,
            "message": "Method not found", "data": "no single call of this server is in progress to relay it for"}});
        let _ = self.to_server.send(text(&refusal));
    }
}

/// Starts `command` (an argv) with piped stdin and stdout; the child is
/// killed if dropped.
pub fn spawn(
    command: &[String],
) -> Result<
    (
        tokio::process::Child,
        tokio::process::ChildStdin,
        tokio::process::ChildStdout,
    ),
    String,
> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| "no command to run".to_owned())?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    match (child.stdin.take(), child.stdout.take()) {
        (Some(stdin), Some(stdout)) => Ok((child, stdin, stdout)),
        _ => Err(format!("{program}: its pipes are missing")),
    }
}

/// How long a server asked to stop gets to exit after its stdin closes,
/// and again after SIGTERM (the MCP stdio shutdown sequence), before it is
/// killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Owns the child: reaps it when it exits, and on `stop` (which closes its
/// stdin) waits `EXIT_GRACE` for it to exit, then sends SIGTERM and waits
/// again, then kills it.
async fn supervise(
    mut child: tokio::process::Child,
    stop: CancellationToken,
    exited: CancellationToken,
) {
    let _exited = exited.drop_guard();
    tokio::select! {
        _ = child.wait() => return,
        () = stop.cancelled() => {}
    }
    if tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_ok() {
        return;
    }
    let pid = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id.try_into().ok()?));
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

/// A value as one line's JSON text: serde's writer straight into the
/// string, without the `Display` adapter's per-piece overhead.
fn text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn ended() -> Failure {
    Failure::Network("the server process ended".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn a_caller_that_stops_waiting_leaves_nothing_pending() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let bin = root.join("target/debug/aip-fault-server");
        assert!(bin.exists(), "build the workspace first (make build)");
        let tmp = tempfile::Builder::new()
            .prefix("aip-stdio-forget-")
            .tempdir()
            .unwrap();
        let script = tmp.path().join("faults.yaml");
        std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: slow\n      responses: [{sequence: [{return: late, delay_ms: 300000}]}]\n").unwrap();
        let connection = Connection::new(
            "up",
            Endpoint::Stdio {
                command: vec![
                    bin.display().to_string(),
                    "--config".to_owned(),
                    script.display().to_string(),
                    "--stdio".to_owned(),
                    "--log".to_owned(),
                    "/dev/null".to_owned(),
                ],
            },
        );
        let upstream = StdioUpstream::new(Arc::new(connection)).unwrap();
        assert_eq!(upstream.health_check().await.unwrap().len(), 1);
        let call =
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "slow"}});
        // The caller gives up long before the server answers.
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), upstream.request(&call, None)).await;
        assert!(gave_up.is_err());
        let process = upstream.process.lock().await.clone().unwrap();
        assert!(
            lock(&process.pending).is_empty(),
            "the abandoned waiter is gone"
        );
        upstream.close().await;
    }
}

//! stdio wrap mode for desktop MCP clients:
//! `aip-sidecar stdio --policy FILE -- COMMAND ARGS...` runs COMMAND (a real
//! argv, never split on spaces) and sits between the client's stdin/stdout
//! and the server's, where the AIP reference proxy is used today.
//!
//! Agent -> server: strict parse, policy, canonical bytes forwarded; asks wait
//! (in their own task, sending progress if the call asked for it) for a
//! decision on the admin port, and are withdrawn if the client cancels the
//! call or goes away. Server -> agent: tools/list filtered, tool results and
//! errors redacted. The client capabilities sampling, elicitation and roots
//! are not offered to the server unless allowed, and requests for them are
//! refused if it asks anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aip_policy::{AuditRecord, Decision, Evaluator, Listing, Request};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::approvals::{Ask, LocalApprovals};
use crate::audit::{Audit, refusal_line};
use crate::busy_poll::BusyPoll;
use crate::config::Config;
use crate::jsonrpc::{self, Kind, Limits};
use crate::lines::{self, Line};

pub struct Wrap {
    pub config: watch::Receiver<Arc<Config>>,
    pub audit: Arc<Audit>,
    pub approvals: Arc<LocalApprovals>,
    pub approval_timeout: Duration,
    /// How often a waiting ask sends progress, when the call asked for it.
    pub ask_progress_interval: Duration,
    /// Client capabilities the server may be offered.
    pub allow_capabilities: Vec<String>,
    /// How long the event loop keeps polling after each line it writes
    /// (zero: it sleeps at once). See `busy_poll`.
    pub busy_poll: Duration,
}

/// What the gateway remembers about a request it forwarded.
#[derive(Debug, Clone)]
enum Forwarded {
    ToolsList,
    ToolsCall(String),
    Other,
}

/// Requests forwarded and not answered yet, by id (JSON text); a pipelining
/// client can have many, so the hasher is a fast one (seeded per process).
type Pending = Arc<Mutex<HashMap<String, Forwarded, foldhash::fast::RandomState>>>;
/// Asks waiting for a decision, by the call's id (JSON text).
type Asks = Arc<Mutex<HashMap<String, CancellationToken>>>;

impl Wrap {
    /// Runs `command` and relays until either side ends. Returns the
    /// server's exit code.
    pub async fn run<R, W>(
        self,
        command: &[String],
        agent_in: R,
        agent_out: W,
    ) -> anyhow::Result<i32>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (mut child, child_in, child_out) =
            crate::upstream::stdio::spawn(command).map_err(anyhow::Error::msg)?;
        let busy = BusyPoll::start(self.busy_poll);
        let (to_agent, agent_writer) = writer(agent_out, busy.clone());
        let (to_server, server_writer) = writer(child_in, busy);
        let pending: Pending = Arc::default();
        let this = Arc::new(self);
        let upstream = tokio::spawn(this.clone().server_to_agent(
            child_out,
            to_agent.clone(),
            // Weak: the server's stdin closes once the client is done.
            to_server.downgrade(),
            pending.clone(),
        ));
        this.agent_to_server(agent_in, to_agent, to_server, pending)
            .await;
        // The client is done. Drain in order, each step bounded: what it sent
        // reaches the server (whose stdin then closes), the server exits,
        // its last answers are relayed, and all of them are written out.
        let bound = Duration::from_secs(5);
        let _ = tokio::time::timeout(bound, server_writer).await;
        let status = tokio::time::timeout(bound, child.wait()).await;
        let _ = tokio::time::timeout(bound, upstream).await;
        let _ = tokio::time::timeout(bound, agent_writer).await;
        Ok(match status {
            Ok(Ok(s)) => s.code().unwrap_or(1),
            _ => {
                let _ = child.kill().await;
                1
            }
        })
    }

    async fn agent_to_server<R: AsyncRead + Unpin>(
        self: Arc<Self>,
        agent_in: R,
        to_agent: mpsc::UnboundedSender<String>,
        to_server: mpsc::UnboundedSender<String>,
        pending: Pending,
    ) {
        let limits = Limits::default();
        let asks: Asks = Arc::default();
        // The client going away withdraws every ask it left waiting.
        let _withdraw = Withdraw(asks.clone());
        let mut agent_in = BufReader::new(agent_in);
        while let Ok(Some(line)) = lines::next_line(&mut agent_in, limits.max_bytes).await {
            let parsed = match line {
                Line::Complete(line) if line.trim_ascii().is_empty() => continue,
                Line::Complete(line) => jsonrpc::parse(&line, limits),
                // Refused as parse would, without holding the whole line.
                Line::TooLong { bytes } => Err(jsonrpc::Refused {
                    refusal: jsonrpc::Refusal::TooLarge {
                        size: bytes,
                        limit: limits.max_bytes,
                    },
                    id: None,
                }),
            };
            let message = match parsed {
                Ok(m) => m,
                Err(refused) => {
                    self.audit.record(&refusal_line(
                        &refused.refusal.to_string(),
                        refused.id.as_ref(),
                    ));
                    let _ = to_agent.send(text(&refused.response()));
                    continue;
                }
            };
            let evaluator = self.config.borrow().evaluator.clone();
            if let Kind::Response { .. } = message.kind {
                // The agent answering the server (allowed capabilities only).
                let mut value = message.value;
                if let Some(r) = evaluator.redactor() {
                    r.redact_strings(&mut value, &mut Vec::new());
                }
                let _ = to_server.send(text(&value));
                continue;
            }
            let Ok(request) = Request::from_value(&message.value) else {
                continue;
            };
            let verdict = evaluator.evaluate(&request);
            if verdict.decision == Decision::Allow && withdraws(&message, &asks) {
                continue; // it cancelled an ask the server never saw
            }
            if let Some(id) = message.id() {
                let forwarded = match message.method() {
                    Some("tools/list") => Forwarded::ToolsList,
                    Some("tools/call") => Forwarded::ToolsCall(
                        verdict.tool().map(str::to_owned).unwrap_or_else(|| {
                            message
                                .params()
                                .and_then(|p| p.get("name"))
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned()
                        }),
                    ),
                    _ => Forwarded::Other,
                };
                lock(&pending).insert(text(id), forwarded);
            }
            if verdict.decision != Decision::Ask {
                self.audit.record(&AuditRecord::for_request(
                    &evaluator,
                    &request,
                    &verdict,
                    SystemTime::now(),
                ));
                let is_initialize = message.method() == Some("initialize");
                let mut value = message.value;
                if is_initialize {
                    self.strip_capabilities(&mut value);
                }
                self.deliver(&verdict, value, &to_agent, &to_server, &pending);
                continue;
            }
            {
                // Asks wait in their own task: nothing else is held up.
                let value = message.value.clone();
                let (this, to_agent, to_server, pending) = (
                    self.clone(),
                    to_agent.clone(),
                    to_server.clone(),
                    pending.clone(),
                );
                let key = message.id().map(text).unwrap_or_default();
                let withdrawn = CancellationToken::new();
                lock(&asks).insert(key.clone(), withdrawn.clone());
                let asks = asks.clone();
                tokio::spawn(async move {
                    let tool = verdict.tool().unwrap_or_default().to_owned();
                    let mut args = value
                        .pointer("/params/arguments")
                        .cloned()
                        .unwrap_or(Value::Null);
                    let arguments_hash = aip_policy::hash::arguments_hash(&args);
                    if let Some(r) = evaluator.redactor() {
                        r.redact_strings(&mut args, &mut Vec::new());
                    }
                    let held = Ask {
                        tool: tool.clone(),
                        connection: "stdio".to_owned(),
                        arguments: args,
                        arguments_hash,
                    };
                    let token = value.pointer("/params/_meta/progressToken");
                    let answer = tokio::select! {
                        a = this.approvals.ask(held, this.approval_timeout) => Some(a),
                        () = withdrawn.cancelled() => None,
                        () = waiting_progress(token, this.ask_progress_interval, &to_agent) => None,
                    };
                    lock(&asks).remove(&key);
                    let Some(answer) = answer else {
                        lock(&pending).remove(&key);
                        return; // withdrawn: never forwarded, never answered
                    };
                    let verdict = verdict.resolve(answer);
                    this.audit.record(&AuditRecord::for_request(
                        &evaluator,
                        &request_of(&value),
                        &verdict,
                        SystemTime::now(),
                    ));
                    this.deliver(&verdict, value, &to_agent, &to_server, &pending);
                });
            }
        }
    }

    fn deliver(
        &self,
        verdict: &aip_policy::Verdict,
        value: Value,
        to_agent: &mpsc::UnboundedSender<String>,
        to_server: &mpsc::UnboundedSender<String>,
        pending: &Pending,
    ) {
        if verdict.decision == Decision::Allow {
            let _ = to_server.send(text(&value));
            return;
        }
        if let Some(id) = value.get("id") {
            lock(pending).remove(&text(id));
        }
        if let Some(response) = verdict.response() {
            let _ = to_agent.send(text(&response));
        }
    }

    /// Removes client capabilities the server may not use.
    fn strip_capabilities(&self, initialize: &mut Value) {
        if let Some(caps) = initialize
            .pointer_mut("/params/capabilities")
            .and_then(Value::as_object_mut)
        {
            caps.retain(|k, _| {
                !matches!(k.as_str(), "sampling" | "elicitation" | "roots")
                    || self.allow_capabilities.contains(k)
            });
        }
    }

    async fn server_to_agent(
        self: Arc<Self>,
        server_out: tokio::process::ChildStdout,
        to_agent: mpsc::UnboundedSender<String>,
        to_server: mpsc::WeakUnboundedSender<String>,
        pending: Pending,
    ) {
        let limits = Limits::default();
        let mut server_out = BufReader::new(server_out);
        while let Ok(Some(line)) = lines::next_line(&mut server_out, limits.max_bytes).await {
            let Line::Complete(line) = line else {
                tracing::warn!(
                    limit = limits.max_bytes,
                    "the wrapped server wrote a line over the size limit; dropped"
                );
                continue;
            };
            let mut value = match jsonrpc::parse_value(&line, limits) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "the wrapped server wrote a line that is not acceptable JSON; dropped");
                    continue;
                }
            };
            if let Some(refusal) = self.refusal(&value) {
                if let Some(to_server) = to_server.upgrade() {
                    let _ = to_server.send(text(&refusal));
                }
                continue;
            }
            let evaluator = self.config.borrow().evaluator.clone();
            let is_response = value.get("method").is_none();
            let forwarded = value
                .get("id")
                .filter(|_| is_response)
                .and_then(|id| lock(&pending).remove(&text(id)));
            match forwarded {
                Some(Forwarded::ToolsList) => filter_tools(&mut value, &evaluator),
                Some(Forwarded::ToolsCall(_)) | Some(Forwarded::Other) | None => {}
            }
            if let Some(r) = evaluator.redactor() {
                let mut events = Vec::new();
                if let Some(result) = value
                    .get_mut("result")
                    .filter(|_| matches!(forwarded, Some(Forwarded::ToolsCall(_))))
                {
                    events = r.redact_tool_result(result);
                }
                for key in ["error", "params"] {
                    if let Some(v) = value.get_mut(key) {
                        r.redact_strings(v, &mut events);
                    }
                }
                let tool = match &forwarded {
                    Some(Forwarded::ToolsCall(t)) => Some(t.as_str()),
                    _ => None,
                };
                for line in aip_policy::DlpRecord::for_events(&events, tool, SystemTime::now()) {
                    self.audit.record(&line);
                }
            }
            let _ = to_agent.send(text(&value));
        }
    }
}

impl Wrap {
    /// The error answer to a server request for a client capability the
    /// server was not offered; None for anything else.
    fn refusal(&self, message: &Value) -> Option<Value> {
        let id = message.get("id")?;
        let capability = match message.get("method")?.as_str()? {
            "sampling/createMessage" => "sampling",
            "elicitation/create" => "elicitation",
            "roots/list" => "roots",
            _ => return None,
        };
        if self.allow_capabilities.iter().any(|c| c == capability) {
            return None;
        }
        tracing::warn!(
            capability,
            "the wrapped server asked for a capability it was not offered; refused"
        );
        Some(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found",
            "data": format!("the {capability} capability is not offered")}}),
        )
    }
}

/// Whether `message` cancels an ask still waiting (which is then
/// withdrawn).
fn withdraws(message: &jsonrpc::Message, asks: &Asks) -> bool {
    if message.method() != Some("notifications/cancelled") {
        return false;
    }
    let Some(id) = message.params().and_then(|p| p.get("requestId")) else {
        return false;
    };
    match lock(asks).remove(&text(id)) {
        Some(ask) => {
            ask.cancel();
            true
        }
        None => false,
    }
}

/// Withdraws every waiting ask when dropped.
struct Withdraw(Asks);

impl Drop for Withdraw {
    fn drop(&mut self) {
        for (_, ask) in lock(&self.0).drain() {
            ask.cancel();
        }
    }
}

/// While an ask waits, progress every `interval` to a call that asked for
/// it. Never returns.
async fn waiting_progress(
    token: Option<&Value>,
    interval: Duration,
    to_agent: &mpsc::UnboundedSender<String>,
) {
    match token {
        Some(token) => {
            crate::gate::progress_every(token, interval, |note| {
                let _ = to_agent.send(text(&note));
            })
            .await
        }
        None => std::future::pending().await,
    }
}

fn request_of(value: &Value) -> Request<'_> {
    Request::from_value(value).unwrap_or(Request {
        id: None,
        method: "",
        params: None,
    })
}

/// Drops tools the policy hides, marks those that ask.
fn filter_tools(response: &mut Value, evaluator: &Evaluator) {
    let Some(tools) = response
        .pointer_mut("/result/tools")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    tools.retain_mut(|tool| {
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match evaluator.listing(&name) {
            Listing::Hidden => false,
            Listing::Listed => true,
            Listing::Ask => {
                let description = tool
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                tool["description"] = json!(
                    format!("[requires human approval] {description}")
                        .trim_end()
                        .to_owned()
                );
                true
            }
        }
    });
}

/// One task owns each output, so lines never interleave. Whatever is queued
/// goes out in one write. It ends (and its handle completes) once every
/// sender is gone and every line is written.
fn writer<W: AsyncWrite + Unpin + Send + 'static>(
    mut out: W,
    busy: Option<Arc<BusyPoll>>,
) -> (mpsc::UnboundedSender<String>, tokio::task::JoinHandle<()>) {
    const BATCH: usize = 256 * 1024;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let handle = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(16 * 1024);
        while let Some(line) = rx.recv().await {
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
            while buf.len() < BATCH {
                let Ok(more) = rx.try_recv() else { break };
                buf.extend_from_slice(more.as_bytes());
                buf.push(b'\n');
            }
            if out.write_all(&buf).await.and(out.flush().await).is_err() {
                return;
            }
            if let Some(busy) = &busy {
                busy.touch(); // an answer or the next line usually follows
            }
            buf.clear();
        }
        let _ = out.shutdown().await;
    });
    (tx, handle)
}

/// The process's stdin and stdout for the wrap: non-blocking pipes on the
/// event loop when they are pipes (the usual case), tokio's blocking-pool
/// handles otherwise (a terminal, a file).
pub fn agent_stdio() -> (
    Box<dyn AsyncRead + Unpin + Send>,
    Box<dyn AsyncWrite + Unpin + Send>,
) {
    use std::os::fd::AsFd;
    let input: Box<dyn AsyncRead + Unpin + Send> = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_file(std::fs::File::from(fd)).ok())
        .map_or_else(
            || Box::new(tokio::io::stdin()) as Box<dyn AsyncRead + Unpin + Send>,
            |r| Box::new(r),
        );
    let output: Box<dyn AsyncWrite + Unpin + Send> = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Sender::from_file(std::fs::File::from(fd)).ok())
        .map_or_else(
            || Box::new(tokio::io::stdout()) as Box<dyn AsyncWrite + Unpin + Send>,
            |w| Box::new(w),
        );
    (input, output)
}

/// A message (or id) as one JSON line's text: serde's writer straight
/// into the buffer, without the `Display` adapter's overhead.
fn text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

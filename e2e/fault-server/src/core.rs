//! The dispatch core both transports share: MCP methods of both eras, the
//! serial tools/call queue, sequence state and cancellation, and the attempt
//! log.
//!
//! tools/call requests join one queue per server and are played one at a
//! time in arrival order by a single worker; everything else (initialize,
//! server/discover, ping, tools/list) is answered at once, even while a
//! delayed call runs. A legacy request is answered by [`Core::handle`], a
//! modern one by [`Core::handle_modern`]; the transports decide which
//! (see [`crate::era`]).

use aip_service::sync::lock;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::era::{self, Era, META_SERVER_INFO, MODERN_VERSIONS, Rejection, RoutingHeaders};
use crate::log::{Attempt, AttemptLog, AttemptOutcome, canonical_sha256};
use crate::script::{ExpectRetry, OnExhausted, Outcome, Script, ScriptStep};

/// Protocol versions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Who sent a message, as the attempt log records it.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub session: String,
    pub auth_sha256: Option<String>,
    pub protocol_version: Option<String>,
    /// The era the request was served in.
    pub era: Era,
    /// A modern request's declared client capabilities.
    pub client_capabilities: Option<Value>,
}

/// What the transport must do with a tools/call.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A JSON-RPC response (result or error) to send.
    Message(Value),
    /// A wire-level behaviour only the transport can play.
    Wire(Wire),
    /// The call was canceled: send nothing.
    Canceled,
    /// An error the modern HTTP transport answers with this status
    /// (-32021: the call needs a client capability the request lacks).
    Refused { status: u16, response: Value },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Wire {
    Http {
        status: u16,
        headers: Vec<(String, String)>,
        body: Option<String>,
    },
    /// Close the connection (stdio: close stdout and exit) without answering.
    Drop,
    /// Send the first `after_bytes` bytes of `response`, then hang.
    StallBody { after_bytes: usize, response: Value },
    /// Send this text as the response body / line.
    RawBody(String),
    /// SSE priming event with an id and `retry`, then close; `response` is
    /// delivered when the client resumes with Last-Event-ID.
    SseCloseAfterEvent { retry_ms: u64, response: Value },
}

/// The immediate result of handling one incoming message.
pub enum Handled {
    /// Answer now (None: nothing to send, e.g. a notification).
    Now(Option<Value>),
    /// A queued tools/call: the reply arrives on the receiver.
    Later(oneshot::Receiver<Reply>),
    /// Refused before dispatch: this error response, with the HTTP status a
    /// server of the request's era answers it with (stdio sends only the
    /// response).
    Refused { status: u16, response: Value },
    /// A scripted tools/list step: play `reply` after `delay_ms` (cut short
    /// by shutdown), without holding up anything else.
    Delayed { delay_ms: u64, reply: Reply },
}

impl Handled {
    fn refused(rejection: &Rejection, id: &Value) -> Handled {
        Handled::Refused {
            status: rejection.http_status(),
            response: rejection.response(id),
        }
    }
}

struct Job {
    key: (String, String),
    id: Value,
    tool: String,
    arguments: Value,
    /// A multi-round-trip retry's `requestState` and `inputResponses`.
    request_state: Option<Value>,
    input_responses: Option<Value>,
    ctx: CallContext,
    received: Instant,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Job>,
    running: Option<((String, String), CancellationToken)>,
    /// Request ids (per session) queued or running.
    active: HashSet<(String, String)>,
}

/// The call being played: (session, request id as JSON text).
pub type CallKey = (String, String);

pub struct Core {
    pub script: Script,
    pub log: AttemptLog,
    queue: Mutex<Queue>,
    /// Publishes the call being played, so that observers (tests, admin)
    /// can wait for "running" as an event.
    running: watch::Sender<Option<CallKey>>,
    /// Next step per (tool, response): survives sessions, reset by restart.
    cursors: Mutex<HashMap<(usize, usize), usize>>,
    /// Next scripted tools/list step, likewise.
    list_cursor: Mutex<usize>,
    /// Calls queued per tool (for a rug pull), likewise.
    calls: Mutex<HashMap<String, u32>>,
    wake: Notify,
}

impl Core {
    pub fn new(script: Script, log: AttemptLog) -> Arc<Core> {
        Arc::new(Core {
            script,
            log,
            queue: Mutex::new(Queue::default()),
            running: watch::Sender::new(None),
            cursors: Mutex::new(HashMap::new()),
            list_cursor: Mutex::new(0),
            calls: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        })
    }

    /// Watches which call is being played (None when idle).
    pub fn running(&self) -> watch::Receiver<Option<CallKey>> {
        self.running.subscribe()
    }

    /// The request-id form used in [`CallKey`]s.
    pub fn call_key(session: &str, id: &Value) -> CallKey {
        (session.to_owned(), id_key(id))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    /// Handles one parsed JSON-RPC message (not a batch).
    pub fn handle(&self, message: &Value, ctx: &CallContext) -> Handled {
        let Some(obj) = message.as_object() else {
            return Handled::Now(Some(error(&Value::Null, -32600, "Invalid Request", None)));
        };
        let id = obj.get("id").cloned();
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            // A response from the client (we send no requests): ignore it.
            return Handled::Now(None);
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        let Some(id) = id else {
            self.notification(method, &params, ctx);
            return Handled::Now(None);
        };
        if !(id.is_string() || id.is_number()) {
            return Handled::Now(Some(error(
                &Value::Null,
                -32600,
                "Invalid Request: id must be a string or number",
                None,
            )));
        }
        match method {
            "initialize" => Handled::Now(Some(result(&id, self.initialize(&params)))),
            "ping" => Handled::Now(Some(result(&id, json!({})))),
            "tools/list" => self.list_tools(&id, &params, ctx),
            "tools/call" => self.enqueue(id, &params, ctx),
            "resources/list" if !self.script.resources.is_empty() => {
                Handled::Now(Some(self.page(&id, &params, "resources", self.resources())))
            }
            "resources/templates/list" if !self.script.resources.is_empty() => Handled::Now(Some(
                self.page(&id, &params, "resourceTemplates", Vec::new()),
            )),
            "prompts/list" if !self.script.prompts.is_empty() => {
                Handled::Now(Some(self.page(&id, &params, "prompts", self.prompts())))
            }
            "resources/read" if !self.script.resources.is_empty() => {
                Handled::Now(Some(self.read(&id, &params, Era::Legacy)))
            }
            "prompts/get" if !self.script.prompts.is_empty() => {
                Handled::Now(Some(self.prompt(&id, &params)))
            }
            _ => Handled::Now(Some(error(
                &id,
                -32601,
                "Method not found",
                Some(json!({"method": method})),
            ))),
        }
    }

    /// Handles one modern (2026-07-28) message: the envelope and, on HTTP
    /// (`headers` given), the routing headers are checked first, then the
    /// method; results carry `resultType` and the server's identity in
    /// `_meta`, cacheable ones their cache hints.
    pub fn handle_modern(
        &self,
        message: &Value,
        headers: Option<&RoutingHeaders>,
        ctx: &CallContext,
    ) -> Handled {
        let invalid = |text: &str| Handled::Refused {
            status: 400,
            response: error(&Value::Null, -32600, text, None),
        };
        let Some(obj) = message.as_object() else {
            return invalid("Invalid Request: not a JSON-RPC message");
        };
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            return invalid("Invalid Request: a client sends requests and notifications only");
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        let Some(id) = obj.get("id").cloned() else {
            // Accepted and, but for stdio's notifications/cancelled, dropped;
            // only a version this server does not speak is refused.
            let claimed = params
                .get("_meta")
                .and_then(|m| m.get(era::META_PROTOCOL_VERSION))
                .and_then(Value::as_str)
                .or(headers.and_then(|h| h.protocol_version.as_deref()));
            if let Some(v) = claimed.filter(|v| !MODERN_VERSIONS.contains(v)) {
                return Handled::refused(&era::unsupported_version(Some(v)), &Value::Null);
            }
            self.notification(method, &params, ctx);
            return Handled::Now(None);
        };
        if !(id.is_string() || id.is_number()) {
            return invalid("Invalid Request: id must be a string or number");
        }
        let envelope = match era::check_envelope(message, headers) {
            Ok(e) => e,
            Err(rejection) => return Handled::refused(&rejection, &id),
        };
        let ctx = CallContext {
            era: Era::Modern,
            protocol_version: Some(envelope.protocol_version),
            client_capabilities: Some(envelope.client_capabilities),
            ..ctx.clone()
        };
        let resources = !self.script.resources.is_empty();
        let prompts = !self.script.prompts.is_empty();
        let (reply, cacheable) = match method {
            "server/discover" => (result(&id, self.discover()), true),
            "tools/list" => return self.list_tools(&id, &params, &ctx),
            "tools/call" => {
                if let Some(rejection) = headers.and_then(|h| self.param_rejection(&params, h)) {
                    return Handled::refused(&rejection, &id);
                }
                return self.enqueue(id, &params, &ctx);
            }
            "resources/list" if resources => {
                (self.page(&id, &params, "resources", self.resources()), true)
            }
            "resources/templates/list" if resources => (
                self.page(&id, &params, "resourceTemplates", Vec::new()),
                true,
            ),
            "resources/read" if resources => (self.read(&id, &params, Era::Modern), true),
            "prompts/list" if prompts => (self.page(&id, &params, "prompts", self.prompts()), true),
            "prompts/get" if prompts => (self.prompt(&id, &params), false),
            // Unknown, removed in 2026-07-28 (initialize, ping,
            // logging/setLevel, resources/subscribe|unsubscribe), or behind
            // a capability this server does not declare.
            _ => {
                let rejection = Rejection {
                    data: Some(json!({"method": method})),
                    ..Rejection::new(-32601, "Method not found")
                };
                return Handled::refused(&rejection, &id);
            }
        };
        Handled::Now(Some(self.modern_result(reply, cacheable)))
    }

    /// What a modern-only server answers legacy traffic with: `initialize`
    /// (or any request without an envelope) is told the versions it speaks;
    /// a legacy notification is accepted and dropped; a posted response is
    /// invalid. `header_version` is the request's MCP-Protocol-Version.
    pub fn refuse_legacy(&self, message: &Value, header_version: Option<&str>) -> Handled {
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return Handled::Refused {
                status: 400,
                response: error(
                    &Value::Null,
                    -32600,
                    "Invalid Request: a client sends requests and notifications only",
                    None,
                ),
            };
        };
        let Some(id) = message.get("id") else {
            return Handled::Now(None);
        };
        let requested = if method == "initialize" {
            message
                .pointer("/params/protocolVersion")
                .and_then(Value::as_str)
        } else {
            header_version
        };
        Handled::refused(&era::unsupported_version(requested), id)
    }

    /// `server/discover`: the modern versions, and the capabilities the
    /// script gives the server.
    fn discover(&self) -> Value {
        json!({"supportedVersions": MODERN_VERSIONS, "capabilities": self.capabilities()})
    }

    fn server_info(&self) -> Value {
        json!({"name": self.script.name, "version": env!("CARGO_PKG_VERSION")})
    }

    /// A modern result: `resultType` (complete unless the result says
    /// otherwise), the server's identity in `_meta`, and for a cacheable
    /// complete result the script's cache hints. Errors pass unchanged.
    fn modern_result(&self, mut message: Value, cacheable: bool) -> Value {
        let info = self.server_info();
        let caching = self.script.caching;
        if let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) {
            let kind = result
                .entry("resultType")
                .or_insert_with(|| json!("complete"));
            let complete = kind == "complete";
            let meta = result.entry("_meta").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(META_SERVER_INFO.to_owned(), info);
            }
            if cacheable && complete {
                result.insert("ttlMs".to_owned(), json!(caching.ttl_ms));
                result.insert("cacheScope".to_owned(), json!(caching.cache_scope.as_str()));
            }
        }
        message
    }

    /// A modern tools/call's `Mcp-Param-*` headers against its arguments,
    /// for a tool the script declares.
    fn param_rejection(&self, params: &Value, headers: &RoutingHeaders) -> Option<Rejection> {
        let name = params.get("name").and_then(Value::as_str)?;
        let (_, tool) = self.script.tool(name)?;
        let arguments = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        era::check_param_headers(&tool.input_schema, &arguments, headers).err()
    }

    /// tools/list: the next scripted step while there is one (logged as an
    /// attempt when it is chosen, before its delay), else the listing.
    fn list_tools(&self, id: &Value, params: &Value, ctx: &CallContext) -> Handled {
        let listing = || {
            let page = self.page(id, params, "tools", self.tools());
            match ctx.era {
                Era::Modern => self.modern_result(page, true),
                Era::Legacy => page,
            }
        };
        let steps = &self.script.tools_list;
        let index = {
            let mut cursor = lock(&self.list_cursor);
            let index = *cursor;
            if index < steps.len() {
                *cursor += 1;
            }
            index
        };
        let Some(step) = steps.get(index) else {
            return Handled::Now(Some(listing()));
        };
        let (reply, outcome) = match &step.outcome {
            Outcome::List => (Reply::Message(listing()), AttemptOutcome::Delivered),
            Outcome::StallBody(after_bytes) => (
                Reply::Wire(Wire::StallBody {
                    after_bytes: *after_bytes,
                    response: listing(),
                }),
                AttemptOutcome::FixtureError,
            ),
            other => {
                let (reply, outcome, _) = render(id, other);
                (reply, outcome)
            }
        };
        let mut arguments = params.as_object().cloned().unwrap_or_default();
        arguments.remove("_meta");
        let mut attempt = self.attempt(id, None, &Value::Object(arguments), ctx, outcome);
        attempt.method = "tools/list";
        attempt.step_index = Some(index);
        attempt.steps_total = Some(steps.len());
        attempt.step = Some(step.outcome.kind());
        attempt.delay_ms = step.delay_ms;
        self.log.record(attempt);
        Handled::Delayed {
            delay_ms: step.delay_ms,
            reply,
        }
    }

    /// The protocol version to answer initialize with.
    pub fn negotiate(requested: Option<&str>) -> &'static str {
        PROTOCOL_VERSIONS
            .iter()
            .find(|v| Some(**v) == requested)
            .copied()
            .unwrap_or(PROTOCOL_VERSIONS[0])
    }

    fn initialize(&self, params: &Value) -> Value {
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        json!({
            "protocolVersion": Core::negotiate(requested),
            "capabilities": self.capabilities(),
            "serverInfo": {"name": self.script.name, "version": env!("CARGO_PKG_VERSION")},
        })
    }

    fn capabilities(&self) -> Value {
        let mut capabilities = json!({"tools": {"listChanged": false}});
        if !self.script.resources.is_empty() {
            capabilities["resources"] = json!({"listChanged": false});
        }
        if !self.script.prompts.is_empty() {
            capabilities["prompts"] = json!({"listChanged": false});
        }
        capabilities
    }

    fn tools(&self) -> Vec<Value> {
        self.script
            .tools
            .iter()
            .map(|t| {
                let mut tool = json!({"name": t.name, "inputSchema": t.input_schema});
                let pulled = t.rug_pull.as_ref().filter(|rug| {
                    let calls = lock(&self.calls);
                    calls.get(&t.name).copied().unwrap_or(0) >= rug.after_calls
                });
                match (pulled, &t.description) {
                    (Some(rug), _) => tool["description"] = json!(rug.description),
                    (None, Some(d)) => tool["description"] = json!(d),
                    (None, None) => {}
                }
                tool
            })
            .collect()
    }

    fn resources(&self) -> Vec<Value> {
        (self.script.resources.iter())
            .map(|r| json!({"uri": r.uri, "name": r.name, "mimeType": "text/plain"}))
            .collect()
    }

    fn prompts(&self) -> Vec<Value> {
        (self.script.prompts.iter())
            .map(|p| match &p.description {
                Some(d) => json!({"name": p.name, "description": d}),
                None => json!({"name": p.name}),
            })
            .collect()
    }

    /// One page of `items` under `key`: all of them without a page size;
    /// otherwise from the offset the cursor (`page-N`) names, with the next
    /// page's cursor if there is one.
    fn page(&self, id: &Value, params: &Value, key: &str, items: Vec<Value>) -> Value {
        let Some(size) = self.script.page_size else {
            return result(id, json!({ key: items }));
        };
        let start = match params.get("cursor") {
            None => 0,
            Some(cursor) => match cursor
                .as_str()
                .and_then(|c| c.strip_prefix("page-"))
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n <= items.len())
            {
                Some(n) => n,
                None => return error(id, -32602, "Invalid cursor", None),
            },
        };
        let end = (start + size).min(items.len());
        let mut page = json!({ key: items[start..end] });
        if end < items.len() {
            page["nextCursor"] = json!(format!("page-{end}"));
        }
        result(id, page)
    }

    /// resources/read; an unknown URI is -32002 to a legacy client and
    /// -32602 to a modern one (2026-07-28 retired -32002).
    fn read(&self, id: &Value, params: &Value, era: Era) -> Value {
        let uri = params
            .get("uri")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match self.script.resources.iter().find(|r| r.uri == uri) {
            Some(r) => result(
                id,
                json!({"contents": [{"uri": r.uri, "mimeType": "text/plain", "text": r.text}]}),
            ),
            None => {
                let code = if era == Era::Modern { -32602 } else { -32002 };
                error(id, code, "Resource not found", Some(json!({"uri": uri})))
            }
        }
    }

    fn prompt(&self, id: &Value, params: &Value) -> Value {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match self.script.prompts.iter().find(|p| p.name == name) {
            Some(p) => result(
                id,
                json!({"messages": [{"role": "user", "content": {"type": "text", "text": p.text}}]}),
            ),
            None => error(id, -32602, &format!("Unknown prompt: {name}"), None),
        }
    }

    fn notification(&self, method: &str, params: &Value, ctx: &CallContext) {
        if method == "notifications/cancelled"
            && let Some(id) = params.get("requestId")
        {
            self.cancel(&(ctx.session.clone(), id_key(id)));
        }
        // notifications/initialized and anything else: accepted, nothing to do.
    }

    fn enqueue(&self, id: Value, params: &Value, ctx: &CallContext) -> Handled {
        let tool = params.get("name").and_then(Value::as_str);
        let arguments = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let Some(tool) = tool.filter(|_| arguments.is_object()) else {
            let e = error(
                &id,
                -32602,
                "Invalid params: tools/call needs a string name and object arguments",
                None,
            );
            return Handled::Now(Some(e));
        };
        let key = (ctx.session.clone(), id_key(&id));
        let mut queue = self.queue();
        let attempt = |outcome| self.attempt(&id, Some(tool), &arguments, ctx, outcome);
        if queue.active.contains(&key) {
            drop(queue);
            self.log.record(attempt(AttemptOutcome::RejectedDuplicate));
            return Handled::Now(Some(error(
                &id,
                -32600,
                "Invalid Request: duplicate active request id",
                None,
            )));
        }
        let pending = queue.waiting.len() + usize::from(queue.running.is_some());
        if pending >= self.script.max_pending {
            drop(queue);
            self.log.record(attempt(AttemptOutcome::RejectedOverflow));
            let data = json!({"limit": self.script.max_pending});
            return Handled::Now(Some(error(
                &id,
                -32000,
                "Too many pending calls",
                Some(data),
            )));
        }
        let (tx, rx) = oneshot::channel();
        *lock(&self.calls).entry(tool.to_owned()).or_default() += 1;
        queue.active.insert(key.clone());
        queue.waiting.push_back(Job {
            key,
            id,
            tool: tool.to_owned(),
            arguments,
            request_state: params.get("requestState").cloned(),
            input_responses: params.get("inputResponses").cloned(),
            ctx: ctx.clone(),
            received: Instant::now(),
            reply: tx,
        });
        drop(queue);
        self.wake.notify_one();
        Handled::Later(rx)
    }

    /// Cancels a queued call (removed, no step consumed) or the running one
    /// (its delay is cut short, its step stays consumed). Unknown ids are
    /// ignored.
    pub fn cancel(&self, key: &(String, String)) {
        let mut queue = self.queue();
        if let Some(pos) = queue.waiting.iter().position(|j| &j.key == key) {
            let job = queue.waiting.remove(pos).expect("position is in range");
            queue.active.remove(key);
            drop(queue);
            self.log
                .record(self.job_attempt(&job, AttemptOutcome::CanceledQueued));
            let _ = job.reply.send(Reply::Canceled);
        } else if let Some((running, token)) = &queue.running
            && running == key
        {
            token.cancel();
        }
    }

    /// Cancels every call of a session (it ended).
    pub fn cancel_session(&self, session: &str) {
        let keys: Vec<(String, String)> = {
            let queue = self.queue();
            queue
                .active
                .iter()
                .filter(|(s, _)| s == session)
                .cloned()
                .collect()
        };
        for key in keys {
            self.cancel(&key);
        }
    }

    /// The worker: plays queued calls one at a time until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let job = loop {
                if let Some(job) = self.take_next() {
                    break job;
                }
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = shutdown.cancelled() => return,
                }
            };
            let token = self
                .queue()
                .running
                .as_ref()
                .map(|(_, t)| t.clone())
                .unwrap_or_default();
            tracing::debug!(session = %job.key.0, request_id = %job.key.1, tool = %job.tool, "call running");
            self.running.send_replace(Some(job.key.clone()));
            let reply = tokio::select! {
                r = self.play(&job, &token) => r,
                () = shutdown.cancelled() => Reply::Canceled,
            };
            {
                let mut queue = self.queue();
                queue.running = None;
                queue.active.remove(&job.key);
            }
            self.running.send_replace(None);
            let _ = job.reply.send(reply);
        }
    }

    fn take_next(&self) -> Option<Job> {
        let mut queue = self.queue();
        let job = queue.waiting.pop_front()?;
        queue.running = Some((job.key.clone(), CancellationToken::new()));
        Some(job)
    }

    async fn play(&self, job: &Job, canceled: &CancellationToken) -> Reply {
        let reply = self.play_step(job, canceled).await;
        if job.ctx.era != Era::Modern {
            return reply;
        }
        match reply {
            Reply::Message(m) => Reply::Message(self.modern_result(m, false)),
            Reply::Wire(Wire::StallBody {
                after_bytes,
                response,
            }) => Reply::Wire(Wire::StallBody {
                after_bytes,
                response: self.modern_result(response, false),
            }),
            other => other,
        }
    }

    async fn play_step(&self, job: &Job, canceled: &CancellationToken) -> Reply {
        let Some((t, tool)) = self.script.tool(&job.tool) else {
            self.log
                .record(self.job_attempt(job, AttemptOutcome::UnknownTool));
            return Reply::Message(tool_error(&job.id, &format!("unknown tool: {}", job.tool)));
        };
        let Some(r) = tool
            .responses
            .iter()
            .position(|r| r.matcher.matches(&job.arguments))
        else {
            self.log
                .record(self.job_attempt(job, AttemptOutcome::Unmatched));
            return Reply::Message(tool_error(
                &job.id,
                "no scripted response matches these arguments",
            ));
        };
        let steps = &tool.responses[r].steps;
        let repeat = tool.responses[r].repeat;
        let mut attempt = self.job_attempt(job, AttemptOutcome::Exhausted);
        attempt.response_index = Some(r);
        attempt.steps_total = Some(steps.len());
        let index = {
            let mut cursors = lock(&self.cursors);
            let cursor = cursors.entry((t, r)).or_insert(0);
            if repeat && *cursor >= steps.len() {
                *cursor = 0;
            }
            let index = *cursor;
            if let Some(step) = steps.get(index) {
                if let Err((reply, outcome)) = admit(job, step) {
                    drop(cursors);
                    attempt.step_index = Some(index);
                    attempt.step = Some(step.outcome.kind());
                    attempt.outcome = outcome;
                    attempt.is_error = outcome == AttemptOutcome::WrongEra;
                    self.log.record(attempt);
                    return reply;
                }
                *cursor += 1; // consumed now, whatever happens next
            }
            index
        };
        let Some(step) = steps.get(index) else {
            attempt.is_error = self.script.on_exhausted == OnExhausted::ToolError;
            self.log.record(attempt);
            return self.exhausted(&job.id);
        };
        attempt.step_index = Some(index);
        attempt.step = Some(step.outcome.kind());
        attempt.delay_ms = step.delay_ms;
        if step.delay_ms > 0 {
            let delay = tokio::time::sleep(std::time::Duration::from_millis(step.delay_ms));
            tokio::select! {
                () = delay => {}
                () = canceled.cancelled() => {
                    attempt.outcome = AttemptOutcome::CanceledRunning;
                    attempt.latency_ms = elapsed_ms(job.received);
                    self.log.record(attempt);
                    return Reply::Canceled;
                }
            }
        }
        let (reply, mut outcome, is_error) = render(&job.id, &step.outcome);
        if job.ctx.era == Era::Modern && matches!(step.outcome, Outcome::SseCloseAfterEvent { .. })
        {
            // No resumption in 2026-07-28: the stream's close loses the call.
            outcome = AttemptOutcome::FixtureError;
        }
        attempt.outcome = outcome;
        attempt.is_error = is_error;
        attempt.latency_ms = elapsed_ms(job.received);
        self.log.record(attempt);
        reply
    }

    fn exhausted(&self, id: &Value) -> Reply {
        match self.script.on_exhausted {
            OnExhausted::ToolError => Reply::Message(tool_error(id, "scripted sequence exhausted")),
            OnExhausted::JsonrpcError => {
                Reply::Message(error(id, -32603, "Scripted sequence exhausted", None))
            }
            OnExhausted::Close => Reply::Wire(Wire::Drop),
        }
    }

    fn job_attempt(&self, job: &Job, outcome: AttemptOutcome) -> Attempt {
        let mut a = self.attempt(&job.id, Some(&job.tool), &job.arguments, &job.ctx, outcome);
        a.latency_ms = elapsed_ms(job.received);
        a.is_error = matches!(
            outcome,
            AttemptOutcome::UnknownTool | AttemptOutcome::Unmatched
        );
        a
    }

    fn attempt(
        &self,
        id: &Value,
        tool: Option<&str>,
        arguments: &Value,
        ctx: &CallContext,
        outcome: AttemptOutcome,
    ) -> Attempt {
        Attempt {
            ts: String::new(),
            seq: 0,
            session: ctx.session.clone(),
            request_id: id.clone(),
            method: "tools/call",
            tool: tool.map(str::to_owned),
            response_index: None,
            step_index: None,
            steps_total: None,
            outcome,
            step: None,
            is_error: false,
            delay_ms: 0,
            latency_ms: 0,
            args_sha256: canonical_sha256(arguments),
            args: self.log.include_args().then(|| arguments.clone()),
            auth_sha256: ctx.auth_sha256.clone(),
            protocol_version: ctx.protocol_version.clone(),
        }
    }
}

/// Whether `step` may be played to `job`; if not, what the job gets
/// instead (the step is not consumed). A step that expects a retry needs
/// its `requestState` and `inputResponses`; an `input_required` step needs
/// a modern request whose client capabilities cover what it asks for.
fn admit(job: &Job, step: &ScriptStep) -> Result<(), (Reply, AttemptOutcome)> {
    if let Some(expected) = &step.expect_retry
        && let Some(problem) = retry_problem(expected, job)
    {
        let e = error(&job.id, -32602, &format!("Invalid params: {problem}"), None);
        return Err((Reply::Message(e), AttemptOutcome::RetryMismatch));
    }
    let Outcome::InputRequired { input_requests, .. } = &step.outcome else {
        return Ok(());
    };
    if job.ctx.era == Era::Legacy {
        let text = "this step asks the client for input (input_required), which only a 2026-07-28 request can be given";
        return Err((
            Reply::Message(tool_error(&job.id, text)),
            AttemptOutcome::WrongEra,
        ));
    }
    let Some(required) = missing_capabilities(
        input_requests.as_ref(),
        job.ctx.client_capabilities.as_ref(),
    ) else {
        return Ok(());
    };
    let names: Vec<&str> = required
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    let rejection = Rejection {
        data: Some(json!({"requiredCapabilities": required})),
        ..Rejection::new(
            era::MISSING_CLIENT_CAPABILITY,
            format!(
                "Missing required client capability: this call asks for input that needs {}",
                names.join(" and ")
            ),
        )
    };
    Err((
        Reply::Refused {
            status: rejection.http_status(),
            response: rejection.response(&job.id),
        },
        AttemptOutcome::MissingCapability,
    ))
}

/// What is wrong with a retry, measured against what the step expects.
fn retry_problem(expected: &ExpectRetry, job: &Job) -> Option<String> {
    match (&expected.request_state, &job.request_state) {
        (None, Some(_)) => return Some("requestState was not issued for this call".to_owned()),
        (Some(_), None) => return Some("requestState is missing from the retry".to_owned()),
        (Some(want), Some(got)) if got.as_str() != Some(want.as_str()) => {
            return Some("requestState does not match the one issued".to_owned());
        }
        _ => {}
    }
    for (key, want) in &expected.input_responses {
        match job.input_responses.as_ref().and_then(|r| r.get(key)) {
            None => return Some(format!("inputResponses.{key} is missing")),
            Some(got) if !crate::log::canonical_eq(want, got) => {
                return Some(format!(
                    "inputResponses.{key} is not the response the script expects"
                ));
            }
            Some(_) => {}
        }
    }
    None
}

/// The client capabilities the input requests need that `declared` lacks,
/// as a ClientCapabilities object (None: all declared). Elicitation `{}`
/// means form mode only; URL mode needs `url`.
fn missing_capabilities(requests: Option<&Value>, declared: Option<&Value>) -> Option<Value> {
    let empty = json!({});
    let declared = declared.unwrap_or(&empty);
    let mut missing = serde_json::Map::new();
    for request in requests
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(_, r)| r)
    {
        let method = request
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match method {
            "elicitation/create" => {
                let url = request.pointer("/params/mode").and_then(Value::as_str) == Some("url");
                let mode = if url { "url" } else { "form" };
                let supported = declared
                    .get("elicitation")
                    .is_some_and(|e| e.get(mode).is_some() || (!url && e.get("url").is_none()));
                if !supported {
                    let entry = missing.entry("elicitation").or_insert_with(|| json!({}));
                    entry[mode] = json!({});
                }
            }
            "sampling/createMessage" if declared.get("sampling").is_none() => {
                missing.insert("sampling".to_owned(), json!({}));
            }
            "roots/list" if declared.get("roots").is_none() => {
                missing.insert("roots".to_owned(), json!({}));
            }
            _ => {}
        }
    }
    (!missing.is_empty()).then_some(Value::Object(missing))
}

/// Turns a step into what the transport sends, with its log outcome and
/// whether the tool result is an error.
fn render(id: &Value, outcome: &Outcome) -> (Reply, AttemptOutcome, bool) {
    use AttemptOutcome::{Delivered, FixtureError};
    match outcome {
        // tools/list's own outcome: validation keeps it out of tool steps.
        Outcome::List => (
            Reply::Message(tool_error(id, "a tools/list step played for tools/call")),
            FixtureError,
            true,
        ),
        Outcome::Return(v) => (Reply::Message(result(id, tool_result(v))), Delivered, false),
        Outcome::Oversize(bytes) => {
            let text = "x".repeat(*bytes);
            let r = json!({"content": [{"type": "text", "text": text}]});
            (Reply::Message(result(id, r)), Delivered, false)
        }
        Outcome::Error(message) => (Reply::Message(tool_error(id, message)), FixtureError, true),
        Outcome::JsonRpcError {
            code,
            message,
            data,
        } => (
            Reply::Message(error(id, *code, message, data.clone())),
            FixtureError,
            false,
        ),
        Outcome::Http {
            status,
            headers,
            body,
        } => {
            let headers = headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let wire = Wire::Http {
                status: *status,
                headers,
                body: body.clone(),
            };
            (Reply::Wire(wire), FixtureError, false)
        }
        Outcome::Drop => (Reply::Wire(Wire::Drop), FixtureError, false),
        Outcome::InputRequired {
            input_requests,
            request_state,
        } => {
            let mut r = json!({"resultType": "input_required"});
            if let Some(requests) = input_requests {
                r["inputRequests"] = requests.clone();
            }
            if let Some(state) = request_state {
                r["requestState"] = json!(state);
            }
            (Reply::Message(result(id, r)), Delivered, false)
        }
        Outcome::StallBody(after_bytes) => {
            let response = result(id, tool_result(&json!({"stalled": true})));
            (
                Reply::Wire(Wire::StallBody {
                    after_bytes: *after_bytes,
                    response,
                }),
                FixtureError,
                false,
            )
        }
        Outcome::RawBody(text) => (
            Reply::Wire(Wire::RawBody(text.clone())),
            FixtureError,
            false,
        ),
        Outcome::SseCloseAfterEvent { retry_ms } => {
            let response = result(id, tool_result(&json!({"resumed": true})));
            (
                Reply::Wire(Wire::SseCloseAfterEvent {
                    retry_ms: *retry_ms,
                    response,
                }),
                Delivered,
                false,
            )
        }
    }
}

/// A `return` step's tool result: the value as JSON text content, and as
/// structured content when it is an object.
fn tool_result(value: &Value) -> Value {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut r = json!({"content": [{"type": "text", "text": text}], "isError": false});
    if value.is_object() {
        r["structuredContent"] = value.clone();
    }
    r
}

fn tool_error(id: &Value, message: &str) -> Value {
    result(
        id,
        json!({"content": [{"type": "text", "text": message}], "isError": true}),
    )
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub fn error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message});
    if let Some(d) = data {
        e["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

/// Request ids are compared by their JSON text, so 1 and "1" differ.
fn id_key(id: &Value) -> String {
    id.to_string()
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

//! What upstream servers say to an agent while one of its requests is being
//! served: progress and logging notifications, and the requests a server
//! makes of the client (sampling, elicitation, roots) on connections that
//! opted in. One upstream session serves every agent, so nothing the agent
//! chose is sent upstream as is: progress tokens and the ids of relayed
//! requests are the gateway's own, mapped back on the way to the agent, and
//! an agent's reply reaches only the server that asked, once.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aip_mcp::jsonrpc::Message;
use aip_mcp::modern::META_CAPABILITIES;
use aip_mcp::protocol::Outgoing;
use aip_mcp::{Exchange, Failure};
use aip_policy::{Direction, DlpRecord, Evaluator, codes};
use aip_service::sync::lock;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::call::{Call, Ids};
use super::present::{Findings, error_object, redact_for_agent};
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// The input requests a modern agent declared it can answer, that its
/// call's connection also offers; none for a legacy agent or a modern
/// server (which asks in its own results).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Answerable {
    elicitation: bool,
    sampling: bool,
    roots: bool,
}

impl Answerable {
    pub(super) fn of(caller: &Call, connection: &ConnectionState, request: &Value) -> Self {
        if !caller.era.answers_by_retry() || connection.upstream.modern() {
            return Answerable::default();
        }
        let declared = aip_mcp::modern::meta(request).and_then(|m| m.get(META_CAPABILITIES));
        let has = |name: &str| declared.is_some_and(|c| c.get(name).is_some());
        let offered = connection.connection().capabilities;
        Answerable {
            elicitation: offered.elicitation && has("elicitation"),
            sampling: offered.sampling && has("sampling"),
            roots: offered.roots && has("roots"),
        }
    }

    pub(super) fn any(self) -> bool {
        self.elicitation || self.sampling || self.roots
    }

    pub(super) fn covers(self, method: &str) -> bool {
        match method {
            "elicitation/create" => self.elicitation,
            "sampling/createMessage" => self.sampling,
            "roots/list" => self.roots,
            _ => false,
        }
    }
}

/// A server's request of the agent, redacted, to be put as an input
/// request.
pub(super) struct Question {
    pub(super) id: Value,
    pub(super) method: String,
    pub(super) params: Value,
}

impl Question {
    pub(super) fn from_request(mut request: Value) -> Question {
        Question {
            id: request["id"].take(),
            method: request["method"].as_str().unwrap_or_default().to_owned(),
            params: request
                .get_mut("params")
                .map(Value::take)
                .unwrap_or(json!({})),
        }
    }
}

/// An upstream exchange waiting for the agent's answer.
pub(super) struct Waiting {
    pub(super) upstream: Detached,
    pub(super) heard: mpsc::UnboundedReceiver<Value>,
    pub(super) upstream_token: Option<Value>,
    /// The gateway's id of the upstream request.
    pub(super) upstream_id: Value,
}

/// Aborts a detached exchange's task when its call is dropped unanswered.
pub(super) struct AbortOnDrop(pub(super) Option<AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The relay: calls to servers with what the servers say meanwhile, and
/// the requests made of agents awaiting their reply.
pub(super) struct Relay {
    /// (agent session, agent-facing id as JSON text) -> where the reply
    /// goes.
    relayed: Mutex<HashMap<(String, String), Awaiting>>,
    ids: Ids,
    audit: Arc<Audit>,
}

/// What became of a relayed call.
pub(super) enum Outcome {
    /// The server's answer or failure; None when the agent cancelled.
    Done(Option<Result<Exchange, Failure>>),
    /// The server asked a modern agent for input: the call, as sent
    /// upstream, is to wait parked (its exchange still open).
    Asked {
        request: Value,
        question: Question,
        waiting: Waiting,
    },
}

/// Whether no more calls may wait parked (asked before a server's question
/// is put to a modern agent).
pub(super) type ParkingFull<'a> = &'a (dyn Fn() -> bool + Sync);

/// Where an agent's reply goes.
pub(super) enum Awaiting {
    /// A request a server made of the agent: back to that server.
    Server(RelayedRequest),
    /// A request the gateway made of the agent on a server's behalf (a
    /// modern server's input request, for a legacy agent): to the gateway.
    Own(oneshot::Sender<Value>),
}

/// A request a server made of an agent, relayed and awaiting the reply.
pub(super) struct RelayedRequest {
    connection: Arc<ConnectionState>,
    upstream_id: Value,
}

/// One upstream request's relaying: the agent's progress token and the
/// gateway's stand-in for it, and the server requests relayed meanwhile
/// (their agent-facing keys, forgotten when the request ends).
pub(super) struct CallRelay<'a> {
    relay: &'a Relay,
    parking_full: ParkingFull<'a>,
    connection: &'a Arc<ConnectionState>,
    caller: &'a Call,
    agent_token: Option<Value>,
    upstream_token: Option<Value>,
    relayed: Vec<(String, String)>,
    /// Whether log messages may reach the agent: a modern request opts in
    /// with `_meta` logLevel, and hears none without it.
    logs: bool,
    /// For a modern agent in front of a legacy server: the input requests
    /// the agent declared it can answer (`_meta` clientCapabilities), which
    /// the gateway turns into `input_required` (bridge.rs).
    answerable: Answerable,
}

/// How one stretch of relaying a call ended.
pub(super) enum Pumped {
    Done(Result<Exchange, Failure>),
    Cancelled,
    /// The server asked the modern agent for input: the call waits parked.
    Asked(Question),
}

/// The upstream exchange of a call that may be parked: spawned, so that it
/// can outlive the agent's request.
pub(super) type Detached =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Exchange, Failure>> + Send>>;

impl Relay {
    pub(super) fn new(ids: Ids, audit: Arc<Audit>) -> Relay {
        Relay {
            relayed: Mutex::default(),
            ids,
            audit,
        }
    }

    /// Awaits the agent's reply to request `id` of `session`, which the
    /// gateway makes of it on a server's behalf: the reply goes to `waiter`.
    pub(super) fn expect_reply(&self, session: &str, id: &Value, waiter: oneshot::Sender<Value>) {
        let key = (session.to_owned(), id.to_string());
        lock(&self.relayed).insert(key, Awaiting::Own(waiter));
    }

    /// Stops awaiting the reply to request `id` of `session`.
    pub(super) fn forget_reply(&self, session: &str, id: &Value) {
        lock(&self.relayed).remove(&(session.to_owned(), id.to_string()));
    }

    /// Sends `request` to a server of the agent's own era and relays what
    /// the server says meanwhile: nothing of such a call is parked (that
    /// takes the era bridge). None when the call is cancelled first.
    pub(super) async fn forward(
        &self,
        connection: &Arc<ConnectionState>,
        request: Value,
        source: Option<Bytes>,
        caller: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        let no_room = || true;
        let sending = Sending { request, source };
        match self.call(connection, sending, caller, &no_room).await {
            Outcome::Done(done) => done,
            Outcome::Asked { .. } => Some(Err(Failure::Malformed(
                "a server question only the era bridge can carry".into(),
            ))),
        }
    }

    /// Sends `request` (which has its gateway id) to `connection` and relays
    /// what the server says about it meanwhile. None when the call is cancelled
    /// first: the upstream is then told, and nothing more is relayed.
    pub(super) async fn call(
        &self,
        connection: &Arc<ConnectionState>,
        sending: impl Into<Sending>,
        caller: &Call,
        parking_full: ParkingFull<'_>,
    ) -> Outcome {
        use tracing::Instrument;
        let sending = sending.into();
        let span = tracing::info_span!(target: aip_service::TRACE_TARGET, "mcp.upstream",
            otel.kind = "client",
            rpc.method = sending.request["method"].as_str().unwrap_or_default(),
            aip.connection = connection.connection().name.as_str(),
            aip.outcome = tracing::field::Empty);
        let outcome = self
            .relay_call(connection, sending, caller, parking_full)
            .instrument(span.clone())
            .await;
        let described = match &outcome {
            Outcome::Done(None) => "cancelled",
            Outcome::Done(Some(Ok(_))) | Outcome::Asked { .. } => "ok",
            Outcome::Done(Some(Err(failure))) => failure.class(),
        };
        span.record("aip.outcome", described);
        outcome
    }

    async fn relay_call(
        &self,
        connection: &Arc<ConnectionState>,
        sending: Sending,
        caller: &Call,
        parking_full: ParkingFull<'_>,
    ) -> Outcome {
        let Sending {
            mut request,
            mut source,
        } = sending;
        let agent_token = aip_mcp::protocol::progress_token(&request).cloned();
        let logs = caller.era.logs_unasked()
            || aip_mcp::modern::meta(&request)
                .is_some_and(|m| m.contains_key(aip_mcp::modern::META_LOG_LEVEL));
        let upstream_token = agent_token.as_ref().map(|_| json!(self.ids.fresh()));
        if pass_trace_on(&mut request) {
            source = None; // the agent's text says nothing of the trace
        }
        let meta = request.get_mut("params").and_then(|p| p.get_mut("_meta"));
        if let (Some(token), Some(meta)) = (&upstream_token, meta) {
            meta["progressToken"] = token.clone();
            source = None; // nor of the gateway's progress token
        }
        let answerable = Answerable::of(caller, connection, &request);
        let mut call = CallRelay {
            relay: self,
            parking_full,
            connection,
            caller,
            agent_token,
            upstream_token,
            relayed: Vec::new(),
            logs,
            answerable,
        };
        let (related, mut heard) = mpsc::unbounded_channel();
        if answerable.any() {
            let detached = detach(connection, &request, related);
            return self.pump_detached(call, detached, heard, request).await;
        }
        let pumped = {
            // Spliced only here, where it is sent as text: a stdio server
            // gets the message written as a line.
            let text = source
                .filter(|_| connection.upstream.is_http())
                .and_then(|source| spliced_call(&source, &request));
            let outgoing = Outgoing {
                message: &request,
                text: text.as_ref().map(|t| t.text.as_slice()),
                meta_at: text.as_ref().and_then(|t| t.meta_at.clone()),
            };
            let upstream = connection
                .upstream
                .request_related(outgoing, Some(&related));
            tokio::pin!(upstream);
            call.pump(&mut upstream, &mut heard).await
        };
        Outcome::Done(self.end_call(call, pumped, &request).await)
    }

    /// Relays a detached call until it ends, or parks it when the server
    /// asks the agent for input (then the agent gets `input_required`).
    pub(super) async fn pump_detached(
        &self,
        mut call: CallRelay<'_>,
        mut upstream: Detached,
        mut heard: mpsc::UnboundedReceiver<Value>,
        request: Value,
    ) -> Outcome {
        match call.pump(&mut upstream, &mut heard).await {
            Pumped::Asked(question) => {
                call.forget();
                let waiting = Waiting {
                    upstream,
                    heard,
                    upstream_token: call.upstream_token.clone(),
                    upstream_id: request["id"].clone(),
                };
                Outcome::Asked {
                    request,
                    question,
                    waiting,
                }
            }
            pumped => Outcome::Done(self.end_call(call, pumped, &request).await),
        }
    }

    /// After the response (or the cancellation): what came just before the
    /// response goes out before it; a cancellation is told upstream.
    async fn end_call(
        &self,
        call: CallRelay<'_>,
        pumped: Pumped,
        request: &Value,
    ) -> Option<Result<Exchange, Failure>> {
        let outcome = match pumped {
            Pumped::Done(outcome) => Some(outcome),
            Pumped::Cancelled | Pumped::Asked(_) => None,
        };
        if outcome.is_none() {
            cancel_upstream(call.connection, &request["id"], "canceled by the agent").await;
        }
        call.forget();
        outcome
    }

    /// The agent's reply to a relayed request: back to the server that
    /// asked, under its own id, after DLP. A reply to nothing pending (never
    /// relayed, already answered, or its call is over) is dropped.
    pub(super) async fn agent_reply(&self, message: Message, caller: &Call) {
        let evaluator = &*caller.evaluator;
        let id = message.id().map(Value::to_string).unwrap_or_default();
        let awaiting = lock(&self.relayed).remove(&(caller.session.clone(), id));
        let relayed = match awaiting {
            Some(Awaiting::Server(relayed)) => relayed,
            Some(Awaiting::Own(waiter)) => {
                let mut reply = message.value;
                self.redact_for_server(&mut reply, evaluator, Direction::Upstream);
                let _ = waiter.send(reply);
                return;
            }
            None => {
                tracing::warn!(id = %message.id().map(|v| v.to_string()).unwrap_or_default(), "a reply to no pending server request was dropped");
                return;
            }
        };
        let mut reply = message.value;
        reply["id"] = relayed.upstream_id;
        for key in ["result", "error"] {
            if let Some(part) = reply.get_mut(key) {
                self.redact_for_server(part, evaluator, Direction::Upstream);
            }
        }
        if let Err(failure) = relayed.connection.upstream.notify(&reply).await {
            let connection = &relayed.connection.connection().name;
            tracing::warn!(connection = %connection, reason = failure.reason(), "an agent's reply could not be delivered");
        }
    }

    /// DLP over every string of `value` going `direction`, each finding
    /// audited: what the agent sends a server (what a server sends the
    /// agent goes through `present::redact_for_agent`).
    pub(super) fn redact_for_server(
        &self,
        value: &mut Value,
        evaluator: &Evaluator,
        direction: Direction,
    ) {
        if let Some(redactor) = evaluator.redactor() {
            let mut events = Vec::new();
            redactor.redact_strings(value, &mut events);
            for mut line in DlpRecord::for_events(&events, None, SystemTime::now()) {
                line.direction = direction;
                self.audit.record(&line);
            }
        }
    }
}

/// Tells `connection` that the gateway gave up on its request `id`.
pub(super) async fn cancel_upstream(connection: &ConnectionState, id: &Value, reason: &str) {
    let notice = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": reason}});
    let _ = Box::pin(connection.upstream.notify(&notice)).await;
}

/// `request` sent on a task of its own, so that its exchange can wait
/// parked while the agent answers the server's question.
fn detach(
    connection: &Arc<ConnectionState>,
    request: &Value,
    related: mpsc::UnboundedSender<Value>,
) -> Detached {
    let connection = connection.clone();
    let request = request.clone();
    let exchange = tokio::spawn(async move {
        connection
            .upstream
            .request_related(&request, Some(&related))
            .await
    });
    let abort = exchange.abort_handle();
    let guard = AbortOnDrop(Some(abort));
    Box::pin(async move {
        let outcome = exchange.await;
        drop(guard);
        outcome.unwrap_or_else(|e| Err(Failure::Malformed(format!("the call's task ended: {e}"))))
    })
}

impl<'a> CallRelay<'a> {
    /// A relay for a call resumed after the agent's answer (bridge.rs).
    pub(super) fn resumed(
        relay: &'a Relay,
        parking_full: ParkingFull<'a>,
        connection: &'a Arc<ConnectionState>,
        caller: &'a Call,
        retry: &Value,
        upstream_token: Option<Value>,
    ) -> CallRelay<'a> {
        let agent_token = aip_mcp::protocol::progress_token(retry).cloned();
        let logs = aip_mcp::modern::meta(retry)
            .is_some_and(|m| m.contains_key(aip_mcp::modern::META_LOG_LEVEL));
        CallRelay {
            relay,
            parking_full,
            connection,
            caller,
            upstream_token: agent_token.as_ref().and(upstream_token),
            agent_token,
            relayed: Vec::new(),
            logs,
            answerable: Answerable::of(caller, connection, retry),
        }
    }
}

impl CallRelay<'_> {
    /// Relays what the server says until its response, the agent's
    /// cancellation, or (when the agent can answer it) a server's question.
    async fn pump<F>(
        &mut self,
        upstream: &mut F,
        heard: &mut mpsc::UnboundedReceiver<Value>,
    ) -> Pumped
    where
        F: std::future::Future<Output = Result<Exchange, Failure>> + Unpin,
    {
        let caller = self.caller;
        let outcome = loop {
            tokio::select! {
                biased;
                Some(message) = heard.recv() => {
                    if let Some(question) = Box::pin(self.relay(message)).await {
                        return Pumped::Asked(question);
                    }
                }
                outcome = &mut *upstream => break outcome,
                () = caller.cancel.cancelled() => return Pumped::Cancelled,
            }
        };
        // What came just before the response goes out before it.
        while let Ok(message) = heard.try_recv() {
            if let Some(question) = Box::pin(self.relay(message)).await {
                // Asked with its last breath: nobody will hear the answer.
                let why = "the call already ended";
                let error = error_object(codes::INTERNAL_ERROR, "Internal error", why);
                self.answer(&json!({"id": question.id}), error).await;
            }
        }
        Pumped::Done(outcome)
    }

    async fn relay(&mut self, message: Value) -> Option<Question> {
        match (
            message.get("id"),
            message.get("method").and_then(Value::as_str),
        ) {
            (Some(_), Some(_)) => return self.server_request(message).await,
            (None, Some(_)) => self.notification(message),
            _ => {} // a stray response: nothing asked for it
        }
        None
    }

    /// Progress for this call (under the agent's own token), logging, and a
    /// server's cancellation of a request it relayed; redacted.
    fn notification(&mut self, mut note: Value) {
        match note["method"].as_str().unwrap_or_default() {
            "notifications/message" if !self.logs => return,
            "notifications/progress" => {
                let token = note.get("params").and_then(|p| p.get("progressToken"));
                match &self.agent_token {
                    Some(agent) if token == self.upstream_token.as_ref() => {
                        note["params"]["progressToken"] = agent.clone();
                    }
                    _ => return, // not about this call
                }
            }
            "notifications/cancelled" => {
                let upstream_id = note.get("params").and_then(|p| p.get("requestId")).cloned();
                let Some(agent_id) = self.take_relayed(upstream_id.as_ref()) else {
                    return; // about nothing the agent knows of
                };
                note["params"]["requestId"] = agent_id;
            }
            _ => {}
        }
        if let Some(params) = note.get_mut("params") {
            self.redact(params);
        }
        self.caller.send(note);
    }

    /// A request the server makes of the client: relayed under a gateway id
    /// when the connection opted in to its capability and the agent's
    /// transport can carry it; for a modern agent that declared it can
    /// answer it, the question to put in an `input_required`; otherwise
    /// answered with an error at once, so the server need not wait.
    async fn server_request(&mut self, mut request: Value) -> Option<Question> {
        let method = request["method"].as_str().unwrap_or_default().to_owned();
        let offered = self.connection.connection().capabilities;
        let refusal = match method.as_str() {
            "ping" => {
                self.answer(&request, json!({"result": {}})).await;
                return None;
            }
            "sampling/createMessage" if offered.sampling => None,
            "elicitation/create" if offered.elicitation => None,
            "roots/list" if offered.roots => None,
            "sampling/createMessage" | "elicitation/create" | "roots/list" => {
                Some("this connection is not offered that client capability")
            }
            _ => Some("the gateway relays only sampling, elicitation and roots requests"),
        };
        let answerable = refusal.is_none()
            && self.caller.era.answers_by_retry()
            && self.answerable.covers(&method);
        let refusal = match answerable && (self.parking_full)() {
            true => Some("too many calls already wait for their agents' input"),
            false => refusal,
        };
        if refusal.is_none() && answerable {
            if let Some(params) = request.get_mut("params") {
                self.redact(params);
            }
            return Some(Question::from_request(request));
        }
        let refusal = refusal.or_else(|| {
            self.caller.era.answers_by_retry().then_some(
                "the agent speaks MCP 2026-07-28 and did not declare this capability in its request",
            )
        });
        let refusal = refusal.or_else(|| {
            self.caller
                .events
                .is_none()
                .then_some("the agent's transport cannot carry requests to it")
        });
        if let Some(why) = refusal {
            let connection = &self.connection.connection().name;
            tracing::warn!(connection = %connection, method, why, "a server request was refused");
            let error = error_object(codes::METHOD_NOT_FOUND, "Method not found", why);
            self.answer(&request, error).await;
            return None;
        }
        let upstream_id = request["id"].clone();
        let agent_id = json!(format!("aip-s-{}", self.relay.ids.fresh()));
        if let Some(params) = request.get_mut("params") {
            self.redact(params);
        }
        request["id"] = agent_id.clone();
        let key = (self.caller.session.clone(), agent_id.to_string());
        let relayed = RelayedRequest {
            connection: self.connection.clone(),
            upstream_id: upstream_id.clone(),
        };
        lock(&self.relay.relayed).insert(key.clone(), Awaiting::Server(relayed));
        self.relayed.push(key.clone());
        if !self.caller.send(request) {
            lock(&self.relay.relayed).remove(&key);
            let error = error_object(
                codes::INTERNAL_ERROR,
                "Internal error",
                "the agent is not reading its stream",
            );
            self.answer(&json!({"id": upstream_id}), error).await;
        }
        None
    }

    /// What the server says for the agent, as the agent is shown it.
    fn redact(&self, params: &mut Value) {
        let findings = Findings::Audited(&self.relay.audit);
        redact_for_agent(params, self.connection, &self.caller.evaluator, findings);
    }

    /// Sends the server a reply of our own to its request.
    async fn answer(&self, request: &Value, outcome: Value) {
        let mut reply = json!({"jsonrpc": "2.0", "id": request["id"]});
        if let (Some(reply), Value::Object(outcome)) = (reply.as_object_mut(), outcome) {
            reply.extend(outcome);
        }
        let _ = self.connection.upstream.notify(&reply).await;
    }

    /// The agent-facing id of the relayed request the server knows as
    /// `upstream_id`, which is no longer pending.
    fn take_relayed(&mut self, upstream_id: Option<&Value>) -> Option<Value> {
        let upstream_id = upstream_id?;
        let mut pending = lock(&self.relay.relayed);
        let key = self
            .relayed
            .iter()
            .find(|k| {
                matches!(pending.get(*k), Some(Awaiting::Server(r)) if &r.upstream_id == upstream_id)
            })?
            .clone();
        pending.remove(&key);
        serde_json::from_str(&key.1).ok()
    }

    /// Relayed requests end with their call: a later reply finds nothing.
    fn forget(&self) {
        let mut pending = lock(&self.relay.relayed);
        for key in &self.relayed {
            pending.remove(key);
        }
    }
}

/// The server learns of the call as a child of the gateway's upstream span
/// (the span this runs in): `_meta.traceparent` (and `tracestate`) name it,
/// in the agent's trace when the agent gave one. Without an OTLP endpoint
/// there is no exported span, and whatever the agent sent goes on as it came.
/// Whether it changed `request`.
fn pass_trace_on(request: &mut Value) -> bool {
    let fields = aip_service::trace_context_of(&tracing::Span::current());
    if fields.is_empty() {
        return false;
    }
    let Some(Value::Object(params)) = request.get_mut("params") else {
        return false;
    };
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    if let Value::Object(meta) = meta {
        for (name, value) in fields {
            meta.insert(name, Value::String(value));
        }
    }
    true
}

/// A request for the relay to send: the message, and the agent's text it
/// was made from by a new id and the tool's upstream name, where there is
/// one (spliced into [`call_text`] when it is sent).
pub(super) struct Sending {
    pub(super) request: Value,
    pub(super) source: Option<Bytes>,
}

impl From<Value> for Sending {
    fn from(request: Value) -> Self {
        Sending {
            request,
            source: None,
        }
    }
}

/// The call text of `request` (a `tools/call` under the gateway's id)
/// from the agent's `source`.
fn spliced_call(source: &[u8], request: &Value) -> Option<CallText> {
    let id = request.get("id")?.as_str()?;
    let name = request.get("params")?.get("name")?.as_str()?;
    call_text(source, id, name)
}

/// The text a call goes upstream as, and where its `params._meta` object
/// lies in it (for a transport that must splice that too).
#[derive(Debug, PartialEq)]
pub(super) struct CallText {
    pub(super) text: Vec<u8>,
    pub(super) meta_at: Option<Range<usize>>,
}

/// The text of a `tools/call` to forward: the agent's `source` (accepted
/// by the strict parser) with its top-level `id` the gateway's `id` and
/// its `params.name` the tool's `upstream_name`, the rest byte for byte.
/// None where that text would not say what the forwarded message says: an
/// envelope member beyond JSON-RPC's (the message drops it), no `params`
/// object, `name` or `id`, or a key not read plainly.
pub(super) fn call_text(source: &[u8], id: &str, upstream_name: &str) -> Option<CallText> {
    use aip_mcp::raw;
    let (envelope, _) = raw::members(source, raw::whole(source))?;
    let mut splice = raw::Splice::default();
    let (mut renamed, mut identified, mut meta) = (false, false, None);
    for member in &envelope {
        match &source[member.key.clone()] {
            b"jsonrpc" | b"method" => {}
            b"id" => {
                splice.replace(member.value.clone(), serde_json::to_vec(id).ok()?);
                identified = true;
            }
            b"params" => {
                let (params, _) = raw::members(source, member.value.clone())?;
                for param in params {
                    match &source[param.key.clone()] {
                        b"name" => {
                            let name = serde_json::to_vec(upstream_name).ok()?;
                            splice.replace(param.value, name);
                            renamed = true;
                        }
                        b"_meta" => meta = Some(param.value),
                        _ => {}
                    }
                }
            }
            _ => return None,
        }
    }
    if !(renamed && identified) {
        return None;
    }
    let meta_at = meta.map(|at| splice.moved(at));
    Some(CallText {
        text: splice.apply(source),
        meta_at,
    })
}

#[cfg(test)]
mod tests {
    use super::call_text;
    use serde_json::{Value, json};

    fn says(text: &[u8]) -> Value {
        serde_json::from_slice(text).unwrap()
    }

    #[test]
    fn a_call_text_is_the_agents_with_the_id_and_name_spliced() {
        let source = br#" {"jsonrpc":"2.0", "params":{"arguments":{"z":1,"a":"\u00e9"}, "name":"up_echo"}, "id":7, "method":"tools/call"} "#;
        let text = call_text(source, "aip-3", "echo").unwrap().text;
        assert_eq!(
            String::from_utf8(text.clone()).unwrap(),
            r#" {"jsonrpc":"2.0", "params":{"arguments":{"z":1,"a":"\u00e9"}, "name":"echo"}, "id":"aip-3", "method":"tools/call"} "#
        );
        let mut expected = says(source);
        expected["id"] = json!("aip-3");
        expected["params"]["name"] = json!("echo");
        assert_eq!(says(&text), expected);
    }

    #[test]
    fn a_call_text_says_where_its_meta_lies() {
        let source = br#"{"id":"a-long-agent-id","jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"k":1},"name":"up_echo"}}"#;
        let spliced = call_text(source, "aip-3", "echo").unwrap();
        let at = spliced.meta_at.clone().unwrap();
        assert_eq!(&spliced.text[at], br#"{"k":1}"#);
        let source = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"up_echo","_meta":{"k":[]}},"id":7}"#;
        let spliced = call_text(source, "aip-3", "echo").unwrap();
        assert_eq!(&spliced.text[spliced.meta_at.unwrap()], br#"{"k":[]}"#);
    }

    #[test]
    fn no_call_text_where_splicing_would_not_say_what_is_forwarded() {
        let cases: [&[u8]; 5] = [
            // an envelope member the forwarded message drops
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"x":1}"#,
            // a key written with an escape
            br#"{"jsonrpc":"2.0","\u0069d":1,"method":"tools/call","params":{"name":"a"}}"#,
            // no name to replace, no params, no id
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
        ];
        for source in cases {
            assert_eq!(
                call_text(source, "aip-1", "b"),
                None,
                "{}",
                String::from_utf8_lossy(source)
            );
        }
    }
}

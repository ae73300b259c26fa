//! The era bridge: an agent and a server of different MCP revisions
//! asking each other for input in their own ways. Only a call whose
//! agent and server differ in era, or that carries a `requestState`
//! toward a legacy server, comes here ([`Bridge::needed`]); every other
//! call goes from the pipeline to the relay directly.
//!
//! ## A legacy server asking a modern agent
//!
//! A 2025-11-25 server
//! asks in the middle of a call, with a request of its own (elicitation,
//! sampling, roots) it expects answered on the same session; a 2026-07-28
//! agent hears no server requests and answers questions only as a call's
//! `input_required` result, retrying the call with its answers and the
//! state it was given. The gateway joins the two: the server's question
//! becomes the agent's `input_required`, the call waits here — parked, its
//! upstream exchange still open — and the agent's retry delivers the answer
//! to the server and takes the call up again, so the server sees one call.
//!
//! The `requestState` the agent carries is a handle, not state: 128 random
//! bits naming a parked call, good once, only for the client that made the
//! call (its `clientInfo` name) and only for a retry of the very call (the
//! same method, tool or prompt and arguments, or URI: a `tools/call`,
//! `prompts/get` and `resources/read` may each be parked); the policy
//! decides the retry like any call.
//! Nothing of the gateway's rides in it, so there is nothing to forge or
//! replay. At most `MAX_PARKED` calls wait at once, each at most as long as
//! an approval may; one that expires is cancelled upstream.
//!
//! ## A modern server asking a legacy agent
//!
//! A 2026-07-28 server
//! answers a call that needs more with `input_required` (its questions and
//! an opaque state); a 2025-11-25 agent knows only the server-to-client
//! requests of its era. The gateway plays the modern client for it: each
//! question is put to the agent as that request, on the call's stream, and
//! the call is retried upstream with the answers and the server's state,
//! round after round, until the server completes it. The agent sees one
//! call and its result. The retries are the same call the policy already
//! allowed, so they are not decided again; each is forwarded once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_mcp::{Exchange, Failure};
use aip_policy::{Direction, codes};
use aip_service::sync::lock;
use serde_json::{Map, Value, json};

use super::call::{Call, Era, Ids};
use super::present::{Findings, redact_for_agent};
use super::relay::{CallRelay, Outcome, Question, Relay, Waiting, cancel_upstream};
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// The bridge between eras: the parked calls and what answering a
/// server's questions for a legacy agent needs.
pub(super) struct Bridge {
    parked: Arc<Parked>,
    ids: Ids,
    audit: Arc<Audit>,
    /// How long a question waits for the agent (as long as an ask may).
    patience: Duration,
}

impl Bridge {
    pub(super) fn new(patience: Duration, ids: Ids, audit: Arc<Audit>) -> Bridge {
        Bridge {
            parked: Arc::new(Parked::new(patience)),
            ids,
            audit,
            patience,
        }
    }

    /// Whether a call of an `era` agent to `connection` crosses eras: the
    /// two differ, or the call carries a `requestState` toward a legacy
    /// server (a handle of the gateway's, or one to refuse).
    pub(super) fn needed(era: Era, connection: &ConnectionState, request: &Value) -> bool {
        let server_modern = connection.upstream.modern();
        era.answers_by_retry() != server_modern
            || (!server_modern
                && request
                    .get("params")
                    .is_some_and(|p| p.get("requestState").is_some()))
    }

    /// Sends `request` upstream across eras and sees it through: a modern
    /// agent's retry carrying a parked call's handle resumes that call, and
    /// any other `requestState` toward a legacy server is refused; a legacy
    /// server's question to a modern agent parks the call; a modern
    /// server's question to a legacy agent is put to the agent and the call
    /// retried.
    pub(super) async fn exchange(
        &self,
        relay: &Relay,
        connection: &Arc<ConnectionState>,
        request: Value,
        caller: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        if caller.era.answers_by_retry()
            && let Some(handle) = handle_in(&request)
        {
            let resumed = self.parked.resume(relay, &handle, &request, caller);
            return Box::pin(resumed).await;
        }
        if let Some(refused) = refuse_foreign_state(&request, connection) {
            return Some(Ok(refused));
        }
        let retry = (!caller.era.answers_by_retry() && connection.upstream.modern())
            .then(|| request.clone());
        let outcome = self.parked.relay(relay, connection, request, caller).await;
        match (outcome, retry) {
            (Some(Ok(x)), Some(request)) if requires_input(&x) => {
                let answering = Answering {
                    relay,
                    parked: &self.parked,
                    ids: &self.ids,
                    audit: &self.audit,
                    patience: self.patience,
                };
                let input = answering.provide_input(connection, &request, x, caller);
                Box::pin(input).await
            }
            (outcome, _) => outcome,
        }
    }
}

/// Calls parked at once, at most; past it a server's question is refused.
const MAX_PARKED: usize = 256;
/// What marks a `requestState` as one of the gateway's handles.
const STATE_PREFIX: &str = "aip-parked-";
/// The key of the one question in `inputRequests`.
const QUESTION_KEY: &str = "aip";

struct ParkedCall {
    owner: String,
    /// The method and what it names (tool or prompt and arguments, or
    /// URI) the retry must repeat.
    call: Value,
    connection: Arc<ConnectionState>,
    question: Value,
    waiting: Waiting,
}

/// The calls parked, each until its retry or `patience`.
struct Parked {
    calls: Mutex<HashMap<String, ParkedCall>>,
    patience: Duration,
}

fn owner_of(request: &Value) -> String {
    aip_mcp::modern::client_name(request).to_owned()
}

/// What a call names (its method, the tool or prompt and its arguments,
/// or the resource), as the retry must repeat it.
fn call_of(request: &Value) -> Value {
    let params = request.get("params");
    let field = |k: &str| {
        params
            .and_then(|p| p.get(k))
            .cloned()
            .unwrap_or(Value::Null)
    };
    json!([
        request["method"],
        field("name"),
        field("arguments"),
        field("uri")
    ])
}

/// The gateway's handle in a retry, if it carries one.
fn handle_in(request: &Value) -> Option<String> {
    let state = request.get("params")?.get("requestState")?.as_str()?;
    state.strip_prefix(STATE_PREFIX).map(str::to_owned)
}

/// Toward a legacy server, whose era has no `requestState`, one can only
/// be a handle of the gateway's (a modern agent's retry resumes it before
/// this is asked): anything else — a handle spelled otherwise, a modern
/// server's state, a legacy agent's — would have the server run the call
/// afresh, so the agent gets this refusal instead and nothing is sent.
fn refuse_foreign_state(request: &Value, connection: &ConnectionState) -> Option<Exchange> {
    if connection.upstream.modern() {
        return None;
    }
    request.get("params")?.get("requestState")?;
    let why = "requestState: is not a handle this gateway gave out; a call to this server \
        is resumed only by a 2026-07-28 retry carrying the requestState of its \
        input_required exactly as it came";
    Some(exchange(
        json!({"code": codes::INVALID_PARAMS, "message": why}),
    ))
}

impl Parked {
    /// Calls wait at most `patience` for their retry.
    fn new(patience: Duration) -> Parked {
        Parked {
            calls: Mutex::default(),
            patience,
        }
    }

    /// Whether another call may not be parked: its server's question is then
    /// refused, and the call goes on.
    fn full(&self) -> bool {
        lock(&self.calls).len() >= MAX_PARKED
    }

    /// Sends `request` (which has its gateway id) to `connection` through
    /// `relay`; a call whose server asked the agent for input is parked and
    /// the agent gets `input_required`. None when the call is cancelled first.
    async fn relay(
        self: &Arc<Self>,
        relay: &Relay,
        connection: &Arc<ConnectionState>,
        request: Value,
        caller: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        let full = || self.full();
        let outcome = relay.call(connection, request, caller, &full).await;
        self.settle(connection, outcome)
    }

    /// A relayed call's outcome for the agent: parked when its server asked.
    fn settle(
        self: &Arc<Self>,
        connection: &Arc<ConnectionState>,
        outcome: Outcome,
    ) -> Option<Result<Exchange, Failure>> {
        match outcome {
            Outcome::Done(done) => done,
            Outcome::Asked {
                request,
                question,
                waiting,
            } => Some(Ok(self.park(connection, &request, question, waiting))),
        }
    }

    /// Parks a call whose server asked `question`; the `input_required`
    /// exchange the agent gets, or the refusal the server gets (too many
    /// parked).
    fn park(
        self: &Arc<Self>,
        connection: &Arc<ConnectionState>,
        request: &Value,
        question: Question,
        waiting: Waiting,
    ) -> Exchange {
        let handle = format!("{:032x}", rand::random::<u128>());
        let input_request = json!({"method": question.method, "params": question.params});
        let parked = ParkedCall {
            owner: owner_of(request),
            call: call_of(request),
            connection: connection.clone(),
            question: question.id,
            waiting,
        };
        {
            // full() was asked first; concurrent parks may pass it
            // at once, which this bound catches (the call then fails).
            let mut calls = lock(&self.calls);
            if calls.len() >= MAX_PARKED {
                drop(calls);
                let why = format!("{MAX_PARKED} calls already wait for their agents' input");
                return exchange(json!({"code": codes::INTERNAL_ERROR, "message": why}));
            }
            calls.insert(handle.clone(), parked);
        }
        self.expire_later(handle.clone());
        let response = json!({"jsonrpc": "2.0", "id": request["id"], "result": {
            "resultType": "input_required",
            "inputRequests": {QUESTION_KEY: input_request},
            "requestState": format!("{STATE_PREFIX}{handle}"),
        }});
        Exchange::new(response, None)
    }

    /// Forgets a parked call nobody came back for, and tells its server.
    fn expire_later(self: &Arc<Self>, handle: String) {
        let parked = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(parked.patience).await;
            let expired = lock(&parked.calls).remove(&handle);
            if let Some(call) = expired {
                let why = "the agent did not answer the server's question in time";
                cancel_upstream(&call.connection, &call.waiting.upstream_id, why).await;
            }
        });
    }

    /// The retry of a parked call (`handle` from its `requestState`): the
    /// agent's answer goes to the server, and the call is relayed on.
    async fn resume(
        self: &Arc<Self>,
        relay: &Relay,
        handle: &str,
        retry: &Value,
        caller: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        let taken = lock(&self.calls).remove(handle);
        let refuse = |why: &str| {
            Some(Ok(exchange(
                json!({"code": codes::INVALID_PARAMS, "message": format!("requestState: {why}")}),
            )))
        };
        let Some(parked) = taken else {
            return refuse(
                "names no call waiting for input (unknown, answered already, or expired)",
            );
        };
        if parked.owner != owner_of(retry) || parked.call != call_of(retry) {
            // Dropped: its exchange is aborted and its server told.
            let why = "the call was retried by another client or with other arguments";
            cancel_upstream(&parked.connection, &parked.waiting.upstream_id, why).await;
            return refuse("is not this client's retry of the call it was given for");
        }
        let answer = retry.pointer(&format!("/params/inputResponses/{QUESTION_KEY}"));
        let Some(answer) = answer.cloned() else {
            let why = "the agent did not answer the server's question";
            cancel_upstream(&parked.connection, &parked.waiting.upstream_id, why).await;
            return refuse(&format!(
                "inputResponses has no answer under {QUESTION_KEY:?}"
            ));
        };
        let mut answer = answer;
        relay.redact_for_server(&mut answer, &caller.evaluator, Direction::Upstream);
        let reply = json!({"jsonrpc": "2.0", "id": parked.question, "result": answer});
        let connection = parked.connection;
        if let Err(failure) = connection.upstream.notify(&reply).await {
            return Some(Err(failure));
        }
        let Waiting {
            upstream,
            heard,
            upstream_token,
            upstream_id,
        } = parked.waiting;
        let full = || self.full();
        let call = CallRelay::resumed(relay, &full, &connection, caller, retry, upstream_token);
        // The call as the relay knows it: the retry under the upstream
        // request's id (what a later question parks, a cancellation names).
        let mut request = retry.clone();
        request["id"] = upstream_id;
        let outcome = Box::pin(relay.pump_detached(call, upstream, heard, request)).await;
        self.settle(&connection, outcome)
    }
}

/// An exchange that carries an error for the agent.
fn exchange(error: Value) -> Exchange {
    Exchange::new(json!({"jsonrpc": "2.0", "id": null, "error": error}), None)
}

/// Rounds of questions one call may take.
const MAX_ROUNDS: usize = 8;

/// Whether an exchange is a modern server's request for input.
fn requires_input(exchange: &Exchange) -> bool {
    exchange.response().pointer("/result/resultType") == Some(&json!("input_required"))
}

/// What answering a server's questions for a legacy agent needs, handed
/// in by the pipeline for one call.
struct Answering<'a> {
    relay: &'a Relay,
    parked: &'a Arc<Parked>,
    ids: &'a Ids,
    audit: &'a Audit,
    /// How long a question waits for the agent (as long as an ask may).
    patience: Duration,
}

impl Answering<'_> {
    /// Answers a modern server's `input_required` for a legacy agent (see
    /// the module's note) and returns the server's final exchange, a
    /// failure, an exchange carrying the agent's error, or None when the
    /// agent cancelled the call.
    async fn provide_input(
        &self,
        connection: &Arc<ConnectionState>,
        request: &Value,
        mut exchange: Exchange,
        caller: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        for _ in 0..MAX_ROUNDS {
            if !requires_input(&exchange) {
                return Some(Ok(exchange));
            }
            let result = &exchange.response()["result"];
            let mut answers = Map::new();
            if let Some(questions) = result.get("inputRequests").and_then(Value::as_object) {
                for (key, question) in questions {
                    match self.ask_agent(connection, question, caller).await? {
                        Ok(answer) => {
                            answers.insert(key.clone(), answer);
                        }
                        Err(error) => {
                            let response = json!({"jsonrpc": "2.0", "id": null, "error": error});
                            return Some(Ok(Exchange::new(response, None)));
                        }
                    }
                }
            }
            let mut retry = request.clone();
            retry["id"] = json!(self.ids.fresh());
            retry["params"]["inputResponses"] = Value::Object(answers);
            match result.get("requestState") {
                Some(state) => retry["params"]["requestState"] = state.clone(),
                None => {
                    if let Some(Value::Object(params)) = retry.get_mut("params") {
                        params.remove("requestState");
                    }
                }
            }
            exchange = match self
                .parked
                .relay(self.relay, connection, retry, caller)
                .await?
            {
                Ok(x) => x,
                Err(failure) => return Some(Err(failure)),
            };
        }
        let why = format!("the server asked for more input {MAX_ROUNDS} times in one call");
        Some(Err(Failure::Malformed(why)))
    }

    /// Puts one question to the agent as the request of its era and waits
    /// for its answer (a person may be answering: as long as an ask may
    /// wait). Err is the error the agent gets instead.
    async fn ask_agent(
        &self,
        connection: &Arc<ConnectionState>,
        question: &Value,
        caller: &Call,
    ) -> Option<Result<Value, Value>> {
        let refuse = |why: &str| {
            Some(Err(json!({"code": aip_mcp::modern::MISSING_CAPABILITY,
                "message": format!("the server needs input the gateway cannot get from this agent: {why}")})))
        };
        let method = question["method"].as_str().unwrap_or_default();
        let offered = connection.connection().capabilities;
        let allowed = match method {
            "elicitation/create" => offered.elicitation,
            "sampling/createMessage" => offered.sampling,
            "roots/list" => offered.roots,
            _ => false,
        };
        if !allowed {
            return refuse(&format!("this connection is not offered {method}"));
        }
        if caller.events.is_none() {
            return refuse(
                "the agent's transport cannot carry requests to it (ask with Accept: text/event-stream)",
            );
        }
        let id = json!(format!("aip-s-{}", self.ids.fresh()));
        let mut params = question.get("params").cloned().unwrap_or_else(|| json!({}));
        let findings = Findings::Audited(self.audit);
        redact_for_agent(&mut params, connection, &caller.evaluator, findings);
        let (waiter, answer) = tokio::sync::oneshot::channel();
        self.relay.expect_reply(&caller.session, &id, waiter);
        let forget = || self.relay.forget_reply(&caller.session, &id);
        if !caller.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})) {
            forget();
            return refuse("the agent is not reading its stream");
        }
        let reply = tokio::select! {
            reply = answer => reply.ok(),
            () = caller.cancel.cancelled() => { forget(); return None }
            () = tokio::time::sleep(self.patience) => None,
        };
        forget();
        match reply {
            Some(reply) => match (reply.get("result"), reply.get("error")) {
                (Some(result), _) => Some(Ok(result.clone())),
                (None, Some(error)) => Some(Err(error.clone())),
                _ => refuse("the agent's answer has neither result nor error"),
            },
            None => refuse("the agent did not answer in time"),
        }
    }
}

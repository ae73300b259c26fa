//! A legacy server asking a modern agent for input. A 2025-11-25 server
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_mcp::{Exchange, Failure};
use aip_policy::{Direction, Evaluator, codes};
use aip_service::sync::lock;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::call::Caller;
use super::relay::{CallRelay, Outcome, Question, Relay, Waiting, cancel_upstream};
use crate::upstream::health::ConnectionState;

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
pub(super) struct Parked {
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
pub(super) fn handle_in(request: &Value) -> Option<String> {
    let state = request.get("params")?.get("requestState")?.as_str()?;
    state.strip_prefix(STATE_PREFIX).map(str::to_owned)
}

/// Toward a legacy server, whose era has no `requestState`, one can only
/// be a handle of the gateway's (a modern agent's retry resumes it before
/// this is asked): anything else — a handle spelled otherwise, a modern
/// server's state, a legacy agent's — would have the server run the call
/// afresh, so the agent gets this refusal instead and nothing is sent.
pub(super) fn refuse_foreign_state(
    request: &Value,
    connection: &ConnectionState,
) -> Option<Exchange> {
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
    pub(super) fn new(patience: Duration) -> Parked {
        Parked {
            calls: Mutex::default(),
            patience,
        }
    }

    /// Whether another call may not be parked: its server's question is then
    /// refused, and the call goes on.
    pub(super) fn full(&self) -> bool {
        lock(&self.calls).len() >= MAX_PARKED
    }

    /// Sends `request` (which has its gateway id) to `connection` through
    /// `relay`; a call whose server asked the agent for input is parked and
    /// the agent gets `input_required`. None when `cancel` fires first.
    pub(super) async fn relay(
        self: &Arc<Self>,
        relay: &Relay,
        connection: &Arc<ConnectionState>,
        request: Value,
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
    ) -> Option<Result<Exchange, Failure>> {
        let full = || self.full();
        let outcome = relay
            .call(connection, request, caller, evaluator, cancel, &full)
            .await;
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
        Exchange {
            response: json!({"jsonrpc": "2.0", "id": request["id"], "result": {
                "resultType": "input_required",
                "inputRequests": {QUESTION_KEY: input_request},
                "requestState": format!("{STATE_PREFIX}{handle}"),
            }}),
            session_id: None,
        }
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
    pub(super) async fn resume(
        self: &Arc<Self>,
        relay: &Relay,
        handle: &str,
        retry: &Value,
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
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
        relay.redact_for_server(&mut answer, evaluator, Direction::Upstream);
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
        let call = CallRelay::resumed(
            relay,
            &full,
            &connection,
            caller,
            evaluator,
            retry,
            upstream_token,
        );
        // The call as the relay knows it: the retry under the upstream
        // request's id (what a later question parks, a cancellation names).
        let mut request = retry.clone();
        request["id"] = upstream_id;
        let outcome = Box::pin(relay.pump_detached(call, upstream, heard, request, cancel)).await;
        self.settle(&connection, outcome)
    }
}

/// An exchange that carries an error for the agent.
fn exchange(error: Value) -> Exchange {
    Exchange {
        response: json!({"jsonrpc": "2.0", "id": null, "error": error}),
        session_id: None,
    }
}

//! A modern server asking a legacy agent for input. A 2026-07-28 server
//! answers a call that needs more with `input_required` (its questions and
//! an opaque state); a 2025-11-25 agent knows only the server-to-client
//! requests of its era. The gateway plays the modern client for it: each
//! question is put to the agent as that request, on the call's stream, and
//! the call is retried upstream with the answers and the server's state,
//! round after round, until the server completes it. The agent sees one
//! call and its result. The retries are the same call the policy already
//! allowed, so they are not decided again; each is forwarded once.

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::{Exchange, Failure};
use aip_policy::Evaluator;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::call::{Caller, Ids};
use super::parked::Parked;
use super::present::{Findings, redact_for_agent};
use super::relay::Relay;
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// Rounds of questions one call may take.
const MAX_ROUNDS: usize = 8;

/// Whether an exchange is a modern server's request for input.
pub(super) fn requires_input(exchange: &Exchange) -> bool {
    exchange.response.pointer("/result/resultType") == Some(&json!("input_required"))
}

/// What answering a server's questions for a legacy agent needs, handed
/// in by the pipeline for one call.
pub(super) struct Answering<'a> {
    pub(super) relay: &'a Relay,
    pub(super) parked: &'a Arc<Parked>,
    pub(super) ids: &'a Ids,
    pub(super) audit: &'a Audit,
    /// How long a question waits for the agent (as long as an ask may).
    pub(super) patience: Duration,
}

impl Answering<'_> {
    /// Answers a modern server's `input_required` for a legacy agent (see
    /// the module's note) and returns the server's final exchange, a
    /// failure, an exchange carrying the agent's error, or None when the
    /// agent cancelled the call.
    pub(super) async fn provide_input(
        &self,
        connection: &Arc<ConnectionState>,
        request: &Value,
        mut exchange: Exchange,
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
    ) -> Option<Result<Exchange, Failure>> {
        for _ in 0..MAX_ROUNDS {
            if !requires_input(&exchange) {
                return Some(Ok(exchange));
            }
            let result = &exchange.response["result"];
            let mut answers = Map::new();
            if let Some(questions) = result.get("inputRequests").and_then(Value::as_object) {
                for (key, question) in questions {
                    match self
                        .ask_agent(connection, question, caller, evaluator, cancel)
                        .await?
                    {
                        Ok(answer) => {
                            answers.insert(key.clone(), answer);
                        }
                        Err(error) => {
                            let response = json!({"jsonrpc": "2.0", "id": null, "error": error});
                            return Some(Ok(Exchange {
                                response,
                                session_id: None,
                            }));
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
                .relay(self.relay, connection, retry, caller, evaluator, cancel)
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
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
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
        redact_for_agent(&mut params, connection, evaluator, findings);
        let (waiter, answer) = tokio::sync::oneshot::channel();
        self.relay.expect_reply(&caller.session, &id, waiter);
        let forget = || self.relay.forget_reply(&caller.session, &id);
        if !caller.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})) {
            forget();
            return refuse("the agent is not reading its stream");
        }
        let reply = tokio::select! {
            reply = answer => reply.ok(),
            () = cancel.cancelled() => { forget(); return None }
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

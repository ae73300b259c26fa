//! Calls an `ask` rule holds until a person decides: each waits in its own
//! task (nothing else is held up), with progress for an agent that asked for
//! it, and is withdrawn — never forwarded, never answered — when the agent
//! cancels it or its session ends. A new policy that blocks a held call
//! outright answers it at once, as that policy says.

use std::sync::Arc;
use std::time::Duration;

use aip_policy::{Decision, Evaluator, Request, Verdict};
use serde_json::{Value, json};

use super::{Caller, Gateway};
use crate::approvals::Ask;
use aip_mcp::jsonrpc::Message;

impl Gateway {
    /// Holds an ask until a person decides, the agent cancels, or time runs
    /// out. None when the ask was withdrawn.
    pub(super) async fn hold(
        &self,
        message: &Message,
        evaluator: &Arc<Evaluator>,
        verdict: Verdict,
        caller: &Caller,
    ) -> Option<Verdict> {
        let tool = verdict.tool().unwrap_or_default().to_owned();
        let connection = self
            .route(&tool)
            .map(|r| r.connection.connection().name.clone())
            .unwrap_or_default();
        let mut arguments = message
            .params()
            .and_then(|p| p.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null);
        let arguments_hash = aip_policy::hash::arguments_hash(&arguments);
        super::present::redact_all(&mut arguments, evaluator);
        let held = Ask {
            tool,
            connection,
            arguments,
            arguments_hash,
        };
        let tracked = self.in_flight.track_ask(&caller.session, message.id());
        let token = aip_mcp::protocol::progress_token(&message.value);
        tokio::select! {
            a = self.approvals.ask(held, self.options.approval_timeout) => Some(verdict.resolve(a)),
            // Dropping the ask withdraws it: a later decision releases nothing.
            blocked = self.blocked_by_new_policy(message, evaluator) => Some(blocked),
            () = tracked.cancelled.cancelled() => None,
            () = self.waiting_progress(token, caller) => None, // never ends
        }
    }

    /// Resolves when a new configuration blocks this held call outright.
    /// The call was asked under `asked_under`; a configuration that came
    /// after it counts even if it came before this first looks (the ask is
    /// visible, and a policy may be applied, before this is first polled).
    async fn blocked_by_new_policy(
        &self,
        message: &Message,
        asked_under: &Arc<Evaluator>,
    ) -> Verdict {
        let mut config = self.config.clone();
        let mut seen = asked_under.clone();
        loop {
            let evaluator = config.borrow_and_update().evaluator.clone();
            if !Arc::ptr_eq(&evaluator, &seen) {
                if let Ok(request) = Request::from_value(&message.value) {
                    let verdict = evaluator.evaluate(&request);
                    if verdict.decision == Decision::Block {
                        tracing::info!(
                            tool = verdict.tool().unwrap_or_default(),
                            "a held call is now blocked by policy; its ask is withdrawn"
                        );
                        return verdict;
                    }
                }
                seen = evaluator;
            }
            if config.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// While an ask waits, tells an agent that asked for progress (and whose
    /// transport can carry it) that the call is alive. Never returns.
    async fn waiting_progress(&self, token: Option<&Value>, caller: &Caller) {
        match token.filter(|_| caller.events.is_some()) {
            Some(token) => {
                progress_every(token, self.options.ask_progress_interval, |note| {
                    caller.send(note);
                })
                .await
            }
            None => std::future::pending().await,
        }
    }
}

/// Progress for `token` every `interval` ("waiting for human approval"),
/// handed to `send`. Never returns.
async fn progress_every(token: &Value, interval: Duration, send: impl Fn(Value)) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await; // the first tick is immediate
    for progress in 1u64.. {
        ticks.tick().await;
        send(
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
            "progressToken": token, "progress": progress, "message": "waiting for human approval"}}),
        );
    }
}

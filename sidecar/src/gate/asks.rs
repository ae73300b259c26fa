//! Calls an `ask` rule holds until a person decides: each waits in its own
//! task (nothing else is held up), with progress for an agent that asked for
//! it, and is withdrawn — never forwarded, never answered — when the agent
//! cancels it or its session ends. A new policy that blocks a held call
//! outright answers it at once, as that policy says.

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::jsonrpc::Message;
use aip_policy::{Decision, Evaluator, Request, Verdict};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::call::Call;
use super::edge::InFlight;
use crate::approvals::{Ask, LocalApprovals};
use crate::config::Config;

/// The asks being held, and what holding one needs.
pub(super) struct Asks {
    approvals: Arc<LocalApprovals>,
    /// The longest an ask waits for a person.
    patience: Duration,
    /// How often a waiting agent that asked for progress hears of it.
    progress_every: Duration,
    /// The configuration, for a new policy that blocks a held call.
    config: watch::Receiver<Arc<Config>>,
    held: InFlight,
}

impl Asks {
    pub(super) fn new(
        approvals: Arc<LocalApprovals>,
        patience: Duration,
        progress_every: Duration,
        config: watch::Receiver<Arc<Config>>,
    ) -> Asks {
        Asks {
            approvals,
            patience,
            progress_every,
            config,
            held: InFlight::default(),
        }
    }

    /// Holds an ask for a call to `connection` until a person decides, the
    /// agent cancels (the ask, or the call), or time runs out. None when the
    /// ask was withdrawn.
    pub(super) async fn hold(
        &self,
        message: &Message,
        verdict: Verdict,
        caller: &Call,
        connection: String,
    ) -> Option<Verdict> {
        let evaluator = &caller.evaluator;
        let tool = verdict.tool().unwrap_or_default().to_owned();
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
        let (_tracked, withdrawn) = self.held.track(&caller.session, message.id());
        let token = aip_mcp::protocol::progress_token(&message.value);
        tokio::select! {
            a = self.approvals.ask(held, self.patience) => Some(verdict.resolve(a)),
            // Dropping the ask withdraws it: a later decision releases nothing.
            blocked = self.blocked_by_new_policy(message, evaluator) => Some(blocked),
            () = withdrawn.cancelled() => None,
            () = caller.cancel.cancelled() => None,
            () = self.waiting_progress(token, caller) => None, // never ends
        }
    }

    /// Withdraws the ask held for request `id` of `session`, if any.
    pub(super) fn cancel(&self, session: &str, id: &Value) {
        self.held.cancel(session, id);
    }

    /// Withdraws every ask `session` has waiting.
    pub(super) fn withdraw(&self, session: &str) {
        self.held.end_session(session);
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
    async fn waiting_progress(&self, token: Option<&Value>, caller: &Call) {
        match token.filter(|_| caller.events.is_some()) {
            Some(token) => {
                progress_every(token, self.progress_every, |note| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn withdrawing_asks_cancels_only_that_sessions() {
        let (_tx, config) = watch::channel(Arc::new(Config::empty()));
        let asks = Asks::new(
            LocalApprovals::new(),
            Duration::from_secs(60),
            Duration::from_secs(1),
            config,
        );
        let (a, b) = (
            asks.held.track("a", Some(&json!(1))),
            asks.held.track("b", Some(&json!(1))),
        );
        asks.withdraw("a");
        assert!(a.1.is_cancelled() && !b.1.is_cancelled());
        asks.cancel("b", &json!(1));
        assert!(b.1.is_cancelled());
    }
}

//! Calls an `ask` rule holds until a person decides: each waits in its own
//! task (nothing else is held up), with progress for an agent that asked for
//! it. Every end is named for what happened (`aip_policy::Withdrawal`): a
//! call the agent cancels, or whose session ends, is withdrawn — never
//! forwarded, never answered, but audited and counted here; a new policy
//! that blocks a held call outright, or the gateway shutting down, answers
//! it at once as withdrawn (-32015 with the cause, or -32016); dropping the
//! wait tells the operator why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_mcp::jsonrpc::Message;
use aip_policy::{Approval, Decision, Evaluator, Request, Verdict, Withdrawal};
use aip_service::sync::lock;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::call::Call;
use super::record::Decisions;
use crate::approvals::{Ask, Ended, LocalApprovals};
use crate::config::Config;

/// How long asks wait, and how often a waiting agent hears of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Patience {
    /// The longest an ask waits for a person.
    pub timeout: Duration,
    /// How often a waiting agent that asked for progress hears of it.
    pub progress_every: Duration,
}

/// How a held call ended, for the agent: the verdict, and the request that
/// held it.
pub(super) struct Asked {
    pub verdict: Verdict,
    pub request: Option<String>,
}

/// The asks being held, and what holding one needs.
pub(super) struct Asks {
    approvals: Arc<LocalApprovals>,
    patience: Patience,
    /// The configuration, for a new policy that blocks a held call.
    config: watch::Receiver<Arc<Config>>,
    held: Held,
    /// Where the ends no agent receives are written down.
    decisions: Decisions,
    /// The gateway is stopping: every held call is answered at once.
    shutdown: CancellationToken,
}

impl Asks {
    pub(super) fn new(
        approvals: Arc<LocalApprovals>,
        patience: Patience,
        config: watch::Receiver<Arc<Config>>,
        decisions: Decisions,
        shutdown: CancellationToken,
    ) -> Asks {
        Asks {
            approvals,
            patience,
            config,
            held: Held::default(),
            decisions,
            shutdown,
        }
    }

    /// Holds an ask for a call to `connection` until a person decides, it
    /// expires, the agent cancels (the ask, or the call), the policy
    /// changes to refuse it, or the gateway stops. None when nobody waits
    /// for the answer (withdrawn by the agent: audited here).
    pub(super) async fn hold(
        &self,
        message: &Message,
        verdict: Verdict,
        caller: &Call,
        connection: String,
    ) -> Option<Asked> {
        let evaluator = &caller.evaluator;
        let tool = verdict.tool().unwrap_or_default().to_owned();
        let mut arguments = message
            .params()
            .and_then(|p| p.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null);
        let arguments_hash = aip_policy::hash::arguments_hash(&arguments);
        super::present::redact_all(&mut arguments, evaluator);
        let ended = Ended::default();
        let held = Ask {
            tool,
            connection,
            arguments,
            arguments_hash,
            ended: ended.clone(),
        };
        let (_tracked, withdrawn) = self.held.track(&caller.session, message.id(), &ended);
        // Whatever ends the wait without an answer to give is written
        // down: the agent's connection closing drops this future whole.
        let mut unanswered = Unanswered {
            asks: self,
            message,
            verdict: &verdict,
            caller,
            ended: &ended,
            answered: false,
        };
        let token = aip_mcp::protocol::progress_token(&message.value);
        let withdraw = |why: Withdrawal| {
            let why = *ended.get_or_init(|| why);
            Asked {
                verdict: verdict.clone().resolve(Approval::Withdrawn(why)),
                request: None,
            }
        };
        // Each way out names itself before the select drops the others:
        // dropping the ask withdraws it (a later decision releases
        // nothing), for the reason set here.
        let because = |why: Withdrawal| {
            let _ = ended.set(why);
        };
        let answer = tokio::select! {
            a = self.approvals.ask(held, self.patience.timeout) => Asked {
                verdict: verdict.clone().resolve(a.approval),
                request: a.request,
            },
            () = async {
                self.blocked_by_new_policy(message, evaluator).await;
                because(Withdrawal::PolicyChanged);
            } => withdraw(Withdrawal::PolicyChanged),
            () = async {
                self.shutdown.cancelled().await;
                because(Withdrawal::GatewayShutdown);
            } => withdraw(Withdrawal::GatewayShutdown),
            () = withdrawn.cancelled() => return None,
            () = async {
                caller.cancel.cancelled().await;
                because(Withdrawal::Cancelled);
            } => return None,
            () = self.waiting_progress(token, caller) => return None, // never ends
        };
        unanswered.answered = true;
        Some(answer)
    }

    /// Withdraws the ask held for request `id` of `session`, if any (the
    /// agent cancelled it).
    pub(super) fn cancel(&self, session: &str, id: &Value) {
        self.held.end(session, id, Withdrawal::Cancelled);
    }

    /// Withdraws every ask `session` has waiting (its session ended, or
    /// the agent stopped sending).
    pub(super) fn withdraw(&self, session: &str) {
        self.held.end_session(session);
    }

    /// Resolves when a new configuration blocks this held call outright
    /// (its reason is logged; the agent is told the call was withdrawn
    /// because the policy changed). The call was asked under `asked_under`;
    /// a configuration that came after it counts even if it came before
    /// this first looks (the ask is visible, and a policy may be applied,
    /// before this is first polled).
    async fn blocked_by_new_policy(&self, message: &Message, asked_under: &Arc<Evaluator>) {
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
                            reason = verdict.reason().unwrap_or_default(),
                            "a held call is now blocked by policy; its ask is withdrawn"
                        );
                        return;
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
                progress_every(token, self.patience.progress_every, |note| {
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

/// Writes down an ask that ended with no agent to tell (cancelled, its
/// session ended, its connection closed): the audit line and the count,
/// named for what happened.
struct Unanswered<'a> {
    asks: &'a Asks,
    message: &'a Message,
    verdict: &'a Verdict,
    caller: &'a Call,
    ended: &'a Ended,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let why = *self.ended.get_or_init(|| Withdrawal::AgentDisconnected);
        let verdict = self.verdict.clone().resolve(Approval::Withdrawn(why));
        tracing::info!(
            tool = verdict.tool().unwrap_or_default(),
            cause = why.as_str(),
            "a held call was withdrawn with nobody waiting for its answer"
        );
        self.asks.decisions.record(
            &self.caller.evaluator,
            self.message,
            &verdict,
            self.caller.known,
            None,
        );
    }
}

/// The held calls by (session, request id): what cancels each, and where
/// the reason goes first.
#[derive(Default)]
struct Held {
    calls: Mutex<HashMap<(String, String), Vec<Entry>>>,
    next: std::sync::atomic::AtomicU64,
}

struct Entry {
    serial: u64,
    cancel: CancellationToken,
    ended: Ended,
}

/// One held call, forgotten when dropped.
struct Tracked<'a> {
    held: &'a Held,
    key: Option<(String, String)>,
    serial: u64,
}

impl Held {
    fn track<'a>(
        &'a self,
        session: &str,
        id: Option<&Value>,
        ended: &Ended,
    ) -> (Tracked<'a>, CancellationToken) {
        let cancel = CancellationToken::new();
        let serial = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = id.map(|id| (session.to_owned(), id.to_string()));
        if let Some(key) = &key {
            lock(&self.calls)
                .entry(key.clone())
                .or_default()
                .push(Entry {
                    serial,
                    cancel: cancel.clone(),
                    ended: ended.clone(),
                });
        }
        let tracked = Tracked {
            held: self,
            key,
            serial,
        };
        (tracked, cancel)
    }

    /// Ends the call `id` of `session` for `why`.
    fn end(&self, session: &str, id: &Value, why: Withdrawal) {
        let key = (session.to_owned(), id.to_string());
        for entry in lock(&self.calls).get(&key).into_iter().flatten() {
            entry.stop(why);
        }
    }

    /// Ends every call `session` holds: its session ended.
    fn end_session(&self, session: &str) {
        for (key, calls) in lock(&self.calls).iter() {
            if key.0 == session {
                for entry in calls {
                    entry.stop(Withdrawal::SessionEnded);
                }
            }
        }
    }
}

impl Entry {
    /// The reason first, then the cancellation that reads it.
    fn stop(&self, why: Withdrawal) {
        let _ = self.ended.set(why);
        self.cancel.cancel();
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let Some(key) = &self.key else {
            return;
        };
        let mut calls = lock(&self.held.calls);
        if let Some(list) = calls.get_mut(key) {
            list.retain(|e| e.serial != self.serial);
            if list.is_empty() {
                calls.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn withdrawing_asks_cancels_only_that_sessions_and_says_why() {
        let held = Held::default();
        let (a_why, b_why) = (Ended::default(), Ended::default());
        let (_a_tracked, a) = held.track("a", Some(&json!(1)), &a_why);
        let (_b_tracked, b) = held.track("b", Some(&json!(1)), &b_why);
        held.end_session("a");
        assert!(a.is_cancelled() && !b.is_cancelled());
        assert_eq!(a_why.get(), Some(&Withdrawal::SessionEnded));
        held.end("b", &json!(1), Withdrawal::Cancelled);
        assert!(b.is_cancelled());
        assert_eq!(b_why.get(), Some(&Withdrawal::Cancelled));
    }

    #[tokio::test]
    async fn a_forgotten_call_leaves_nothing_behind() {
        let held = Held::default();
        let why = Ended::default();
        {
            let _tracked = held.track("a", Some(&json!(7)), &why);
        }
        assert!(lock(&held.calls).is_empty());
    }
}

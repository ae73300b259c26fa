//! Asks in Kubernetes mode.
//!
//! Each ask becomes an ApprovalRequest the operator creates, named after an
//! id this sidecar gives the call, so that a create retried after a lost
//! answer finds the request it made. The decision comes back on the same
//! stream. An ask belongs to the call, not to the stream: a broken stream
//! is resumed by the request's name (on whichever operator replica the
//! Service picks), and the operator keeps the request pending meanwhile.
//! The ask ends undecided only when this sidecar says so — the agent
//! cancelled or left, the policy changed, the gateway shuts down — with an
//! explicit withdrawal sent in the background (and waited for at
//! shutdown), or when the operator stayed out of reach for longer than it
//! said to keep the ask (twice its own bound; `APPROVAL_AWAY_BOUND_SIDECAR`
//! until it says). The request's expiry, which the operator
//! sends, is kept here too: the call is answered as expired at `expiresAt`
//! whether or not the operator is there.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aip_policy::{Approval, Withdrawal};
use aip_proto::v1;
use aip_service::time::sleep_until;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::{Backoff, Retry, UnlessRefused, authorize, read_token};
use crate::approvals::{Answer, Ask};

/// The longest wait between attempts to resume an ask's stream.
const APPROVAL_RETRY_MAX: Duration = Duration::from_secs(2);
/// How long past the request's expiry a connected stream may take to bring
/// the operator's word (a decision made at the last moment) before the
/// call is answered as expired anyway.
const EXPIRY_GRACE: Duration = Duration::from_millis(500);
/// The longest a withdrawal is retried while the operator is away.
const WITHDRAWAL_PATIENCE: Duration = Duration::from_secs(600);

/// Asks in Kubernetes mode, to the operator over `link`.
pub struct OperatorApprovals {
    pub(super) link: Arc<super::Link>,
    pub(super) token_file: PathBuf,
    pub(super) instance: String,
    /// Withdrawals on their way to the operator.
    pub(super) withdrawals: TaskTracker,
}

impl crate::approvals::Remote for OperatorApprovals {
    fn ask(&self, ask: Ask, timeout: Duration) -> crate::approvals::BoxFuture<'_, Answer> {
        Box::pin(self.wait(ask, timeout))
    }
}

/// What this sidecar knows of one ask.
struct Held {
    tool: String,
    ask_id: String,
    /// The ApprovalRequest's name, once the operator said it.
    name: Option<String>,
    /// When the request expires, once the operator said it.
    expires: Option<Instant>,
    /// How long the ask is kept while no operator can be reached (the
    /// operator says; `APPROVAL_AWAY_BOUND_SIDECAR` until it does).
    keep: Duration,
}

impl OperatorApprovals {
    /// Waits until this pod's withdrawals have reached the operator, for
    /// at most `bound` (at shutdown: the agents have been answered).
    pub async fn flush(&self, bound: Duration) {
        self.withdrawals.close();
        if tokio::time::timeout(bound, self.withdrawals.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                bound_ms = bound.as_millis() as u64,
                "withdrawals not delivered to the operator before exit; it withdraws those requests once the sidecar has been away long enough"
            );
        }
    }

    async fn wait(&self, ask: Ask, patience: Duration) -> Answer {
        // Whatever ends the wait before an answer came withdraws the ask.
        let mut unsettled = Unsettled {
            approvals: self,
            ended: ask.ended.clone(),
            held: Held {
                tool: ask.tool.clone(),
                ask_id: format!("{:032x}", rand::random::<u128>()),
                name: None,
                expires: None,
                keep: aip_proto::APPROVAL_AWAY_BOUND_SIDECAR,
            },
            settled: false,
        };
        let answer = self.follow(&ask, &mut unsettled.held, patience).await;
        match answer.approval {
            // Only this sidecar knows it gave up: the operator is told.
            Approval::Withdrawn(Withdrawal::OperatorUnreachable) => {
                let _ = ask.ended.set(Withdrawal::OperatorUnreachable);
            }
            // The operator's word, an expiry it keeps too, or a refusal
            // that made no request: nothing to tell.
            _ => unsettled.settled = true,
        }
        answer
    }

    /// Creates (or resumes) the request and waits for its end.
    async fn follow(&self, ask: &Ask, held: &mut Held, patience: Duration) -> Answer {
        use v1::approval_update::Decision;
        let started = Instant::now();
        // Until the operator says when the request expires (operators
        // before expiresAt on the stream never do), the ask's own bound.
        let mut deadline = started + patience;
        let mut away: Option<Instant> = None;
        // A person may decide while the operator is away: once it is back,
        // the decision should reach the held call within moments, not
        // after the configuration stream's 15 s. A sidecar holds few asks,
        // so retrying every 2 s at most costs the operator little.
        let mut backoff = Backoff::up_to(APPROVAL_RETRY_MAX);
        loop {
            // A dial may hang (a Service with no endpoints left, a silent
            // network) past the expiry or the bound: they are kept here too.
            let gave_up = away.map(|since| since + held.keep);
            let opened = tokio::select! {
                opened = self.open(ask, held) => opened,
                () = tokio::time::sleep_until(deadline), if away.is_some() => {
                    return self.answer(held, Approval::TimedOut);
                }
                () = sleep_until(gave_up) => return self.unreachable(held),
            };
            match opened {
                Ok(mut stream) => {
                    if let Some(since) = away.take() {
                        tracing::info!(
                            approval = held.name.as_deref().unwrap_or_default(),
                            away_ms = since.elapsed().as_millis() as u64,
                            "approval stream back"
                        );
                    }
                    backoff.reset();
                    loop {
                        let message = tokio::select! {
                            m = stream.message() => m,
                            // Connected, yet the operator's word is late:
                            // the agent is answered at expiry all the same.
                            () = tokio::time::sleep_until(deadline + EXPIRY_GRACE) => {
                                return self.answer(held, Approval::TimedOut);
                            }
                        };
                        let Ok(Some(update)) = message else {
                            break;
                        };
                        if held.name.is_none() && !update.name.is_empty() {
                            held.name = Some(update.name.clone());
                            tracing::info!(approval = %update.name, tool = %ask.tool, "waiting for a decision on ApprovalRequest");
                        }
                        if let Some(at) = expiry(update.expires_at_unix_ms) {
                            held.expires = Some(at);
                            deadline = at;
                        }
                        if update.keep_without_operator_ms > 0 {
                            held.keep =
                                Duration::from_millis(update.keep_without_operator_ms.into());
                        }
                        let approval = match Decision::try_from(update.decision) {
                            Ok(Decision::Approved) => Approval::Approved,
                            Ok(Decision::Denied) => Approval::Denied,
                            Ok(Decision::Expired) => Approval::TimedOut,
                            Ok(Decision::Withdrawn) => Approval::Withdrawn(
                                update.reason.parse().unwrap_or(Withdrawal::SidecarAway),
                            ),
                            _ => continue,
                        };
                        return self.answer(held, approval);
                    }
                    let wait = backoff.next_wait();
                    tracing::warn!(
                        approval = held.name.as_deref().unwrap_or_default(),
                        retry_ms = wait.as_millis() as u64,
                        "approval stream lost; resuming"
                    );
                    away = Some(Instant::now());
                    if let Some(answer) = self.pause(held, wait, deadline, away).await {
                        return answer;
                    }
                }
                // The operator cannot take this ask at all.
                Err(e) if !UnlessRefused.worth_retrying(e.code()) => {
                    tracing::warn!(error = %e.message(), tool = %ask.tool, "the operator refused the approval request; the call is answered as withdrawn");
                    return self.answer(held, Approval::Withdrawn(Withdrawal::OperatorRefused));
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    if away.is_none() {
                        tracing::warn!(error = %e.message(), retry_ms = wait.as_millis() as u64, "approval stream lost; resuming");
                        away = Some(Instant::now());
                    }
                    if let Some(answer) = self.pause(held, wait, deadline, away).await {
                        return answer;
                    }
                }
            }
        }
    }

    /// Waits `wait` before the next attempt, unless the request expires or
    /// the operator has been away too long first: then the answer.
    async fn pause(
        &self,
        held: &Held,
        wait: Duration,
        deadline: Instant,
        away: Option<Instant>,
    ) -> Option<Answer> {
        let gave_up = away.map(|since| since + held.keep);
        tokio::select! {
            () = tokio::time::sleep(wait) => None,
            () = tokio::time::sleep_until(deadline) => Some(self.answer(held, Approval::TimedOut)),
            () = sleep_until(gave_up) => Some(self.unreachable(held)),
        }
    }

    /// The operator has been out of reach for longer than the ask is kept.
    fn unreachable(&self, held: &Held) -> Answer {
        tracing::warn!(
            approval = held.name.as_deref().unwrap_or_default(),
            away_s = held.keep.as_secs(),
            "the operator has been out of reach too long; the held call is answered as withdrawn"
        );
        self.answer(held, Approval::Withdrawn(Withdrawal::OperatorUnreachable))
    }

    fn answer(&self, held: &Held, approval: Approval) -> Answer {
        Answer {
            approval,
            request: held.name.clone(),
        }
    }

    /// A stream for the ask: the request made (or found again by its id),
    /// or the one named resumed.
    async fn open(
        &self,
        ask: &Ask,
        held: &Held,
    ) -> Result<tonic::Streaming<v1::ApprovalUpdate>, tonic::Status> {
        let mut client = self.link.client();
        let mut request = tonic::Request::new(v1::ApprovalRequest {
            connection: ask.connection.clone(),
            tool: ask.tool.clone(),
            arguments_json: ask.arguments.to_string(),
            arguments_hash: ask.arguments_hash.clone(),
            policy_version: 0,
            resume_name: held.name.clone().unwrap_or_default(),
            sidecar_instance: self.instance.clone(),
            ask_id: held.ask_id.clone(),
            withdraws_explicitly: true,
        });
        authorize(&mut request, &read_token(&self.token_file)?)?;
        Ok(client.request_approval(request).await?.into_inner())
    }

    /// Tells the operator, in the background, that the ask ended for
    /// `reason`; retried while the operator is away, until the request
    /// would have expired anyway.
    fn withdraw(&self, held: Held, reason: Withdrawal) {
        let message = v1::ApprovalWithdrawal {
            name: held.name.clone().unwrap_or_default(),
            ask_id: held.ask_id.clone(),
            sidecar_instance: self.instance.clone(),
            reason: reason.as_str().to_owned(),
            tool: held.tool.clone(),
        };
        let until = held
            .expires
            .unwrap_or_else(|| Instant::now() + WITHDRAWAL_PATIENCE)
            .min(Instant::now() + WITHDRAWAL_PATIENCE);
        let (link, token_file) = (self.link.clone(), self.token_file.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = self.withdrawals.track_future(async move {
            let mut backoff = Backoff::up_to(APPROVAL_RETRY_MAX);
            loop {
                let sent = async {
                    let mut request = tonic::Request::new(message.clone());
                    authorize(&mut request, &read_token(&token_file)?)?;
                    link.client().withdraw_approval(request).await
                };
                match sent.await {
                    Ok(state) => {
                        let state = state.into_inner();
                        tracing::info!(approval = %state.name, reason = reason.as_str(), "ask withdrawn");
                        return;
                    }
                    // Gone, refused, or an operator without withdrawals
                    // (it withdrew when the stream closed).
                    Err(e) if !UnlessRefused.worth_retrying(e.code())
                        || e.code() == tonic::Code::NotFound =>
                    {
                        tracing::debug!(error = %e.message(), "withdrawal not taken");
                        return;
                    }
                    Err(e) => {
                        let wait = backoff.next_wait();
                        if Instant::now() + wait >= until {
                            tracing::warn!(error = %e.message(), "withdrawal not delivered; the request expires undecided");
                            return;
                        }
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        });
        runtime.spawn(task);
    }
}

/// The instant of `unix_ms` on this clock (None for 0: not sent).
fn expiry(unix_ms: i64) -> Option<Instant> {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).ok().filter(|m| *m > 0)?);
    let now = SystemTime::now();
    let left = at.duration_since(now).unwrap_or_default();
    Some(Instant::now() + left)
}

/// Withdraws the ask when its wait ends before an answer (dropped by the
/// gateway, for the reason in `Ask::ended`), or when it was given up here.
struct Unsettled<'a> {
    approvals: &'a OperatorApprovals,
    ended: crate::approvals::Ended,
    held: Held,
    /// The operator knows how the ask ended.
    settled: bool,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let reason = *self.ended.get().unwrap_or(&Withdrawal::AgentDisconnected);
        let held = Held {
            tool: std::mem::take(&mut self.held.tool),
            ask_id: std::mem::take(&mut self.held.ask_id),
            name: self.held.name.take(),
            expires: self.held.expires,
            keep: self.held.keep,
        };
        self.approvals.withdraw(held, reason);
    }
}

//! What becomes of ApprovalRequests after they are asked. The operator
//! replica following a request (for the sidecar's stream) expires it on
//! time; this controller, on the lease holder, covers what no follower sees:
//! a pending request whose pod is gone (deleted, finished) is Withdrawn
//! (`PodGone`), one that no sidecar stream has followed for longer than
//! `approvals::AWAY_BOUND` is Withdrawn (`SidecarAway`), one left past its
//! expiry (the operator was down) is Expired, and a decided one is deleted
//! after the retention. Each final decision is recorded once as an Event on
//! the request and on the pod, and counted; an annotation marks it
//! recorded, so a restarted operator does not say it again.
//!
//! Nobody follows a request when the follower that last did wrote
//! `AWAY_SINCE` (its stream closed), or when the replica named in
//! `FOLLOWED_BY` is no longer running (it was killed before it could say
//! so): then the time is this lease holder's first sight of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_api::ApprovalRequest;
use aip_api::approval_request::{ApprovalRequestStatus, Decision};
use futures::StreamExt;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::Context;
use crate::approvals::{AWAY_SINCE, FOLLOWED_BY, decision_word, set_decision_if_pending};
use crate::events::{pod_reference, publish};
use crate::index::ObjectKey;
use aip_policy::Withdrawal;

/// The annotation naming the decision already recorded as an Event.
pub const RECORDED: &str = "aip.io/recorded-decision";
/// How long past its expiry a request is left to its follower.
const GRACE: SignedDuration = SignedDuration::from_secs(10);
/// How often a pending request's pod is looked for.
const POD_CHECK: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the ApprovalRequest: {0}")]
    Write(#[source] kube::Error),
    #[error("setting the decision: {0}")]
    Decide(String),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Write(_) => "write",
            Error::Decide(_) => "decide",
        }
    }
}

/// What the controller is told at start.
pub struct Settings {
    /// How long a decided request is kept.
    pub retention: Duration,
    /// How long a pending request waits for a sidecar to follow it again.
    pub away_bound: Duration,
    /// The operator's namespace, where its replicas' pods run.
    pub namespace: String,
}

struct Lifecycle {
    ctx: Arc<Context>,
    settings: Settings,
    /// Requests whose follower's replica is gone, since this replica first
    /// saw it (namespace/name → then).
    unfollowed: Mutex<HashMap<String, Timestamp>>,
}

/// Runs until the process stops; `pods_gone` names deleted and finished
/// pods.
pub async fn run(
    ctx: Arc<Context>,
    settings: Settings,
    pods_gone: mpsc::UnboundedReceiver<ObjectKey>,
) {
    let api: Api<ApprovalRequest> = Api::all(ctx.client.clone());
    let leading = tokio_stream::wrappers::WatchStream::new(ctx.leader.clone())
        .filter_map(|l| async move { l.then_some(()) });
    let controller = Controller::new(api, watcher::Config::default());
    let requests = controller.store();
    // A deleted pod's requests, found in the controller's own cache.
    let of_gone_pods = UnboundedReceiverStream::new(pods_gone).flat_map(move |pod| {
        let refs: Vec<ObjectRef<ApprovalRequest>> = requests
            .state()
            .iter()
            .filter(|r| r.spec.pod == pod.name && r.namespace().as_deref() == Some(&pod.namespace))
            .map(|r| ObjectRef::from_obj(&**r))
            .collect();
        futures::stream::iter(refs)
    });
    controller
        .reconcile_on(of_gone_pods)
        .reconcile_all_on(leading)
        .run(
            reconcile,
            error_policy,
            Arc::new(Lifecycle {
                ctx,
                settings,
                unfollowed: Mutex::new(HashMap::new()),
            }),
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile(request: Arc<ApprovalRequest>, lc: Arc<Lifecycle>) -> Result<Action, Error> {
    let ctx = &lc.ctx;
    ctx.metrics.reconciled("ApprovalRequest");
    if !*ctx.leader.borrow() {
        return Ok(Action::await_change());
    }
    let ns = request.namespace().unwrap_or_default();
    let api: Api<ApprovalRequest> = Api::namespaced(ctx.client.clone(), &ns);
    let name = request.name_any();
    let status = request.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    if status.decision == Decision::Pending {
        let (gone, away) = {
            let index = ctx
                .index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let synced = index.is_synced();
            let gone = synced && !index.has_pod(&ns, &request.spec.pod, &request.spec.pod_uid);
            (
                gone,
                away_since(&lc, &request, synced.then_some(&*index), now),
            )
        };
        let deadline = request.spec.expires_at.0 + GRACE;
        let bound = SignedDuration::try_from(lc.settings.away_bound).unwrap_or_default();
        let withdraw_at = away.map(|since| since + bound);
        let (ending, why) = if gone {
            (Decision::Withdrawn, Some(Withdrawal::PodGone))
        } else if now >= deadline {
            (Decision::Expired, None)
        } else if withdraw_at.is_some_and(|at| now >= at) {
            (Decision::Withdrawn, Some(Withdrawal::SidecarAway))
        } else {
            let next = withdraw_at.map_or(deadline, |at| at.min(deadline));
            let left = now.duration_until(next).unsigned_abs();
            return Ok(Action::requeue(left.min(POD_CHECK)));
        };
        set_decision_if_pending(&api, &name, ending, why)
            .await
            .map_err(|e| Error::Decide(e.message().to_owned()))?;
        lock(&lc.unfollowed).remove(&key(&ns, &name));
        return Ok(Action::await_change());
    }
    if request.annotations().get(RECORDED).map(String::as_str)
        != Some(decision_name(status.decision))
    {
        record(ctx, &request, &status).await;
        let marked =
            json!({"metadata": {"annotations": {RECORDED: decision_name(status.decision)}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(marked))
            .await
            .map_err(Error::Write)?;
    }
    let since = status
        .decided_at
        .as_ref()
        .or(request.metadata.creation_timestamp.as_ref())
        .map_or(now, |t| t.0);
    let end =
        since + SignedDuration::try_from(lc.settings.retention).unwrap_or(SignedDuration::MAX);
    if now < end {
        return Ok(Action::requeue(now.duration_until(end).unsigned_abs()));
    }
    tracing::info!(namespace = %ns, approval = %name, "retention over: deleting the decided ApprovalRequest");
    match api.delete(&name, &DeleteParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
        Ok(_) => Ok(Action::await_change()),
        Err(e) => Err(Error::Write(e)),
    }
}

/// Since when no sidecar stream follows `request`, if none does: the time
/// its last follower wrote, or, when that follower's replica is gone
/// (`index` knows the operator's pods once synced), this replica's first
/// sight of that.
fn away_since(
    lc: &Lifecycle,
    request: &ApprovalRequest,
    index: Option<&crate::index::Index>,
    now: Timestamp,
) -> Option<Timestamp> {
    let annotations = request.annotations();
    if let Some(since) = annotations
        .get(AWAY_SINCE)
        .and_then(|t| t.parse::<Timestamp>().ok())
    {
        return Some(since);
    }
    let key = key(
        &request.namespace().unwrap_or_default(),
        &request.name_any(),
    );
    let replica = annotations
        .get(FOLLOWED_BY)
        .and_then(|f| f.split_once('/'))
        .map(|(replica, _)| replica);
    let replica_gone = match (replica, index) {
        (Some(replica), Some(index)) => !index.has_pod_named(&lc.settings.namespace, replica),
        _ => false,
    };
    let mut unfollowed = lock(&lc.unfollowed);
    if replica_gone {
        Some(*unfollowed.entry(key).or_insert(now))
    } else {
        unfollowed.remove(&key);
        None
    }
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The decision as an Event on the request and on the pod that asked.
async fn record(ctx: &Context, request: &ApprovalRequest, status: &ApprovalRequestStatus) {
    let by = status.decided_by.as_deref().unwrap_or("unknown");
    let spec = &request.spec;
    let (type_, note) = match status.decision {
        Decision::Approved => (EventType::Normal, format!("{} approved by {by}", spec.tool)),
        Decision::Denied => (
            EventType::Warning,
            format!(
                "{} denied by {by}{}",
                spec.tool,
                status
                    .reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
        ),
        Decision::Expired => (
            EventType::Warning,
            format!("{} expired undecided", spec.tool),
        ),
        Decision::Withdrawn => {
            let why = status
                .reason
                .as_deref()
                .and_then(|r| r.parse::<Withdrawal>().ok());
            let sentence = why.map_or(
                "withdrawn: it ended without a decision and will never run",
                Withdrawal::sentence,
            );
            (EventType::Normal, format!("{} {sentence}", spec.tool))
        }
        Decision::Pending => return,
    };
    let why = match status.decision {
        Decision::Withdrawn => status
            .reason
            .as_deref()
            .and_then(|r| r.parse::<Withdrawal>().ok())
            .map_or("Unknown", Withdrawal::as_str),
        _ => "",
    };
    ctx.metrics
        .approval_outcome(decision_word(status.decision), why);
    let note = format!("{} ({}): {note}", request.name_any(), spec.arguments_hash);
    let ns = request.namespace().unwrap_or_default();
    let pod = pod_reference(&ns, &spec.pod, Some(&spec.pod_uid));
    for reference in [request.object_ref(&()), pod] {
        publish(
            &ctx.recorder,
            type_,
            decision_name(status.decision),
            "Decide",
            Some(note.clone()),
            &reference,
        )
        .await;
    }
}

fn decision_name(decision: Decision) -> &'static str {
    decision_word(decision)
}

fn error_policy(_: Arc<ApprovalRequest>, error: &Error, lc: Arc<Lifecycle>) -> Action {
    tracing::warn!(%error, "ApprovalRequest not reconciled; retrying");
    lc.ctx
        .metrics
        .reconcile_failed("ApprovalRequest", error.metric_label());
    Action::requeue(Duration::from_secs(2))
}

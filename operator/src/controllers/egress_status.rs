//! EgressLock status: how many destinations the namespace's locks allow
//! together, how many governed pods run behind a proven lock, and how many
//! of those on rules from before the current setting (a pod's rules are
//! fixed when it starts). Written by the lease holder only, when it
//! changes; looked at again every few seconds, since what it counts (pods
//! connecting, their locks) changes without the EgressLock changing.

use std::sync::Arc;
use std::time::Duration;

use aip_api::{EgressLock, EgressLockStatus};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Context, FIELD_MANAGER, LIST_PAGE};

/// How often a lock's counts are looked at again.
const RECOUNT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the status: {0}")]
    Patch(#[source] kube::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Patch(_) => "patch",
        }
    }
}

/// Runs the status writer until its watch ends.
pub async fn run(ctx: Arc<Context>) {
    let api: Api<EgressLock> = Api::all(ctx.client.clone());
    let leading = tokio_stream::wrappers::WatchStream::new(ctx.leader.clone())
        .filter_map(|l| async move { l.then_some(()) });
    let (reader, writer) = kube::runtime::reflector::store();
    let objects = watcher::watcher(api, watcher::Config::default().page_size(LIST_PAGE))
        .default_backoff()
        .modify(|l: &mut EgressLock| l.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects();
    Controller::for_stream(objects, reader)
        .reconcile_all_on(leading)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

async fn reconcile(lock: Arc<EgressLock>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled("EgressLock");
    if !*ctx.leader.borrow() {
        return Ok(Action::await_change());
    }
    let ns = lock.namespace().unwrap_or_default();
    let Some(view) = ctx
        .index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .egress_view(&ns)
    else {
        // The feed has not seen it yet.
        return Ok(Action::requeue(RECOUNT));
    };
    let desired = EgressLockStatus {
        destinations: view.destinations,
        locked_pods: view.locked_pods,
        stale_pods: view.stale_pods,
        observed_generation: lock.meta().generation,
    };
    if lock.status.as_ref() == Some(&desired) {
        return Ok(Action::requeue(RECOUNT));
    }
    let api: Api<EgressLock> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({"apiVersion": "aip.io/v1alpha1", "kind": "EgressLock", "status": desired});
    api.patch_status(
        &lock.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await
    .map_err(Error::Patch)?;
    Ok(Action::requeue(RECOUNT))
}

fn error_policy(_: Arc<EgressLock>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "EgressLock status not written; retrying");
    ctx.metrics
        .reconcile_failed("EgressLock", error.metric_label());
    Action::requeue(Duration::from_secs(2))
}

//! A locked pod whose proof failed (its `aip-lock-check` init container
//! exited non-zero: the node's CNI plugin did not lock it) gets a Warning
//! Event `EgressLockMissing` with the proof's reason, once per pod, from
//! the lease holder. Only pending pods are watched (a failed proof keeps
//! the pod pending), and only their status is read.

use std::collections::HashSet;
use std::sync::Arc;

use aip_api::egress_lock::LOCK_ANNOTATION;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event};

use super::Context;
use crate::events::{pod_reference, publish};
use crate::webhooks::lock::CHECK;

/// At most this many pods remembered as told (then the memory starts over:
/// a pod may be told twice, never not at all).
const REMEMBERED: usize = 10_000;

/// The proof's failure, if `pod` is locked and its proof failed: the
/// reason it gave.
pub fn failed_proof(pod: &Pod) -> Option<String> {
    if !pod.annotations().contains_key(LOCK_ANNOTATION) {
        return None;
    }
    let status = pod.status.as_ref()?;
    let check = status
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == CHECK)?;
    [check.state.as_ref(), check.last_state.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|s| s.terminated.as_ref())
        .find(|t| t.exit_code != 0)
        .map(|t| {
            t.message
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| format!("{CHECK} exited {}", t.exit_code))
        })
}

/// Watches pending pods until the watch ends.
pub async fn run(ctx: Arc<Context>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields("status.phase=Pending");
    let mut told: HashSet<String> = HashSet::new();
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(e) => {
                crate::errors::log_watch_error("pending pods", &e);
                continue;
            }
        };
        if !*ctx.leader.borrow() {
            continue;
        }
        let Some(reason) = failed_proof(&pod) else {
            continue;
        };
        let uid = pod.uid().unwrap_or_default();
        if told.len() >= REMEMBERED {
            told.clear();
        }
        if !told.insert(uid.clone()) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        tracing::info!(namespace = %ns, pod = %name, reason = %reason, "a locked pod's proof of its egress lock failed");
        publish(
            &ctx.recorder,
            EventType::Warning,
            "EgressLockMissing",
            "ProveEgressLock",
            Some(reason),
            &pod_reference(&ns, &name, Some(&uid)),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_a_locked_pods_failed_proof_is_told_with_its_reason() {
        let pod = |annotated: bool, exit: i32| -> Pod {
            let annotations = if annotated {
                serde_json::json!({LOCK_ANNOTATION: "{}"})
            } else {
                serde_json::json!({})
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "agent", "annotations": annotations},
                "status": {"initContainerStatuses": [{
                    "name": CHECK, "ready": false, "restartCount": 1, "image": "i", "imageID": "",
                    "lastState": {"terminated": {"exitCode": exit, "message": "the egress lock is not in place: x"}},
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}}
                }]}
            }))
            .unwrap()
        };
        assert_eq!(
            failed_proof(&pod(true, 1)).as_deref(),
            Some("the egress lock is not in place: x")
        );
        assert_eq!(failed_proof(&pod(true, 0)), None);
        assert_eq!(failed_proof(&pod(false, 1)), None);
    }
}

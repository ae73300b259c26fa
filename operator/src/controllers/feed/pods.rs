//! Pods, as metadata only: labels, uid and the injector's annotation are all
//! the index needs of a pod. Only pods that may still run are watched: a
//! field selector leaves out those that have finished (phase Succeeded or
//! Failed, as every Job's pod ends), so the API server reports a pod that
//! finishes as deleted from this watch, and the phase costs nothing to
//! follow; a pod being deleted (`deletionTimestamp` set) leaves the index
//! at once too. Either way it stops counting as governed, and it is
//! reported gone, so that its pending ApprovalRequests are withdrawn.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::follow::{Shared, follow, list_config, lock};
use super::touched::Touched;
use crate::index::{ObjectKey, PodMeta};
use crate::webhooks::inject::INJECTED_ANNOTATION;

/// The pods that have not finished.
pub const MAY_RUN: &str = "status.phase!=Succeeded,status.phase!=Failed";

pub(super) async fn run(client: Client, index: Shared, touched: Touched, listed: impl FnMut()) {
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
    let config = list_config().fields(MAY_RUN);
    let stream = watcher::watcher(api, config).default_backoff();
    follow(
        stream,
        |p: &PartialObjectMeta<Pod>| {
            if p.metadata.deletion_timestamp.is_some() {
                gone(
                    &index,
                    &touched,
                    &p.namespace().unwrap_or_default(),
                    &p.name_any(),
                );
                return;
            }
            let meta = PodMeta {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                uid: p.uid().unwrap_or_default(),
                labels: p.labels().clone(),
                injected: p.annotations().contains_key(INJECTED_ANNOTATION),
                lock: p
                    .annotations()
                    .get(aip_api::egress_lock::LOCK_ANNOTATION)
                    .map(|text| {
                        // The injector wrote it; one that does not parse
                        // still marks the pod locked (its proof says
                        // whether it is), with no destinations known.
                        serde_json::from_str::<aip_api::egress_lock::Lock>(text)
                            .map(|l| l.allow)
                            .unwrap_or_default()
                    }),
            };
            touched.policies(lock(&index).apply_pod(meta));
        },
        |ns, name| gone(&index, &touched, ns, name),
        listed,
    )
    .await;
}

/// Pod `ns/name` is gone, finished or being deleted.
fn gone(index: &Shared, touched: &Touched, ns: &str, name: &str) {
    touched.policies(lock(index).delete_pod(ns, name));
    let _ = touched.pods_gone.send(ObjectKey::new(ns, name));
}

//! Pods, as metadata only: labels, uid and the injector's annotation are all
//! the index needs of a pod. A deleted pod is also reported, so that its
//! pending ApprovalRequests are withdrawn.

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

pub(super) async fn run(client: Client, index: Shared, touched: Touched, listed: impl FnMut()) {
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
    let stream = watcher::watcher(api, list_config()).default_backoff();
    follow(
        stream,
        |p: &PartialObjectMeta<Pod>| {
            let meta = PodMeta {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                uid: p.uid().unwrap_or_default(),
                labels: p.labels().clone(),
                injected: p.annotations().contains_key(INJECTED_ANNOTATION),
            };
            touched.policies(lock(&index).apply_pod(meta));
        },
        |ns, name| {
            touched.policies(lock(&index).delete_pod(ns, name));
            let _ = touched.pods_gone.send(ObjectKey::new(ns, name));
        },
        listed,
    )
    .await;
}

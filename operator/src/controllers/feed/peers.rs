//! The other replicas' sync reports (`controllers::sync_report`), from the
//! operator's own namespace: each is applied to the index, which counts a
//! pod synced when any replica saw its sidecar ack the current hash. This
//! replica's own report is skipped: its acks are in the index already.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::follow::{Shared, follow, list_config, lock};
use super::touched::Touched;
use crate::controllers::sync_report::{self, LABEL};

pub async fn run(client: Client, namespace: &str, replica: &str, index: Shared, touched: Touched) {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let config = list_config().labels(&format!("{LABEL}=true"));
    let stream = watcher::watcher(api, config).default_backoff();
    follow(
        stream,
        |map: &ConfigMap| {
            if sync_report::replica(map) == Some(replica) {
                return;
            }
            let name = map.name_any();
            let keys = match sync_report::parse(map) {
                Ok(acks) => lock(&index).apply_peer_report(&name, acks),
                Err(e) => {
                    tracing::warn!(configmap = %name, error = %e, "a sync report that cannot be read counts for nothing");
                    lock(&index).delete_peer_report(&name)
                }
            };
            touched.policies(keys);
        },
        |_, name| touched.policies(lock(&index).delete_peer_report(name)),
        || {},
    )
    .await;
}

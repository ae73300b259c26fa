//! EgressLocks, all of them: which namespaces' governed pods the injector
//! locks, and to what.

use aip_api::EgressLock;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::follow::{Shared, follow, list_config, lock};

pub(super) async fn run(client: Client, index: Shared, listed: impl FnMut()) {
    let api: Api<EgressLock> = Api::all(client);
    let stream = watcher::watcher(api, list_config()).default_backoff();
    follow(
        stream,
        |l: &EgressLock| {
            let ns = l.namespace().unwrap_or_default();
            lock(&index).apply_egress_lock(&ns, &l.name_any(), &l.spec);
        },
        |ns, name| lock(&index).delete_egress_lock(ns, name),
        listed,
    )
    .await;
}

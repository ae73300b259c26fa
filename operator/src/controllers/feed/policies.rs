//! AgentPolicies, all of them: each spec goes to the index, which validates
//! it and rematches the pods of its namespace.

use aip_api::AgentPolicy;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use super::follow::{Shared, follow, list_config, lock};
use super::touched::Touched;

pub(super) async fn run(client: Client, index: Shared, touched: Touched, listed: impl FnMut()) {
    let api: Api<AgentPolicy> = Api::all(client);
    let stream = watcher::watcher(api, list_config()).default_backoff();
    follow(
        stream,
        |p: &AgentPolicy| {
            let ns = p.namespace().unwrap_or_default();
            let keys = lock(&index).apply_policy(&ns, &p.name_any(), p.meta().generation, &p.spec);
            touched.policies(keys);
        },
        |ns, name| touched.policies(lock(&index).delete_policy(ns, name)),
        listed,
    )
    .await;
}

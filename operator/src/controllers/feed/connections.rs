//! ToolConnections, all of them. Each change also tells the Secret feed that
//! the set of referenced Secrets may have changed, and marks the Secrets a
//! new reference names as not read yet (so they are not called missing).

use aip_api::ToolConnection;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use super::follow::{Shared, follow, list_config, lock};
use super::touched::Touched;
use crate::index::ObjectKey;

pub(super) async fn run(
    client: Client,
    index: Shared,
    touched: Touched,
    refs_changed: mpsc::UnboundedSender<()>,
    listed: impl FnMut(),
) {
    let api: Api<ToolConnection> = Api::all(client);
    let stream = watcher::watcher(api, list_config()).default_backoff();
    follow(
        stream,
        |c: &ToolConnection| {
            let ns = c.namespace().unwrap_or_default();
            let name = c.name_any();
            let mut index = lock(&index);
            for (_, r) in c.spec.secret_refs() {
                touched.policies(index.expect_secret(&ns, &r.name));
            }
            let accepted = c
                .status
                .as_ref()
                .map(|s| crate::controllers::tool_ledger::accepted_pins(&s.tools))
                .unwrap_or_default();
            touched.policies(index.apply_connection(&ns, &name, &c.spec, accepted));
            drop(index);
            let _ = touched.connections.send(ObjectKey::new(&ns, &name));
            // The Secret feed watches what connections reference.
            let _ = refs_changed.send(());
        },
        |ns, name| {
            touched.policies(lock(&index).delete_connection(ns, name));
            let _ = touched.connections.send(ObjectKey::new(ns, name));
            let _ = refs_changed.send(());
        },
        listed,
    )
    .await;
}

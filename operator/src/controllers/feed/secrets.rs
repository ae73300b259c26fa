//! Secrets, one watch each: only those some ToolConnection references, each
//! watched by name (`fieldSelector=metadata.name=NAME`), so the operator
//! needs RBAC on exactly those Secrets (a Role with resourceNames, which
//! `kubectl aip grant` writes) and never lists the others. A watch starts
//! when a connection first references its Secret and stops when none does.
//! A Secret the operator may not read resolves to an error that says how to
//! grant it; the watch keeps retrying, so a grant takes effect by itself.

use std::collections::{BTreeSet, HashMap};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::follow::{Shared, lock};
use super::touched::Touched;
use crate::index::{Index, ObjectKey, SecretData};

/// Keeps one watch per referenced Secret; `changed` says the references
/// may have changed. `listed` is called once every Secret referenced when
/// the connections were first listed has been read (or found unreadable).
pub(super) async fn run(
    client: Client,
    index: Shared,
    touched: Touched,
    mut connections_listed: watch::Receiver<bool>,
    mut changed: mpsc::UnboundedReceiver<()>,
    mut listed: impl FnMut(),
) {
    if connections_listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    let mut running: HashMap<ObjectKey, JoinHandle<()>> = HashMap::new();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<ObjectKey>();
    let mut waiting: Option<BTreeSet<ObjectKey>> = None;
    loop {
        let wanted = lock(&index).referenced_secrets();
        running.retain(|key, task| {
            let keep = wanted.contains(key);
            if !keep {
                task.abort();
                // Forget what no connection reads any more.
                lock(&index).delete_secret(&key.namespace, &key.name);
            }
            keep
        });
        for key in &wanted {
            running.entry(key.clone()).or_insert_with(|| {
                tokio::spawn(follow(
                    client.clone(),
                    index.clone(),
                    touched.clone(),
                    key.clone(),
                    ready_tx.clone(),
                ))
            });
        }
        let first = waiting.is_none();
        let pending = waiting.get_or_insert_with(|| wanted.clone());
        if first && pending.is_empty() {
            listed();
        }
        tokio::select! {
            more = changed.recv() => {
                if more.is_none() { return; }
                while changed.try_recv().is_ok() {}
            }
            Some(key) = ready_rx.recv() => {
                if pending.remove(&key) && pending.is_empty() {
                    listed();
                }
            }
        }
    }
}

/// Watches Secret `key` until aborted.
async fn follow(
    client: Client,
    index: Shared,
    touched: Touched,
    key: ObjectKey,
    ready: mpsc::UnboundedSender<ObjectKey>,
) {
    let api: Api<Secret> = Api::namespaced(client, &key.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut seen = false;
    let mut forbidden = false;
    let apply = |s: &Secret| {
        let mut index = lock(&index);
        touched.policies(index.apply_secret(&key.namespace, &s.name_any(), data(s)));
        touched.readers(&index, &key.namespace, &key.name);
    };
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => seen = false,
            Ok(Event::InitApply(s) | Event::Apply(s)) => {
                seen = true;
                forbidden = false;
                apply(&s);
            }
            Ok(Event::InitDone) => {
                if !seen {
                    // Absent (or gone while the watch was down).
                    let mut index = lock(&index);
                    touched.policies(index.delete_secret(&key.namespace, &key.name));
                    touched.readers(&index, &key.namespace, &key.name);
                }
                let _ = ready.send(key.clone());
            }
            Ok(Event::Delete(_)) => {
                let mut index = lock(&index);
                touched.policies(index.delete_secret(&key.namespace, &key.name));
                touched.readers(&index, &key.namespace, &key.name);
            }
            Err(e) if is_forbidden(&e) => {
                if !std::mem::replace(&mut forbidden, true) {
                    // The documented order (apply, then `kubectl aip
                    // grant`) passes through this: the connection's status
                    // says so (NeedsCredentials), not a warning.
                    tracing::info!(namespace = %key.namespace, secret = %key.name, "the operator may not read a Secret a ToolConnection references (yet): kubectl aip grant allows it");
                    let mut index = lock(&index);
                    let reason = unreadable(&index, &key);
                    touched.policies(index.secret_unreadable(&key.namespace, &key.name, reason));
                    touched.readers(&index, &key.namespace, &key.name);
                }
                let _ = ready.send(key.clone());
            }
            Err(e) => {
                crate::errors::log_watch_error(
                    &format!("Secret {}/{}", key.namespace, key.name),
                    &e,
                );
            }
        }
    }
}

/// What the index keeps of a Secret: its data, nothing else.
fn data(s: &Secret) -> SecretData {
    SecretData(
        s.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    )
}

/// What a connection reading an unreadable Secret says: how to grant it.
fn unreadable(index: &Index, key: &ObjectKey) -> String {
    let readers = index.connections_reading(&key.namespace, &key.name);
    let grant = readers.first().map_or_else(
        || "a Role with resourceNames for it".to_owned(),
        |c| format!("`kubectl aip grant {c} -n {}`", key.namespace),
    );
    format!(
        "the operator may not read Secret {}: grant it with {grant}",
        key.name
    )
}

fn is_forbidden(e: &watcher::Error) -> bool {
    let api = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    };
    api == Some(403)
}

//! Watches that feed the index: AgentPolicies, ToolConnections, the Secrets
//! those reference (one watch each, see secret_feed), and pods as metadata
//! only. Each event becomes one index
//! update; what it touched is handed to the status writers.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use aip_api::{AgentPolicy, ToolConnection};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::index::{Index, ObjectKey, PodMeta, SecretData};

/// What the feeds tell the rest of the operator.
#[derive(Clone)]
pub struct Touched {
    pub policies: mpsc::UnboundedSender<ObjectKey>,
    pub connections: mpsc::UnboundedSender<ObjectKey>,
    /// Pods deleted (after the index forgot them): their pending
    /// ApprovalRequests are withdrawn.
    pub pods_gone: mpsc::UnboundedSender<ObjectKey>,
}

impl Touched {
    pub(super) fn policies(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            let _ = self.policies.send(k);
        }
    }

    /// After a Secret change: the connections that read it.
    pub(super) fn readers(&self, index: &Index, namespace: &str, secret: &str) {
        for name in index.connections_reading(namespace, secret) {
            let _ = self.connections.send(ObjectKey::new(namespace, &name));
        }
    }
}

type Shared = Arc<Mutex<Index>>;

fn lock(index: &Shared) -> std::sync::MutexGuard<'_, Index> {
    index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Follows every watch until one ends (they do not, short of shutdown).
/// The index is marked synced once each watch has listed once; the Secret
/// watch starts after the ToolConnections are known, so that its first list
/// keeps every Secret they read.
pub async fn run(client: Client, index: Shared, touched: Touched, ready: watch::Sender<bool>) {
    let (refs_tx, refs_rx) = mpsc::unbounded_channel();
    let (listed_tx, mut listed) = watch::channel(0u8);
    let listed_tx = Arc::new(listed_tx);
    let done = |tx: &Arc<watch::Sender<u8>>| {
        let tx = tx.clone();
        let mut once = false;
        move || {
            if !std::mem::replace(&mut once, true) {
                tx.send_modify(|n| *n += 1);
            }
        }
    };
    let (connections_listed_tx, connections_listed) = watch::channel(false);
    let connections_done = {
        let count = done(&listed_tx);
        let mut count = count;
        move || {
            count();
            connections_listed_tx.send_replace(true);
        }
    };
    let mark_synced = {
        let index = index.clone();
        async move {
            if listed.wait_for(|n| *n >= 4).await.is_ok() {
                lock(&index).mark_synced();
                ready.send_replace(true);
                tracing::info!("cluster state loaded; serving sidecars");
            }
        }
    };
    tokio::join!(
        policies(
            client.clone(),
            index.clone(),
            touched.clone(),
            done(&listed_tx)
        ),
        connections(
            client.clone(),
            index.clone(),
            touched.clone(),
            refs_tx,
            connections_done
        ),
        super::secret_feed::run(
            client.clone(),
            index.clone(),
            touched.clone(),
            connections_listed,
            refs_rx,
            done(&listed_tx)
        ),
        pods(client, index, touched, done(&listed_tx)),
        mark_synced,
    );
}

async fn policies(client: Client, index: Shared, touched: Touched, listed: impl FnMut()) {
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

async fn connections(
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
            touched.policies(index.apply_connection(&ns, &name, &c.spec));
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

pub(super) fn data(s: &Secret) -> SecretData {
    SecretData(
        s.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    )
}

async fn pods(client: Client, index: Shared, touched: Touched, listed: impl FnMut()) {
    // Metadata only: labels and uid are all the index needs of a pod.
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
                injected: p
                    .annotations()
                    .contains_key(crate::webhooks::inject::INJECTED_ANNOTATION),
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

/// Applies a watch's events. After a re-list, objects that were not listed
/// again are deleted: their delete events fell in the gap.
async fn follow<K, S>(
    stream: S,
    mut apply: impl FnMut(&K),
    mut delete: impl FnMut(&str, &str),
    mut listed: impl FnMut(),
) where
    K: Resource,
    K::DynamicType: Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut relisted: Option<HashSet<(String, String)>> = None;
    let key = |o: &K| {
        (
            o.meta().namespace.clone().unwrap_or_default(),
            o.meta().name.clone().unwrap_or_default(),
        )
    };
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(o)) => {
                known.insert(key(&o));
                apply(&o);
            }
            Ok(Event::InitApply(o)) => {
                if let Some(r) = relisted.as_mut() {
                    r.insert(key(&o));
                }
                known.insert(key(&o));
                apply(&o);
            }
            Ok(Event::Delete(o)) => {
                let (ns, name) = key(&o);
                known.remove(&(ns.clone(), name.clone()));
                delete(&ns, &name);
            }
            Ok(Event::Init) => relisted = Some(HashSet::new()),
            Ok(Event::InitDone) => {
                if let Some(now) = relisted.take() {
                    for (ns, name) in known.difference(&now) {
                        delete(ns, name);
                    }
                    known = now;
                }
                listed();
            }
            Err(e) => {
                tracing::warn!(kind = %K::kind(&Default::default()), error = %e, "watch error; retrying with backoff")
            }
        }
    }
}

/// Runs `f` until `shutdown`.
pub async fn until<F: Future<Output = ()>>(f: F, shutdown: tokio_util::sync::CancellationToken) {
    tokio::select! {
        () = f => {}
        () = shutdown.cancelled() => {}
    }
}

fn list_config() -> watcher::Config {
    watcher::Config::default().page_size(super::policy_status::LIST_PAGE)
}

//! Pods: matched against their namespace's policies, each with the watch
//! channel its sidecar's stream reads, and what that sidecar acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::watch;

use super::config::{PodConfig, publish};
use super::{Index, ObjectKey};

/// A pod as the metadata watch sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// The injector marked it (annotation `aip.io/sidecar`).
    pub injected: bool,
    /// The destinations of the egress lock the injector gave it (annotation
    /// `aip.io/egress-lock`), None when it has none. Its gateway starts
    /// only once the lock is proven.
    pub lock: Option<Vec<aip_api::egress_lock::Destination>>,
}

pub(super) struct PodEntry {
    uid: String,
    pub(super) labels: BTreeMap<String, String>,
    /// The policies whose selector matches, in name order.
    pub(super) matched: Vec<String>,
    pub(super) config: watch::Sender<Arc<PodConfig>>,
    /// The policy hash of the config version the sidecar last acknowledged.
    pub(super) acked_hash: Option<String>,
    pub(super) injected: bool,
    pub(super) lock: Option<Vec<aip_api::egress_lock::Destination>>,
    /// Whether a sidecar of this pod ever acknowledged a config.
    pub(super) acked_once: bool,
}

impl PodEntry {
    pub(super) fn uid(&self) -> &str {
        &self.uid
    }

    /// The policies this pod touches, as keys of `namespace`.
    fn matched_keys(&self, namespace: &str) -> impl Iterator<Item = ObjectKey> {
        self.matched
            .iter()
            .map(move |m| ObjectKey::new(namespace, m))
    }
}

impl Index {
    /// Adds or updates a pod. A new uid under the same name is a new pod:
    /// streams of the old one end.
    pub fn apply_pod(&mut self, pod: PodMeta) -> BTreeSet<ObjectKey> {
        let ns = self.namespace(&pod.namespace);
        let matched = ns.matching(&pod.labels);
        let mut touched: BTreeSet<ObjectKey> = BTreeSet::new();
        match ns.pods.get_mut(&pod.name) {
            Some(entry) if entry.uid == pod.uid => {
                touched.extend(entry.matched_keys(&pod.namespace));
                entry.labels = pod.labels;
                entry.matched = matched;
                entry.injected = pod.injected;
                entry.lock = pod.lock;
            }
            _ => {
                let (config, _) = watch::channel(Arc::new(PodConfig::initial()));
                let entry = PodEntry {
                    uid: pod.uid,
                    labels: pod.labels,
                    matched,
                    config,
                    acked_hash: None,
                    injected: pod.injected,
                    lock: pod.lock,
                    acked_once: false,
                };
                let uid = entry.uid.clone();
                let old = ns.pods.insert(pod.name.clone(), entry);
                if let Some(old) = old {
                    touched.extend(old.matched_keys(&pod.namespace));
                    self.uids.remove(&old.uid);
                }
                self.uids
                    .insert(uid, (pod.namespace.clone(), pod.name.clone()));
            }
        }
        let Some(ns) = self.namespaces.get_mut(&pod.namespace) else {
            return touched;
        };
        if let Some(entry) = ns.pods.get(&pod.name) {
            touched.extend(entry.matched_keys(&pod.namespace));
        }
        publish(ns, &pod.name, &mut self.version);
        touched
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        // Dropping the sender ends every stream of this pod.
        let Some(pod) = ns.pods.remove(name) else {
            return BTreeSet::new();
        };
        self.uids.remove(&pod.uid);
        pod.matched_keys(namespace).collect()
    }

    /// The configuration channel of pod `namespace/name` with `uid`, or None
    /// when no such pod is known (a token for a pod that is gone).
    pub fn subscribe(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Option<watch::Receiver<Arc<PodConfig>>> {
        let pod = self.namespaces.get(namespace)?.pods.get(name)?;
        (pod.uid == uid).then(|| pod.config.subscribe())
    }

    /// Whether pod `namespace/name` with `uid` exists.
    pub fn has_pod(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.namespaces
            .get(namespace)
            .and_then(|n| n.pods.get(name))
            .is_some_and(|p| p.uid == uid)
    }

    /// Whether a pod `namespace/name` exists (any uid): an operator
    /// replica, by its pod name.
    pub fn has_pod_named(&self, namespace: &str, name: &str) -> bool {
        self.namespaces
            .get(namespace)
            .is_some_and(|n| n.pods.contains_key(name))
    }

    /// Policies whose selector may select `pod`, for the pod → policy map.
    pub fn policies_of_pod(&self, namespace: &str, name: &str) -> Vec<String> {
        self.namespaces
            .get(namespace)
            .and_then(|ns| ns.pods.get(name))
            .map(|p| p.matched.clone())
            .unwrap_or_default()
    }

    /// Records that the pod's sidecar applied `version`. Returns the policy
    /// whose synced count may have changed.
    pub fn ack(
        &mut self,
        namespace: &str,
        name: &str,
        uid: &str,
        version: u64,
    ) -> BTreeSet<ObjectKey> {
        let Some(pod) = self
            .namespaces
            .get_mut(namespace)
            .and_then(|ns| ns.pods.get_mut(name))
            .filter(|p| p.uid == uid)
        else {
            return BTreeSet::new();
        };
        let current = pod.config.borrow().clone();
        if current.version != version {
            // An ack of an older snapshot says nothing about the current one.
            return BTreeSet::new();
        }
        let hash = current.policy.as_ref().map(|p| p.hash.clone());
        if pod.acked_hash == hash {
            return BTreeSet::new();
        }
        pod.acked_hash = hash;
        pod.acked_once = true;
        pod.matched_keys(namespace).collect()
    }
}

//! The pure model of the control plane: policies, connections, Secrets and
//! pods in; one versioned configuration per pod out, on a watch channel per
//! pod. No API calls and no clocks: controllers feed it, the gRPC server
//! reads it, and its tests need no Kubernetes.
//!
//! Work is proportional to what changed: a pod is matched against its own
//! namespace's policies; a policy change touches the pods it selects or
//! selected; a Secret change touches the connections that read it and the
//! pods granted those.

pub mod connection;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aip_api::agent_policy::AgentPolicySpec;
use aip_api::tool_connection::ToolConnectionSpec;
use aip_policy::FieldError;
use tokio::sync::watch;

pub use connection::{Credentials, ResolvedConnection, SecretData};

use crate::validate::{self, AcceptedPolicy, Binding};

/// What one pod's sidecar enforces.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// Increases with every change published to this pod.
    pub version: u64,
    /// None: every tool call is refused, for `deny_reason`.
    pub policy: Option<Arc<AcceptedPolicy>>,
    pub deny_reason: Option<String>,
    pub connections: Vec<Arc<ResolvedConnection>>,
    /// The governing policy is invalid and no accepted version is known:
    /// a sidecar that runs a policy keeps it (one that runs none refuses
    /// every call).
    pub keep_previous: bool,
}

impl PodConfig {
    fn same_content(&self, other: &PodConfig) -> bool {
        self.policy == other.policy
            && self.keep_previous == other.keep_previous
            && self.deny_reason == other.deny_reason
            && self.connections.len() == other.connections.len()
            && self
                .connections
                .iter()
                .zip(&other.connections)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
    }

    pub fn approval_timeout(&self) -> Duration {
        self.policy
            .as_ref()
            .map_or(validate::DEFAULT_APPROVAL_TIMEOUT, |p| p.approval_timeout)
    }
}

/// A pod as the metadata watch sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// The injector marked it (annotation `aip.io/sidecar`).
    pub injected: bool,
}

/// A policy or connection, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// What the AgentPolicy status writer needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyView {
    pub generation: Option<i64>,
    /// Errors of the current spec (empty when it is accepted).
    pub errors: Vec<FieldError>,
    /// The policy pods are running: the current spec if accepted, else the
    /// last accepted one.
    pub accepted: Option<Arc<AcceptedPolicy>>,
    pub governed_pods: u32,
    /// Governed pods whose sidecar acknowledged a config with `accepted`'s
    /// hash.
    pub synced_pods: u32,
    /// Pods also selected by another policy, and those policies' names.
    pub conflicts: BTreeMap<String, Vec<String>>,
    /// Granted connections that do not exist.
    pub missing_connections: Vec<String>,
    /// Governed pods with no gateway: not injected, and no sidecar of
    /// theirs ever connected. Their tool calls are not governed.
    pub without_sidecar: Vec<String>,
}

pub struct Index {
    namespaces: HashMap<String, Namespace>,
    version: u64,
    /// Whether the cluster's state has been listed once. Before that, a
    /// pod's config could be wrong (a policy not yet seen), so none is
    /// served.
    synced: bool,
}

impl Default for Index {
    fn default() -> Index {
        Index {
            namespaces: HashMap::new(),
            version: 0,
            synced: true,
        }
    }
}

#[derive(Default)]
struct Namespace {
    name: String,
    policies: BTreeMap<String, PolicyEntry>,
    connections: BTreeMap<String, ConnectionEntry>,
    secrets: connection::Secrets,
    pods: BTreeMap<String, PodEntry>,
}

struct PolicyEntry {
    generation: Option<i64>,
    errors: Vec<FieldError>,
    /// The last spec that passed validation.
    accepted: Option<(Arc<AcceptedPolicy>, Binding)>,
    /// The current spec's binding when nothing was ever accepted (an
    /// operator restarted while the spec is invalid): its pods are told to
    /// keep what they run.
    unaccepted: Option<Binding>,
}

impl PolicyEntry {
    /// The binding in effect: the accepted one, else the current spec's.
    fn binding(&self) -> Option<&Binding> {
        match (&self.accepted, &self.unaccepted) {
            (Some((_, b)), _) | (None, Some(b)) => Some(b),
            (None, None) => None,
        }
    }

    fn selector(&self) -> Option<&crate::selector::Selector> {
        self.binding().map(|b| &b.selector)
    }
}

struct ConnectionEntry {
    spec: ToolConnectionSpec,
    resolved: Arc<ResolvedConnection>,
}

struct PodEntry {
    uid: String,
    labels: BTreeMap<String, String>,
    /// The policies whose selector matches, in name order.
    matched: Vec<String>,
    config: watch::Sender<Arc<PodConfig>>,
    /// The policy hash of the config version the sidecar last acknowledged.
    acked_hash: Option<String>,
    injected: bool,
    /// Whether a sidecar of this pod ever acknowledged a config.
    acked_once: bool,
}

impl Index {
    /// An index that is complete as it is fed (tests, benchmarks).
    pub fn new() -> Index {
        Index::default()
    }

    /// An index that serves nothing until `mark_synced`: the operator's,
    /// while its watches make their first lists.
    pub fn loading() -> Index {
        Index {
            synced: false,
            ..Index::default()
        }
    }

    pub fn mark_synced(&mut self) {
        self.synced = true;
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Adds or replaces a policy. Returns the policies whose view changed.
    pub fn apply_policy(
        &mut self,
        namespace: &str,
        name: &str,
        generation: Option<i64>,
        spec: &AgentPolicySpec,
    ) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(namespace.to_owned())
            .or_insert_with(|| Namespace::named(namespace));
        let entry = ns
            .policies
            .entry(name.to_owned())
            .or_insert_with(|| PolicyEntry {
                generation,
                errors: Vec::new(),
                accepted: None,
                unaccepted: None,
            });
        entry.generation = generation;
        match validate::agent_policy(namespace, name, spec) {
            Ok(accepted) => {
                entry.errors.clear();
                entry.accepted = Some(accepted);
                entry.unaccepted = None;
            }
            // The last accepted spec stays in force.
            Err(errors) => {
                entry.errors = errors;
                entry.unaccepted = validate::binding(spec).ok();
            }
        }
        self.rematch_policy(namespace, name)
    }

    pub fn delete_policy(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        if ns.policies.remove(name).is_none() {
            return BTreeSet::new();
        }
        self.rematch_policy(namespace, name)
    }

    pub fn apply_connection(
        &mut self,
        namespace: &str,
        name: &str,
        spec: &ToolConnectionSpec,
    ) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(namespace.to_owned())
            .or_insert_with(|| Namespace::named(namespace));
        let resolved = Arc::new(connection::resolve(namespace, name, spec, &ns.secrets));
        ns.connections.insert(
            name.to_owned(),
            ConnectionEntry {
                spec: spec.clone(),
                resolved,
            },
        );
        self.refresh_granting(namespace, &[name.to_owned()])
    }

    pub fn delete_connection(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        if ns.connections.remove(name).is_none() {
            return BTreeSet::new();
        }
        self.refresh_granting(namespace, &[name.to_owned()])
    }

    /// Adds or replaces a Secret's data; connections reading it re-resolve.
    pub fn apply_secret(
        &mut self,
        namespace: &str,
        name: &str,
        data: SecretData,
    ) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(namespace.to_owned())
            .or_insert_with(|| Namespace::named(namespace));
        let was_unreadable = ns.secrets.unreadable.remove(name).is_some();
        if !was_unreadable && ns.secrets.data.get(name).is_some_and(|d| **d == data) {
            return BTreeSet::new();
        }
        ns.secrets.data.insert(name.to_owned(), Arc::new(data));
        self.reresolve_readers(namespace, name)
    }

    pub fn delete_secret(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let had_data = ns.secrets.data.remove(name).is_some();
        let was_unreadable = ns.secrets.unreadable.remove(name).is_some();
        if !had_data && !was_unreadable {
            return BTreeSet::new();
        }
        self.reresolve_readers(namespace, name)
    }

    /// The operator may not read Secret `name` (`reason` says how to grant
    /// it); connections reading it say so instead of "not found".
    pub fn secret_unreadable(
        &mut self,
        namespace: &str,
        name: &str,
        reason: String,
    ) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(namespace.to_owned())
            .or_insert_with(|| Namespace::named(namespace));
        let had_data = ns.secrets.data.remove(name).is_some();
        let reason = connection::Unreadable::Forbidden(reason);
        if !had_data && ns.secrets.unreadable.get(name) == Some(&reason) {
            return BTreeSet::new();
        }
        ns.secrets.unreadable.insert(name.to_owned(), reason);
        self.reresolve_readers(namespace, name)
    }

    /// A Secret a connection is about to reference that no one has read:
    /// its readers wait for its watch instead of calling it missing.
    pub fn expect_secret(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(namespace.to_owned())
            .or_insert_with(|| Namespace::named(namespace));
        if ns.secrets.data.contains_key(name) || ns.secrets.unreadable.contains_key(name) {
            return BTreeSet::new();
        }
        ns.secrets
            .unreadable
            .insert(name.to_owned(), connection::Unreadable::NotReadYet);
        self.reresolve_readers(namespace, name)
    }

    /// Every Secret some connection reads.
    pub fn referenced_secrets(&self) -> BTreeSet<ObjectKey> {
        self.namespaces
            .iter()
            .flat_map(|(ns, n)| {
                n.connections.values().flat_map(move |c| {
                    c.spec
                        .secret_refs()
                        .into_iter()
                        .map(move |(_, r)| ObjectKey::new(ns, &r.name))
                })
            })
            .collect()
    }

    /// The connections of `namespace` that read Secret `secret`.
    pub fn connections_reading(&self, namespace: &str, secret: &str) -> Vec<String> {
        self.namespaces.get(namespace).map_or_else(Vec::new, |ns| {
            ns.connections
                .iter()
                .filter(|(_, c)| c.spec.secret_refs().iter().any(|(_, r)| r.name == secret))
                .map(|(name, _)| name.clone())
                .collect()
        })
    }

    /// Adds or updates a pod. A new uid under the same name is a new pod:
    /// streams of the old one end.
    pub fn apply_pod(&mut self, pod: PodMeta) -> BTreeSet<ObjectKey> {
        let ns = self
            .namespaces
            .entry(pod.namespace.clone())
            .or_insert_with(|| Namespace::named(&pod.namespace));
        let matched = ns.matching(&pod.labels);
        let mut touched: BTreeSet<ObjectKey> = BTreeSet::new();
        match ns.pods.get_mut(&pod.name) {
            Some(entry) if entry.uid == pod.uid => {
                touched.extend(
                    entry
                        .matched
                        .iter()
                        .map(|p| ObjectKey::new(&pod.namespace, p)),
                );
                entry.labels = pod.labels;
                entry.matched = matched;
                entry.injected = pod.injected;
            }
            _ => {
                let (config, _) = watch::channel(Arc::new(PodConfig {
                    version: 0,
                    policy: None,
                    deny_reason: None,
                    connections: Vec::new(),
                    keep_previous: false,
                }));
                let entry = PodEntry {
                    uid: pod.uid,
                    labels: pod.labels,
                    matched,
                    config,
                    acked_hash: None,
                    injected: pod.injected,
                    acked_once: false,
                };
                if let Some(old) = ns.pods.insert(pod.name.clone(), entry) {
                    touched.extend(
                        old.matched
                            .iter()
                            .map(|p| ObjectKey::new(&pod.namespace, p)),
                    );
                }
            }
        }
        let ns = self
            .namespaces
            .get_mut(&pod.namespace)
            .expect("inserted above");
        let entry = ns.pods.get(&pod.name).expect("inserted above");
        touched.extend(
            entry
                .matched
                .iter()
                .map(|p| ObjectKey::new(&pod.namespace, p)),
        );
        publish(ns, &pod.name, &mut self.version);
        touched
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        // Dropping the sender ends every stream of this pod.
        ns.pods.remove(name).map_or_else(BTreeSet::new, |p| {
            p.matched
                .iter()
                .map(|m| ObjectKey::new(namespace, m))
                .collect()
        })
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
        pod.matched
            .iter()
            .map(|m| ObjectKey::new(namespace, m))
            .collect()
    }

    pub fn policy_view(&self, namespace: &str, name: &str) -> Option<PolicyView> {
        let ns = self.namespaces.get(namespace)?;
        let entry = ns.policies.get(name)?;
        let accepted = entry.accepted.as_ref().map(|(a, _)| a.clone());
        let mut view = PolicyView {
            generation: entry.generation,
            errors: entry.errors.clone(),
            accepted: accepted.clone(),
            governed_pods: 0,
            synced_pods: 0,
            conflicts: BTreeMap::new(),
            missing_connections: Vec::new(),
            without_sidecar: Vec::new(),
        };
        for (pod_name, pod) in &ns.pods {
            if !pod.matched.iter().any(|m| m == name) {
                continue;
            }
            if pod.matched.len() > 1 {
                let others = pod.matched.iter().filter(|m| *m != name).cloned().collect();
                view.conflicts.insert(pod_name.clone(), others);
                continue;
            }
            view.governed_pods += 1;
            if !pod.injected && !pod.acked_once {
                view.without_sidecar.push(pod_name.clone());
            }
            let hash = accepted.as_ref().map(|a| &a.hash);
            if hash.is_some() && pod.acked_hash.as_ref() == hash {
                view.synced_pods += 1;
            }
        }
        if let Some((_, binding)) = &entry.accepted {
            view.missing_connections = binding
                .connections
                .iter()
                .filter(|c| !ns.connections.contains_key(*c))
                .cloned()
                .collect();
        }
        Some(view)
    }

    /// The connection as resolved now (for the prober).
    pub fn connection(&self, namespace: &str, name: &str) -> Option<Arc<ResolvedConnection>> {
        let ns = self.namespaces.get(namespace)?;
        Some(ns.connections.get(name)?.resolved.clone())
    }

    /// Policies whose selector may select `pod`, for the pod → policy map.
    pub fn policies_of_pod(&self, namespace: &str, name: &str) -> Vec<String> {
        self.namespaces
            .get(namespace)
            .and_then(|ns| ns.pods.get(name))
            .map(|p| p.matched.clone())
            .unwrap_or_default()
    }

    /// Re-evaluates which pods of the namespace `policy` selects, and
    /// republishes those it selects or selected.
    fn rematch_policy(&mut self, namespace: &str, policy: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let selector = ns.policies.get(policy).and_then(|p| p.selector().cloned());
        let mut touched = BTreeSet::from([ObjectKey::new(namespace, policy)]);
        let mut republish = Vec::new();
        for (pod_name, pod) in &mut ns.pods {
            let was = pod.matched.iter().any(|m| m == policy);
            let is = selector.as_ref().is_some_and(|s| s.matches(&pod.labels));
            if was != is {
                if is {
                    pod.matched.push(policy.to_owned());
                    pod.matched.sort();
                } else {
                    pod.matched.retain(|m| m != policy);
                }
            }
            if was || is {
                touched.extend(pod.matched.iter().map(|m| ObjectKey::new(namespace, m)));
                republish.push(pod_name.clone());
            }
        }
        for pod in republish {
            publish(ns, &pod, &mut self.version);
        }
        touched
    }

    /// Republishes the pods whose policy grants one of `connections`.
    fn refresh_granting(&mut self, namespace: &str, connections: &[String]) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let granting: BTreeSet<String> = ns
            .policies
            .iter()
            .filter(|(_, p)| {
                p.binding()
                    .is_some_and(|b| b.connections.iter().any(|c| connections.contains(c)))
            })
            .map(|(name, _)| name.clone())
            .collect();
        let pods: Vec<String> = ns
            .pods
            .iter()
            .filter(|(_, p)| p.matched.iter().any(|m| granting.contains(m)))
            .map(|(name, _)| name.clone())
            .collect();
        for pod in pods {
            publish(ns, &pod, &mut self.version);
        }
        granting
            .iter()
            .map(|p| ObjectKey::new(namespace, p))
            .collect()
    }

    /// Re-resolves the connections that read Secret `secret`.
    fn reresolve_readers(&mut self, namespace: &str, secret: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let mut changed = Vec::new();
        for (name, c) in &mut ns.connections {
            if c.spec.secret_refs().iter().any(|(_, r)| r.name == secret) {
                let resolved = connection::resolve(namespace, name, &c.spec, &ns.secrets);
                if *c.resolved != resolved {
                    c.resolved = Arc::new(resolved);
                    changed.push(name.clone());
                }
            }
        }
        if changed.is_empty() {
            return BTreeSet::new();
        }
        self.refresh_granting(namespace, &changed)
    }
}

impl Namespace {
    fn named(name: &str) -> Namespace {
        Namespace {
            name: name.to_owned(),
            ..Namespace::default()
        }
    }

    fn matching(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.policies
            .iter()
            .filter(|(_, p)| p.selector().is_some_and(|s| s.matches(labels)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The existing connections a binding grants, each once.
    fn granted(&self, binding: &Binding) -> Vec<Arc<ResolvedConnection>> {
        let mut seen = BTreeSet::new();
        binding
            .connections
            .iter()
            .filter(|c| seen.insert(*c))
            .filter_map(|c| self.connections.get(c))
            .map(|c| c.resolved.clone())
            .collect()
    }

    /// What pod `name` should run now.
    fn config_for(&self, name: &str) -> PodConfig {
        let deny = |reason: String| PodConfig {
            version: 0,
            policy: None,
            deny_reason: Some(reason),
            connections: Vec::new(),
            keep_previous: false,
        };
        let Some(pod) = self.pods.get(name) else {
            return deny("the pod is unknown".to_owned());
        };
        let policy = match pod.matched.as_slice() {
            [] => {
                return deny(format!(
                    "no AgentPolicy in namespace {} selects this pod",
                    self.name
                ));
            }
            [one] => one,
            many => {
                return deny(format!(
                    "AgentPolicies {} all select this pod, so none applies",
                    many.join(", ")
                ));
            }
        };
        let entry = self.policies.get(policy);
        let Some((accepted, binding)) = entry.and_then(|p| p.accepted.as_ref()) else {
            // Its spec is invalid and no accepted version is known here
            // (the operator restarted since): a sidecar keeps what it runs,
            // taking only fresh credentials for the connections it has.
            let granted = entry
                .and_then(|p| p.unaccepted.as_ref())
                .map(|b| self.granted(b))
                .unwrap_or_default();
            return PodConfig {
                keep_previous: true,
                connections: granted,
                ..deny(format!(
                    "AgentPolicy {policy} is not accepted and this operator knows no earlier version"
                ))
            };
        };
        let connections = self.granted(binding);
        PodConfig {
            version: 0,
            policy: Some(accepted.clone()),
            deny_reason: None,
            connections,
            keep_previous: false,
        }
    }
}

/// Publishes pod `name`'s config if its content changed, under a new
/// version.
fn publish(ns: &Namespace, name: &str, version: &mut u64) {
    let mut next = ns.config_for(name);
    let Some(pod) = ns.pods.get(name) else {
        return;
    };
    if pod.config.borrow().version != 0 && pod.config.borrow().same_content(&next) {
        return;
    }
    *version += 1;
    next.version = *version;
    pod.config.send_replace(Arc::new(next));
}

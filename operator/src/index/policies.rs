//! AgentPolicies: validated once as they arrive, matched against the pods
//! of their namespace, and summarized for their status writer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aip_api::agent_policy::AgentPolicySpec;
use aip_policy::FieldError;

use super::config::publish;
use super::{Index, Namespace, ObjectKey};
use crate::selector::Selector;
use crate::validate::{self, AcceptedPolicy, Binding};

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
    /// hash, to this replica or (as reported) to another.
    pub synced_pods: u32,
    /// Governed pods with an egress lock whose gateway connected (it
    /// starts only after the pod's lock check passed).
    pub locked_pods: u32,
    /// Pods also selected by another policy, and those policies' names.
    pub conflicts: BTreeMap<String, Vec<String>>,
    /// Granted connections that do not exist.
    pub missing_connections: Vec<String>,
    /// Governed pods with no gateway: not injected, and no sidecar of
    /// theirs ever connected. Their tool calls are not governed.
    pub without_sidecar: Vec<String>,
}

pub(super) struct PolicyEntry {
    generation: Option<i64>,
    errors: Vec<FieldError>,
    /// The last spec that passed validation.
    pub(super) accepted: Option<(Arc<AcceptedPolicy>, Binding)>,
    /// The current spec's binding when nothing was ever accepted (an
    /// operator restarted while the spec is invalid): its pods are told to
    /// keep what they run.
    pub(super) unaccepted: Option<Binding>,
}

impl PolicyEntry {
    /// The binding in effect: the accepted one, else the current spec's.
    pub(super) fn binding(&self) -> Option<&Binding> {
        match (&self.accepted, &self.unaccepted) {
            (Some((_, b)), _) | (None, Some(b)) => Some(b),
            (None, None) => None,
        }
    }

    fn selector(&self) -> Option<&Selector> {
        self.binding().map(|b| &b.selector)
    }
}

impl Index {
    /// Adds or replaces a policy. Returns the policies whose view changed.
    pub fn apply_policy(
        &mut self,
        namespace: &str,
        name: &str,
        generation: Option<i64>,
        spec: &AgentPolicySpec,
    ) -> BTreeSet<ObjectKey> {
        let entry = self
            .namespace(namespace)
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
            locked_pods: 0,
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
            let connected = pod.acked_once || self.peers.acked(pod.uid(), None);
            if !pod.injected && !connected {
                view.without_sidecar.push(pod_name.clone());
            }
            if pod.lock.is_some() && connected {
                view.locked_pods += 1;
            }
            if let Some(hash) = accepted.as_ref().map(|a| a.hash.as_str())
                && (pod.acked_hash.as_deref() == Some(hash)
                    || self.peers.acked(pod.uid(), Some(hash)))
            {
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
}

impl Namespace {
    /// The policies whose selector matches `labels`, in name order.
    pub(super) fn matching(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.policies
            .iter()
            .filter(|(_, p)| p.selector().is_some_and(|s| s.matches(labels)))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

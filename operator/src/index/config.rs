//! What comes out of the index: the configuration each pod's sidecar
//! enforces, and how a new version of it is published.

use std::sync::Arc;
use std::time::Duration;

use super::{Namespace, ResolvedConnection};
use crate::validate::{self, AcceptedPolicy};

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
    /// What a pod gets before anything was decided for it.
    pub(super) fn initial() -> PodConfig {
        PodConfig {
            version: 0,
            policy: None,
            deny_reason: None,
            connections: Vec::new(),
            keep_previous: false,
        }
    }

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

impl Namespace {
    /// What pod `name` should run now.
    fn config_for(&self, name: &str) -> PodConfig {
        let deny = |reason: String| PodConfig {
            deny_reason: Some(reason),
            ..PodConfig::initial()
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
        PodConfig {
            policy: Some(accepted.clone()),
            connections: self.granted(binding),
            ..PodConfig::initial()
        }
    }
}

/// Publishes pod `name`'s config if its content changed, under a new
/// version.
pub(super) fn publish(ns: &Namespace, name: &str, version: &mut u64) {
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

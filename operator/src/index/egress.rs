//! The namespaces' EgressLocks: whether a namespace's governed pods are
//! locked, and to what. Several locks of one namespace add up.

use aip_api::EgressLockSpec;
use aip_api::egress_lock::Destination;

use super::Index;

/// What an EgressLock's status says of its namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressView {
    /// Destinations the namespace's locks allow together.
    pub destinations: u32,
    /// Locked pods whose gateway connected (so their proof passed).
    pub locked_pods: u32,
    /// Of those, pods whose rules are not the current setting's.
    pub stale_pods: u32,
}

impl Index {
    pub fn apply_egress_lock(&mut self, namespace: &str, name: &str, spec: &EgressLockSpec) {
        self.namespace(namespace)
            .egress_locks
            .insert(name.to_owned(), spec.clone());
    }

    pub fn delete_egress_lock(&mut self, namespace: &str, name: &str) {
        if let Some(ns) = self.namespaces.get_mut(namespace) {
            ns.egress_locks.remove(name);
        }
    }

    /// The namespace's lock as its EgressLocks' status says it; None when
    /// it has none.
    pub fn egress_view(&self, namespace: &str) -> Option<EgressView> {
        let allow = self.egress_allow(namespace)?;
        let ns = self.namespaces.get(namespace)?;
        let mut view = EgressView {
            destinations: u32::try_from(allow.len()).unwrap_or(u32::MAX),
            ..EgressView::default()
        };
        for pod in ns.pods.values() {
            let Some(lock) = &pod.lock else { continue };
            if !(pod.acked_once || self.peers.acked(pod.uid(), None)) {
                continue;
            }
            view.locked_pods += 1;
            if *lock != allow {
                view.stale_pods += 1;
            }
        }
        Some(view)
    }

    /// The destinations a namespace's locked pods may reach, merged, in one
    /// order whatever the order of the locks (the same setting gives the
    /// same rules); None when the namespace has no EgressLock.
    pub fn egress_allow(&self, namespace: &str) -> Option<Vec<Destination>> {
        let ns = self.namespaces.get(namespace)?;
        merged(ns.egress_locks.values())
    }
}

/// The destinations of `locks` together, in one order whatever theirs;
/// None when there are none.
pub fn merged<'a>(locks: impl IntoIterator<Item = &'a EgressLockSpec>) -> Option<Vec<Destination>> {
    let mut any = false;
    let mut out: Vec<Destination> = Vec::new();
    for lock in locks {
        any = true;
        out.extend(lock.allow.iter().cloned());
    }
    if !any {
        return None;
    }
    out.sort_by(|a, b| {
        (&a.cidr, a.protocol as u8, a.port, a.end_port).cmp(&(
            &b.cidr,
            b.protocol as u8,
            b.port,
            b.end_port,
        ))
    });
    out.dedup();
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use aip_api::egress_lock::Protocol;

    use super::*;

    fn to(cidr: &str, port: u16) -> Destination {
        Destination {
            cidr: cidr.into(),
            protocol: Protocol::Tcp,
            port: Some(port),
            end_port: None,
        }
    }

    #[test]
    fn a_namespaces_locks_add_up_in_one_order_and_none_means_unlocked() {
        let mut index = Index::new();
        assert_eq!(index.egress_allow("agents"), None);
        index.apply_egress_lock(
            "agents",
            "b",
            &EgressLockSpec {
                allow: vec![to("203.0.113.0/24", 443), to("198.51.100.0/24", 443)],
            },
        );
        index.apply_egress_lock(
            "agents",
            "a",
            &EgressLockSpec {
                allow: vec![to("203.0.113.0/24", 443)],
            },
        );
        index.apply_egress_lock("agents", "empty", &EgressLockSpec::default());
        assert_eq!(
            index.egress_allow("agents").unwrap(),
            [to("198.51.100.0/24", 443), to("203.0.113.0/24", 443)]
        );
        assert_eq!(index.egress_allow("other"), None);
        for name in ["a", "b"] {
            index.delete_egress_lock("agents", name);
        }
        assert_eq!(index.egress_allow("agents").unwrap(), []);
        index.delete_egress_lock("agents", "empty");
        assert_eq!(index.egress_allow("agents"), None);
    }
}

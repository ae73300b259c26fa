//! Acks that reached the other replicas. Every replica serves sidecars, but
//! only the lease holder writes status, so each replica publishes what its
//! sidecars acknowledged (pod uid → policy digest) and the index keeps the
//! others' reports beside its own acks: a governed pod is synced when any
//! replica saw it acknowledge the current hash.
//!
//! Keyed by uid, a pod is never counted twice (its sidecar may have acked
//! to two replicas in turn), and a report about a pod that is gone, or a
//! pod recreated under the same name, counts for nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Index, ObjectKey};

/// Hex digits of a policy hash kept in a report: enough to tell hashes of
/// one policy apart, short enough for ten thousand pods per report.
pub const DIGEST_LEN: usize = 16;

/// What a report says of a policy hash (`sha256:<hex>`).
pub fn digest(hash: &str) -> &str {
    let hex = hash.strip_prefix("sha256:").unwrap_or(hash);
    hex.get(..DIGEST_LEN).unwrap_or(hex)
}

/// Reports of the other replicas, by report name: pod uid → digest.
#[derive(Default)]
pub(super) struct PeerAcks {
    reports: HashMap<String, HashMap<String, String>>,
}

impl PeerAcks {
    /// Whether some replica reported pod `uid` acking `hash` (any hash when
    /// `hash` is None).
    pub(super) fn acked(&self, uid: &str, hash: Option<&str>) -> bool {
        self.reports.values().any(|r| match (r.get(uid), hash) {
            (Some(got), Some(want)) => got == digest(want),
            (Some(_), None) => true,
            (None, _) => false,
        })
    }
}

impl Index {
    /// Replaces report `name` of another replica. Returns the policies of
    /// the pods whose entry changed.
    pub fn apply_peer_report(
        &mut self,
        name: &str,
        acks: HashMap<String, String>,
    ) -> BTreeSet<ObjectKey> {
        let old = self
            .peers
            .reports
            .insert(name.to_owned(), acks)
            .unwrap_or_default();
        let new = &self.peers.reports[name];
        let changed: Vec<String> = old
            .iter()
            .filter(|(uid, d)| new.get(*uid) != Some(*d))
            .map(|(uid, _)| uid.clone())
            .chain(
                new.iter()
                    .filter(|(uid, d)| old.get(*uid) != Some(*d))
                    .map(|(uid, _)| uid.clone()),
            )
            .collect();
        self.policies_of_uids(&changed)
    }

    /// Forgets report `name` (its replica is gone).
    pub fn delete_peer_report(&mut self, name: &str) -> BTreeSet<ObjectKey> {
        let Some(old) = self.peers.reports.remove(name) else {
            return BTreeSet::new();
        };
        let uids: Vec<String> = old.into_keys().collect();
        self.policies_of_uids(&uids)
    }

    /// This replica's own acks, for its report: pod uid → digest of the
    /// policy hash its sidecar last acknowledged.
    pub fn local_acks(&self) -> BTreeMap<String, String> {
        self.namespaces
            .values()
            .flat_map(|ns| ns.pods.values())
            .filter_map(|p| {
                let hash = p.acked_hash.as_deref()?;
                Some((p.uid().to_owned(), digest(hash).to_owned()))
            })
            .collect()
    }

    fn policies_of_uids(&self, uids: &[String]) -> BTreeSet<ObjectKey> {
        uids.iter()
            .filter_map(|uid| self.uids.get(uid))
            .flat_map(|(ns, name)| {
                self.policies_of_pod(ns, name)
                    .into_iter()
                    .map(move |p| ObjectKey::new(ns, &p))
            })
            .collect()
    }
}

//! Acks reported by other replicas: a pod counts as synced once, whichever
//! replica its sidecar acked to, and reports about other pods count for
//! nothing.

use std::collections::HashMap;

use super::*;

fn report(entries: &[(&str, &str)]) -> HashMap<String, String> {
    entries
        .iter()
        .map(|(uid, hash)| ((*uid).to_owned(), digest(hash).to_owned()))
        .collect()
}

/// The hash of policy `p` as accepted.
fn hash_of(index: &Index) -> String {
    let view = index.policy_view("agents", "p").unwrap();
    view.accepted.unwrap().hash.clone()
}

fn synced(index: &Index) -> (u32, u32) {
    let view = index.policy_view("agents", "p").unwrap();
    (view.synced_pods, view.governed_pods)
}

#[test]
fn a_pod_acked_to_another_replica_is_synced() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_pod(pod("agents", "a-2", "u2", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    let hash = hash_of(&index);
    let v = current(&index, "agents", "a-1", "u1").version;
    index.ack("agents", "a-1", "u1", v);
    assert_eq!(synced(&index), (1, 2));

    // a-2's sidecar acked to the other replica; a-1's did both (it moved):
    // counted once.
    let touched = index.apply_peer_report("aip-sync-b-0", report(&[("u1", &hash), ("u2", &hash)]));
    assert_eq!(touched, BTreeSet::from([ObjectKey::new("agents", "p")]));
    assert_eq!(synced(&index), (2, 2));
    assert_eq!(
        index.apply_peer_report("aip-sync-b-0", report(&[("u1", &hash), ("u2", &hash)])),
        BTreeSet::new(),
        "the same report touches nothing"
    );

    // A new hash: the report's old digest no longer counts.
    index.apply_policy("agents", "p", Some(2), &policy("a", &["x", "y"], &[]));
    assert_eq!(synced(&index), (0, 2));
    let new_hash = hash_of(&index);
    index.apply_peer_report("aip-sync-b-0", report(&[("u2", &new_hash)]));
    assert_eq!(synced(&index), (1, 2));

    // The replica is gone.
    let touched = index.delete_peer_report("aip-sync-b-0");
    assert_eq!(touched, BTreeSet::from([ObjectKey::new("agents", "p")]));
    assert_eq!(synced(&index), (0, 2));
}

#[test]
fn a_report_about_a_pod_that_is_gone_or_recreated_counts_for_nothing() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    let hash = hash_of(&index);
    index.apply_peer_report(
        "aip-sync-b-0",
        report(&[("u1", &hash), ("elsewhere", &hash)]),
    );
    assert_eq!(synced(&index), (1, 1));

    // The same name, a new pod: the report speaks of the old one.
    let touched = index.apply_pod(pod("agents", "a-1", "u1-new", &[("app", "a")]));
    assert!(touched.contains(&ObjectKey::new("agents", "p")));
    assert_eq!(synced(&index), (0, 1));
    assert_eq!(
        index.apply_peer_report("aip-sync-b-0", report(&[("u1", "sha256:0000")])),
        BTreeSet::new(),
        "uids the index does not know touch nothing"
    );
}

#[test]
fn a_pod_whose_sidecar_reported_elsewhere_is_not_without_a_gateway() {
    let mut index = Index::new();
    let mut manual = pod("agents", "manual", "u1", &[("app", "a")]);
    manual.injected = false;
    index.apply_pod(manual);
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    assert_eq!(
        index.policy_view("agents", "p").unwrap().without_sidecar,
        ["manual"]
    );
    index.apply_peer_report("aip-sync-b-0", report(&[("u1", "sha256:abcd")]));
    assert!(
        index
            .policy_view("agents", "p")
            .unwrap()
            .without_sidecar
            .is_empty()
    );
}

#[test]
fn local_acks_are_what_this_replica_reports() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_pod(pod("agents", "a-2", "u2", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    assert!(index.local_acks().is_empty());
    let v = current(&index, "agents", "a-1", "u1").version;
    index.ack("agents", "a-1", "u1", v);
    let hash = hash_of(&index);
    let acks = index.local_acks();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks["u1"], digest(&hash));
    assert_eq!(acks["u1"].len(), DIGEST_LEN);
    index.delete_pod("agents", "a-1");
    assert!(index.local_acks().is_empty());
}

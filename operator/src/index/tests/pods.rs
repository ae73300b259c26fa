//! Pods: their own config, new uids, relabelling.

use super::*;

#[test]
fn a_pod_no_policy_selects_is_denied_with_the_reason() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    let config = current(&index, "agents", "a-1", "u1");
    assert!(config.policy.is_none());
    assert_eq!(
        config.deny_reason.as_deref(),
        Some("no AgentPolicy in namespace agents selects this pod")
    );
    assert!(config.version > 0, "a first config is always published");
}

#[tokio::test]
async fn a_deleted_or_replaced_pod_ends_its_streams() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    let mut old = index.subscribe("agents", "a-1", "u1").unwrap();
    assert!(
        index.subscribe("agents", "a-1", "u2").is_none(),
        "another uid gets nothing"
    );
    index.apply_pod(pod("agents", "a-1", "u2", &[("app", "a")]));
    assert!(old.changed().await.is_err(), "the old pod's stream ended");
    let mut new = index.subscribe("agents", "a-1", "u2").unwrap();
    index.delete_pod("agents", "a-1");
    assert!(new.changed().await.is_err());
    assert!(index.subscribe("agents", "a-1", "u2").is_none());
}

#[test]
fn relabelling_a_pod_moves_it_between_policies() {
    let mut index = Index::new();
    index.apply_policy("agents", "pa", Some(1), &policy("a", &["x"], &[]));
    index.apply_policy("agents", "pb", Some(1), &policy("b", &["y"], &[]));
    index.apply_pod(pod("agents", "p-1", "u1", &[("app", "a")]));
    assert_eq!(
        current(&index, "agents", "p-1", "u1")
            .policy
            .as_ref()
            .unwrap()
            .name,
        "pa"
    );
    let touched = index.apply_pod(pod("agents", "p-1", "u1", &[("app", "b")]));
    assert_eq!(
        touched,
        BTreeSet::from([
            ObjectKey::new("agents", "pa"),
            ObjectKey::new("agents", "pb")
        ])
    );
    assert_eq!(
        current(&index, "agents", "p-1", "u1")
            .policy
            .as_ref()
            .unwrap()
            .name,
        "pb"
    );
    assert_eq!(index.policy_view("agents", "pa").unwrap().governed_pods, 0);
    assert_eq!(index.policies_of_pod("agents", "p-1"), ["pb"]);
}

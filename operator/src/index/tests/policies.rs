//! Policies: validation, hashing, what an invalid spec leaves in force,
//! conflicts.

use aip_api::agent_policy::{Action, ToolRule};

use super::*;

#[test]
fn a_selected_pod_gets_the_policy_and_only_changes_bump_the_version() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["read_file"], &[]));
    let first = current(&index, "agents", "a-1", "u1");
    let accepted = first.policy.as_ref().expect("governed");
    assert_eq!(accepted.name, "p");
    assert!(accepted.hash.starts_with("sha256:"));
    assert!(
        accepted
            .document_json
            .contains("\"allowed_tools\":[\"read_file\"]")
    );
    assert!(!accepted.document_json.contains("podSelector"));

    // The same spec again (a resync) publishes nothing new.
    index.apply_policy("agents", "p", Some(1), &policy("a", &["read_file"], &[]));
    assert_eq!(
        current(&index, "agents", "a-1", "u1").version,
        first.version
    );

    index.apply_policy(
        "agents",
        "p",
        Some(2),
        &policy("a", &["read_file", "ls"], &[]),
    );
    let second = current(&index, "agents", "a-1", "u1");
    assert!(second.version > first.version);
    assert_ne!(second.policy.as_ref().unwrap().hash, accepted.hash);
}

#[test]
fn the_hash_is_the_one_aip_policy_hash_prints() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy(
        "agents",
        "p",
        Some(1),
        &policy("a", &["read_file"], &["fs"]),
    );
    let file = aip_policy::AgentPolicy::from_yaml(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p}\nspec: {allowed_tools: [read_file]}\n",
    )
    .unwrap();
    let config = current(&index, "agents", "a-1", "u1");
    assert_eq!(
        config.policy.as_ref().unwrap().hash,
        aip_policy::hash::policy_hash(&file)
    );
}

#[test]
fn an_invalid_update_keeps_the_last_accepted_policy_in_force() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["read_file"], &[]));
    let before = current(&index, "agents", "a-1", "u1");

    let mut bad = policy("a", &["read_file"], &[]);
    bad.tool_rules = Some(vec![ToolRule {
        tool: "x".to_owned(),
        action: Some(Action::Allow),
        rate_limit: Some("lots".to_owned()),
        strict_args: None,
        allow_args: Some(BTreeMap::from([("path".to_owned(), "(".to_owned())])),
        schema_hash: None,
    }]);
    let touched = index.apply_policy("agents", "p", Some(2), &bad);
    assert!(touched.contains(&ObjectKey::new("agents", "p")));

    let after = current(&index, "agents", "a-1", "u1");
    assert_eq!(after.version, before.version, "nothing new is published");
    let view = index.policy_view("agents", "p").unwrap();
    assert_eq!(view.generation, Some(2));
    let paths: Vec<&str> = view.errors.iter().map(|e| e.path.as_str()).collect();
    assert!(
        paths.contains(&"spec.tool_rules[0].rate_limit"),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"spec.tool_rules[0].allow_args.path"),
        "{paths:?}"
    );
    assert_eq!(view.accepted, before.policy);
}

#[test]
fn two_policies_selecting_one_pod_deny_it_and_both_report_the_conflict() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_pod(pod("agents", "b-1", "u2", &[("app", "b")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["read_file"], &[]));
    let mut wide = policy("a", &["ls"], &[]);
    wide.pod_selector = None;
    let touched = index.apply_policy("agents", "wide", Some(1), &wide);
    assert!(touched.contains(&ObjectKey::new("agents", "p")));

    let config = current(&index, "agents", "a-1", "u1");
    assert!(config.policy.is_none());
    assert_eq!(
        config.deny_reason.as_deref(),
        Some("AgentPolicies p, wide all select this pod, so none applies")
    );
    let p = index.policy_view("agents", "p").unwrap();
    assert_eq!(p.conflicts.get("a-1"), Some(&vec!["wide".to_owned()]));
    assert_eq!(p.governed_pods, 0);
    let w = index.policy_view("agents", "wide").unwrap();
    assert_eq!(w.conflicts.get("a-1"), Some(&vec!["p".to_owned()]));
    assert_eq!(w.governed_pods, 1, "b-1 is governed by wide alone");

    index.delete_policy("agents", "wide");
    let config = current(&index, "agents", "a-1", "u1");
    assert_eq!(config.policy.as_ref().unwrap().name, "p");
    assert!(
        index
            .policy_view("agents", "p")
            .unwrap()
            .conflicts
            .is_empty()
    );
}

#[test]
fn an_invalid_selector_is_reported_at_its_path() {
    let mut index = Index::new();
    let mut spec = policy("a", &["x"], &[]);
    spec.pod_selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "app".to_owned(),
                operator: "Like".to_owned(),
                values: Some(vec!["a".to_owned()]),
            },
        ]),
        ..LabelSelector::default()
    });
    index.apply_policy("agents", "p", Some(1), &spec);
    let view = index.policy_view("agents", "p").unwrap();
    assert_eq!(view.errors.len(), 1);
    assert_eq!(view.errors[0].path, "spec.podSelector");
    assert!(view.accepted.is_none());
}

#[test]
fn a_policy_never_accepted_here_tells_its_pods_to_keep_what_they_run() {
    // An operator restarted while the spec is invalid: it knows the pods the
    // policy selects, not the version they run.
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_pod(pod("agents", "b-1", "u2", &[("app", "b")]));
    let mut bad = policy("a", &["read_file"], &[]);
    bad.tool_rules = Some(vec![ToolRule {
        tool: "x".to_owned(),
        action: None,
        rate_limit: Some("lots".to_owned()),
        strict_args: None,
        allow_args: None,
        schema_hash: None,
    }]);
    index.apply_policy("agents", "p", Some(3), &bad);
    let governed = current(&index, "agents", "a-1", "u1");
    assert!(governed.keep_previous);
    assert!(governed.policy.is_none());
    assert_eq!(
        governed.deny_reason.as_deref(),
        Some("AgentPolicy p is not accepted and this operator knows no earlier version")
    );
    assert!(!current(&index, "agents", "b-1", "u2").keep_previous);
    // Fixed: the pods get it, and keep_previous is over.
    index.apply_policy("agents", "p", Some(4), &policy("a", &["read_file"], &[]));
    let fixed = current(&index, "agents", "a-1", "u1");
    assert!(!fixed.keep_previous);
    assert_eq!(fixed.policy.as_ref().unwrap().name, "p");
}

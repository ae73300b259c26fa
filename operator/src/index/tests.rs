use std::collections::BTreeMap;

use aip_api::agent_policy::{Action, ToolRule};
use aip_api::tool_connection::{HeaderSpec, SecretKeyRef, ValueSource, ValueSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use secrecy::ExposeSecret;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn pod(ns: &str, name: &str, uid: &str, pairs: &[(&str, &str)]) -> PodMeta {
    PodMeta {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        labels: labels(pairs),
        injected: true,
    }
}

fn policy(app: &str, tools: &[&str], connections: &[&str]) -> AgentPolicySpec {
    AgentPolicySpec {
        allowed_tools: Some(tools.iter().map(|t| (*t).to_owned()).collect()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("app", app)])),
            ..LabelSelector::default()
        }),
        tool_connections: connections.iter().map(|c| (*c).to_owned()).collect(),
        ..AgentPolicySpec::default()
    }
}

fn connection(secret: &str, key: &str) -> ToolConnectionSpec {
    serde_json::from_value(serde_json::json!({
        "url": "https://mcp.example.com/mcp",
        "bearerToken": {"valueFrom": {"secretKeyRef": {"name": secret, "key": key}}},
    }))
    .unwrap()
}

fn secret(pairs: &[(&str, &str)]) -> SecretData {
    SecretData(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect(),
    )
}

fn current(index: &Index, ns: &str, name: &str, uid: &str) -> Arc<PodConfig> {
    index.subscribe(ns, name, uid).unwrap().borrow().clone()
}

fn bearer(config: &PodConfig, connection: &str) -> Result<String, String> {
    let c = config
        .connections
        .iter()
        .find(|c| c.name == connection)
        .expect("connection granted");
    c.credentials.as_ref().map_err(Clone::clone).map(|cred| {
        cred.headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v.expose_secret().to_owned())
            .unwrap_or_default()
    })
}

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
fn granted_connections_carry_resolved_credentials_and_follow_rotation() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy(
        "agents",
        "p",
        Some(1),
        &policy("a", &["read_file"], &["gh"]),
    );
    index.apply_connection("agents", "gh", &connection("gh-token", "token"));
    let missing = current(&index, "agents", "a-1", "u1");
    assert_eq!(
        bearer(&missing, "gh"),
        Err("spec.bearerToken: Secret gh-token not found".to_owned())
    );
    assert_eq!(
        index.referenced_secrets(),
        BTreeSet::from([ObjectKey::new("agents", "gh-token")])
    );

    // Referenced but not read yet: waiting, not missing.
    index.expect_secret("agents", "gh-token");
    let waiting = index.connection("agents", "gh").unwrap();
    assert!(waiting.credentials_pending);
    assert_eq!(
        waiting.credentials.as_ref().err().map(String::as_str),
        Some("spec.bearerToken: Secret gh-token has not been read yet")
    );

    // Unreadable (no RBAC grant): the connection says how to grant it.
    index.secret_unreadable("agents", "gh-token", "grant it with X".to_owned());
    let unreadable = current(&index, "agents", "a-1", "u1");
    assert_eq!(
        bearer(&unreadable, "gh"),
        Err("spec.bearerToken: grant it with X".to_owned())
    );
    assert!(
        !index
            .connection("agents", "gh")
            .unwrap()
            .credentials_pending
    );

    index.apply_secret("agents", "gh-token", secret(&[("token", "one\n")]));
    let first = current(&index, "agents", "a-1", "u1");
    assert_eq!(bearer(&first, "gh"), Ok("Bearer one".to_owned()));
    assert!(first.version > missing.version);

    index.apply_secret("agents", "gh-token", secret(&[("token", "two")]));
    let rotated = current(&index, "agents", "a-1", "u1");
    assert_eq!(bearer(&rotated, "gh"), Ok("Bearer two".to_owned()));
    assert!(rotated.version > first.version);

    // An unrelated Secret publishes nothing.
    index.apply_secret("agents", "unrelated", secret(&[("x", "y")]));
    assert_eq!(
        current(&index, "agents", "a-1", "u1").version,
        rotated.version
    );

    index.apply_secret("agents", "gh-token", secret(&[("other", "x")]));
    assert_eq!(
        bearer(&current(&index, "agents", "a-1", "u1"), "gh"),
        Err("spec.bearerToken: Secret gh-token has no key token".to_owned())
    );
}

#[test]
fn credentials_never_show_in_debug_output() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &[], &["gh"]));
    let mut spec = connection("gh-token", "token");
    spec.headers.push(HeaderSpec {
        name: "x-api-key".to_owned(),
        value_from: ValueSource {
            secret_key_ref: SecretKeyRef {
                name: "gh-token".to_owned(),
                key: "key".to_owned(),
                namespace: None,
            },
        },
    });
    index.apply_connection("agents", "gh", &spec);
    let data = secret(&[("token", "tok-SECRET-1"), ("key", "key-SECRET-2")]);
    assert!(!format!("{data:?}").contains("SECRET"));
    index.apply_secret("agents", "gh-token", data);
    let config = current(&index, "agents", "a-1", "u1");
    let printed = format!("{config:?}");
    assert!(printed.contains("x-api-key"));
    assert!(!printed.contains("SECRET"), "{printed}");
}

#[test]
fn a_header_secret_with_a_line_break_is_refused_by_name() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &[], &["gh"]));
    index.apply_connection("agents", "gh", &connection("gh-token", "token"));
    index.apply_secret(
        "agents",
        "gh-token",
        secret(&[("token", "a\r\nX-Injected: 1")]),
    );
    assert_eq!(
        bearer(&current(&index, "agents", "a-1", "u1"), "gh"),
        Err("spec.bearerToken: Secret gh-token key token holds a control character, which no header value may".to_owned())
    );
}

#[test]
fn connections_are_granted_only_from_the_policys_own_namespace() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_connection("other", "gh", &connection("s", "k"));
    index.apply_policy("agents", "p", Some(1), &policy("a", &[], &["gh"]));
    assert!(
        current(&index, "agents", "a-1", "u1")
            .connections
            .is_empty()
    );
    assert_eq!(
        index
            .policy_view("agents", "p")
            .unwrap()
            .missing_connections,
        ["gh"]
    );
    index.apply_connection("agents", "gh", &connection("s", "k"));
    assert_eq!(current(&index, "agents", "a-1", "u1").connections.len(), 1);
    assert!(
        index
            .policy_view("agents", "p")
            .unwrap()
            .missing_connections
            .is_empty()
    );
    index.delete_connection("agents", "gh");
    assert!(
        current(&index, "agents", "a-1", "u1")
            .connections
            .is_empty()
    );
}

#[test]
fn acks_of_the_current_version_count_as_synced() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "a-1", "u1", &[("app", "a")]));
    index.apply_pod(pod("agents", "a-2", "u2", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    let view = index.policy_view("agents", "p").unwrap();
    assert_eq!((view.governed_pods, view.synced_pods), (2, 0));

    let v1 = current(&index, "agents", "a-1", "u1").version;
    assert!(
        index.ack("agents", "a-1", "u1", v1 - 1).is_empty(),
        "stale ack"
    );
    assert!(index.ack("agents", "a-1", "wrong-uid", v1).is_empty());
    let touched = index.ack("agents", "a-1", "u1", v1);
    assert_eq!(touched, BTreeSet::from([ObjectKey::new("agents", "p")]));
    assert_eq!(index.policy_view("agents", "p").unwrap().synced_pods, 1);

    // A new policy hash unsyncs until acked again.
    index.apply_policy("agents", "p", Some(2), &policy("a", &["x", "y"], &[]));
    assert_eq!(index.policy_view("agents", "p").unwrap().synced_pods, 0);
    let v2 = current(&index, "agents", "a-1", "u1").version;
    index.ack("agents", "a-1", "u1", v2);
    assert_eq!(index.policy_view("agents", "p").unwrap().synced_pods, 1);
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
fn bearer_token_value_spec_round_trips() {
    // The CR form of a bearer token, as the sidecar's file form writes it.
    let spec = connection("s", "k");
    assert_eq!(
        spec.bearer_token,
        Some(ValueSpec {
            value_from: ValueSource {
                secret_key_ref: SecretKeyRef {
                    name: "s".to_owned(),
                    key: "k".to_owned(),
                    namespace: None
                }
            }
        })
    );
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

#[test]
fn a_governed_pod_without_a_gateway_is_named_until_its_sidecar_reports() {
    let mut index = Index::new();
    index.apply_pod(pod("agents", "injected", "u1", &[("app", "a")]));
    let mut manual = pod("agents", "manual", "u2", &[("app", "a")]);
    manual.injected = false;
    index.apply_pod(manual);
    let mut stray = pod("agents", "stray", "u3", &[("app", "other")]);
    stray.injected = false;
    index.apply_pod(stray);
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    let view = index.policy_view("agents", "p").unwrap();
    assert_eq!(
        view.without_sidecar,
        ["manual"],
        "ungoverned pods are not its business"
    );

    // A sidecar started by hand counts once it has reported.
    let v = current(&index, "agents", "manual", "u2").version;
    index.ack("agents", "manual", "u2", v);
    assert!(
        index
            .policy_view("agents", "p")
            .unwrap()
            .without_sidecar
            .is_empty()
    );
}

//! Connections and their Secrets: resolution, rotation, refusals by name,
//! grants within the namespace, and credentials kept out of Debug.

use aip_api::tool_connection::{HeaderSpec, SecretKeyRef, ValueSource, ValueSpec};

use super::*;

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
    index.apply_connection(
        "agents",
        "gh",
        &connection("gh-token", "token"),
        BTreeMap::new(),
    );
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
        waiting.credentials.as_ref().err().map(ToString::to_string),
        Some("spec.bearerToken: Secret gh-token has not been read yet".to_owned())
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
    index.apply_connection("agents", "gh", &spec, BTreeMap::new());
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
    index.apply_connection(
        "agents",
        "gh",
        &connection("gh-token", "token"),
        BTreeMap::new(),
    );
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
    index.apply_connection("other", "gh", &connection("s", "k"), BTreeMap::new());
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
    index.apply_connection("agents", "gh", &connection("s", "k"), BTreeMap::new());
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

//! Acks: what counts as synced, and pods that run without a gateway.

use super::*;

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

#[test]
fn a_locked_pod_counts_as_locked_once_its_gateway_connected() {
    let mut index = Index::new();
    let mut locked = pod("agents", "a-1", "u1", &[("app", "a")]);
    locked.lock = Some(Vec::new());
    index.apply_pod(locked);
    index.apply_pod(pod("agents", "a-2", "u2", &[("app", "a")]));
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    // Its gateway starts only after its lock check passed: until then the
    // lock is not proven.
    assert_eq!(index.policy_view("agents", "p").unwrap().locked_pods, 0);
    for (name, uid) in [("a-1", "u1"), ("a-2", "u2")] {
        let v = current(&index, "agents", name, uid).version;
        index.ack("agents", name, uid, v);
    }
    let view = index.policy_view("agents", "p").unwrap();
    assert_eq!((view.governed_pods, view.locked_pods), (2, 1));
}

#[test]
fn a_locked_pod_on_an_older_setting_counts_as_stale() {
    use aip_api::egress_lock::Destination;
    let mut index = Index::new();
    let setting = vec![Destination {
        cidr: "203.0.113.0/24".into(),
        protocol: Default::default(),
        port: Some(443),
        end_port: None,
    }];
    index.apply_egress_lock(
        "agents",
        "a",
        &aip_api::EgressLockSpec {
            allow: setting.clone(),
        },
    );
    for (name, uid, lock) in [("new", "u1", setting.clone()), ("old", "u2", Vec::new())] {
        let mut p = pod("agents", name, uid, &[("app", "a")]);
        p.lock = Some(lock);
        index.apply_pod(p);
    }
    index.apply_policy("agents", "p", Some(1), &policy("a", &["x"], &[]));
    // Not proven until the gateway connected.
    assert_eq!(index.egress_view("agents").unwrap().locked_pods, 0);
    for (name, uid) in [("new", "u1"), ("old", "u2")] {
        let v = current(&index, "agents", name, uid).version;
        index.ack("agents", name, uid, v);
    }
    let view = index.egress_view("agents").unwrap();
    assert_eq!(
        (view.destinations, view.locked_pods, view.stale_pods),
        (1, 2, 1)
    );
    assert_eq!(index.egress_view("elsewhere"), None);
}

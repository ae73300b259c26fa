//! What kube-controller-manager adds to the API server, each controller the
//! crate runs seen doing its job: a namespace's `default` ServiceAccount and
//! `kube-root-ca.crt`, namespace deletion, garbage collection by
//! ownerReferences, aggregated ClusterRoles, and legacy token Secrets. One
//! control plane serves every test in this binary.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use aip_kube_test::{User, fresh_namespace, shared};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// How long a controller may take to act (it reacts to watch events, so
/// usually well under a second).
const ACTED: Duration = Duration::from_secs(60);

#[tokio::test]
async fn fresh_namespace_has_its_default_service_account_and_root_ca() {
    let control_plane = shared().await;
    let namespace = fresh_namespace("fresh").await;
    let admin = control_plane.client(User::Admin).await;
    Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
        .get("default")
        .await
        .expect("fresh_namespace returns once default exists");
    let published = until(
        Api::<ConfigMap>::namespaced(admin, &namespace),
        "kube-root-ca.crt",
        |cm: Option<&ConfigMap>| cm.is_some(),
    )
    .await;
    let ca = published
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .expect("kube-root-ca.crt holds ca.crt");
    match control_plane.ca_pem() {
        Some(pem) if control_plane.is_local() => assert_eq!(ca, pem),
        _ => assert!(ca.contains("BEGIN CERTIFICATE"), "{ca}"),
    }
}

#[tokio::test]
async fn deleted_namespace_is_emptied_and_removed() {
    let control_plane = shared().await;
    let namespace = fresh_namespace("doomed").await;
    let admin = control_plane.client(User::Admin).await;
    Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &config_map("leftover", None))
        .await
        .expect("a ConfigMap in the namespace");
    let namespaces: Api<Namespace> = Api::all(admin);
    let uid = namespaces
        .get(&namespace)
        .await
        .expect("the namespace exists")
        .metadata
        .uid
        .expect("it has a uid");
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .expect("the namespace is deleted");
    gone(namespaces, &namespace, &uid).await;
}

#[tokio::test]
async fn dependents_of_a_deleted_owner_are_collected() {
    let control_plane = shared().await;
    let namespace = fresh_namespace("owners").await;
    let maps: Api<ConfigMap> = Api::namespaced(control_plane.client(User::Admin).await, &namespace);
    let owner = maps
        .create(&PostParams::default(), &config_map("owner", None))
        .await
        .expect("the owner is created");
    let reference = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().expect("a uid"),
        ..OwnerReference::default()
    };
    let dependent = maps
        .create(
            &PostParams::default(),
            &config_map("dependent", Some(reference)),
        )
        .await
        .expect("the dependent is created");
    maps.delete("owner", &DeleteParams::background())
        .await
        .expect("the owner is deleted");
    gone(maps, "dependent", &dependent.metadata.uid.expect("a uid")).await;
}

/// `view` lists what every ClusterRole labelled
/// `rbac.authorization.k8s.io/aggregate-to-view` grants: the controller
/// fills it (an API server alone leaves aggregated roles as bootstrapped).
#[tokio::test]
async fn view_aggregates_every_cluster_role_labelled_for_it() {
    let control_plane = shared().await;
    let roles: Api<ClusterRole> = Api::all(control_plane.client(User::Admin).await);
    let view = roles.get("view").await.expect("the bootstrap view role");
    assert!(view.aggregation_rule.is_some(), "view is aggregated");
    assert!(
        view.rules.as_ref().is_some_and(|r| !r.is_empty()),
        "view has rules: {view:?}"
    );

    let suffix = format!("{:08x}", rand::random::<u32>());
    let name = format!("aip-kube-test-widgets-{suffix}");
    let resource = format!("widgets{suffix}");
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                "rbac.authorization.k8s.io/aggregate-to-view".to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["example.aip.io".into()]),
            resources: Some(vec![resource.clone()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("the labelled role is created");
    let grants = |role: Option<&ClusterRole>| {
        role.and_then(|r| r.rules.as_ref()).is_some_and(|rules| {
            rules.iter().any(|rule| {
                rule.resources
                    .as_ref()
                    .is_some_and(|r| r.contains(&resource))
            })
        })
    };
    until(roles.clone(), "view", grants).await;
    roles
        .delete(&name, &DeleteParams::default())
        .await
        .expect("the labelled role is deleted");
    until(roles, "view", |role: Option<&ClusterRole>| !grants(role)).await;
}

/// A `kubernetes.io/service-account-token` Secret (what charts make for a
/// long-lived token) is filled by the token controller, signed with
/// `--service-account-private-key-file`, and authenticates.
#[tokio::test]
async fn legacy_token_secret_is_filled_and_authenticates() {
    let control_plane = shared().await;
    let namespace = fresh_namespace("legacy").await;
    let admin = control_plane.client(User::Admin).await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("default-token".into()),
            annotations: Some(BTreeMap::from([(
                "kubernetes.io/service-account.name".to_owned(),
                "default".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/service-account-token".into()),
        ..Secret::default()
    };
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &namespace);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("the token Secret is created");
    let filled = until(secrets, "default-token", |s: Option<&Secret>| {
        s.and_then(|s| s.data.as_ref())
            .is_some_and(|d| d.contains_key("token"))
    })
    .await;
    let data = filled.data.unwrap_or_default();
    let text = |key: &str| {
        String::from_utf8(data.get(key).map(|b| b.0.clone()).unwrap_or_default()).expect("UTF-8")
    };
    assert_eq!(text("namespace"), namespace);
    if let (true, Some(pem)) = (control_plane.is_local(), control_plane.ca_pem()) {
        assert_eq!(text("ca.crt"), pem, "ca.crt is --root-ca-file");
    }
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: text("token"),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let status = Api::<TokenReview>::all(admin)
        .create(&PostParams::default(), &review)
        .await
        .expect("the admin may review tokens")
        .status
        .expect("a review has a status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        status.user.and_then(|u| u.username),
        Some(format!("system:serviceaccount:{namespace}:default"))
    );
}

fn config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Waits (watching) until `cond` holds for object `name`; returns it.
async fn until<K>(api: Api<K>, name: &str, cond: impl Condition<K>) -> K
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(ACTED, await_condition(api, name, cond)).await {
        Ok(Ok(Some(object))) => object,
        Ok(Ok(None)) => panic!("{name} does not exist"),
        Ok(Err(e)) => panic!("watching {name}: {e}"),
        Err(_) => panic!("{name} did not reach the expected state within {ACTED:?}"),
    }
}

/// Waits (watching) until the object `name` with `uid` no longer exists.
async fn gone<K>(api: Api<K>, name: &str, uid: &str)
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(
        ACTED,
        await_condition(api, name, conditions::is_deleted(uid)),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("watching {name}: {e}"),
        Err(_) => panic!("{name} still exists after {ACTED:?}"),
    }
}

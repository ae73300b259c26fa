//! Who is who on the real API server: the version it reports, each test
//! identity authenticated as itself, and RBAC's own 403s for whoever holds
//! no role. One control plane serves every test in this binary.

use std::time::{Duration, Instant};

use aip_kube_test::{User, fresh_namespace, shared};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::test]
async fn version_is_the_kubernetes_that_was_built() {
    let control_plane = shared().await;
    let info = control_plane
        .client(User::Admin)
        .await
        .apiserver_version()
        .await
        .expect("/version answers");
    assert_eq!(info.git_version, control_plane.version());
    if control_plane.is_local() {
        assert!(
            info.git_version.starts_with("v1.37."),
            "{}",
            info.git_version
        );
        assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "37"));
    }
}

#[tokio::test]
async fn every_identity_is_authenticated_as_itself() {
    let control_plane = shared().await;
    for user in User::ALL {
        let review = Api::<SelfSubjectReview>::all(control_plane.client(user).await)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .unwrap_or_else(|e| panic!("{user} may review itself: {e}"));
        let info = review
            .status
            .and_then(|s| s.user_info)
            .unwrap_or_else(|| panic!("{user}'s review has a userInfo"));
        let groups = info.groups.clone().unwrap_or_default();
        assert!(
            groups.iter().any(|g| g == "system:authenticated"),
            "{user}: {groups:?}"
        );
        if user == User::Admin && !control_plane.is_local() {
            // Whoever the given kubeconfig's credentials belong to.
            continue;
        }
        assert_eq!(info.username.as_deref(), Some(user.name()));
        assert_eq!(info.uid.as_deref(), Some(user.uid()));
        let mut expected: Vec<&str> = user.groups().to_vec();
        expected.push("system:authenticated");
        let mut got: Vec<&str> = groups.iter().map(String::as_str).collect();
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected, "{user}'s groups");
    }
}

/// What kubectl and the processes under test are given: each file reaches
/// the server as its user.
#[tokio::test]
async fn kubeconfig_files_reach_the_server_as_their_user() {
    let control_plane = shared().await;
    for user in [User::Alice, User::Bob, User::Carol, User::Victor] {
        let path = control_plane.kubeconfig_file(user);
        let file =
            Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let client = kube::Client::try_from(config).expect("a client");
        let review = Api::<SelfSubjectReview>::all(client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .unwrap_or_else(|e| panic!("{user} may review itself: {e}"));
        let name = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username);
        assert_eq!(name.as_deref(), Some(user.name()), "{}", path.display());
    }
}

#[tokio::test]
async fn carol_may_not_list_secrets() {
    let namespace = fresh_namespace("carol").await;
    let carol = shared().await.client(User::Carol).await;
    let status = forbidden(
        Api::<Secret>::namespaced(carol, &namespace)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(
        status.message,
        format!(
            "secrets is forbidden: User \"carol\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{namespace}\""
        )
    );
}

/// `view` is an aggregated ClusterRole: it lists pods only because the
/// aggregation controller filled it, and never secrets.
#[tokio::test]
async fn victor_bound_to_view_lists_pods_but_not_secrets() {
    let control_plane = shared().await;
    let namespace = fresh_namespace("victor").await;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("viewers".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "view".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: "viewers".into(),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(control_plane.client(User::Admin).await, &namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("admin binds viewers to view");

    let victor = control_plane.client(User::Victor).await;
    let pods: Api<Pod> = Api::namespaced(victor.clone(), &namespace);
    // The authorizer reads bindings from an informer: the new one is
    // honoured a moment after it is written, and there is no event to wait on.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = pods.list(&ListParams::default()).await {
        assert!(
            Instant::now() < deadline,
            "victor still may not list pods: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let status = forbidden(
        Api::<Secret>::namespaced(victor, &namespace)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(
        status.message,
        format!(
            "secrets is forbidden: User \"victor\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{namespace}\""
        )
    );
}

/// The Status of a request RBAC refused.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (403, "Forbidden"),
                "{status:?}"
            );
            *status
        }
        other => panic!("expected a 403, got {other:?}"),
    }
}

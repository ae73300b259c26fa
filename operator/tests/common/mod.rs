//! Shared by the operator's integration tests: the genuine control plane
//! (aip-kube-test) with an admin client, the project's CRDs, pods and their
//! service-account tokens.

#![allow(dead_code, clippy::unwrap_used)]

pub mod agent;
pub mod kubectl;
pub mod local;

use std::path::{Path, PathBuf};
use std::time::Duration;

use aip_kube_test::{ControlPlane, Dedicated, User};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;

use kubectl::Kubectl;

/// The field manager this suite installs the CRDs with.
const TEST_MANAGER: &str = "aip-operator-tests";

/// A control plane and its administrator: the test binary's shared one
/// (each test in namespaces of its own), or one a test has to itself
/// (it installs the cluster-wide chart).
pub struct Cluster {
    pub plane: Dedicated,
    pub admin: Client,
}

impl Cluster {
    /// The test binary's control plane.
    pub async fn shared() -> Cluster {
        let plane = Dedicated::Given(aip_kube_test::shared().await);
        let admin = plane.client(User::Admin).await;
        Cluster { plane, admin }
    }

    /// A control plane for this test alone.
    pub async fn dedicated() -> Cluster {
        let plane = aip_kube_test::dedicated().await;
        let admin = plane.client(User::Admin).await;
        Cluster { plane, admin }
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// A namespace of the test's own, `PREFIX-xxxxx`, once its `default`
    /// ServiceAccount exists.
    pub async fn fresh_namespace(&self, prefix: &str) -> String {
        match self.plane.fresh_namespace(prefix).await {
            Ok(name) => name,
            Err(e) => panic!("{e}"),
        }
    }

    /// A namespace named `name` (on a dedicated control plane), once the
    /// service-account controller has made its `default` ServiceAccount.
    pub async fn namespace(&self, name: &str) {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        self.account_exists(name, "default").await;
    }

    /// Waits for ServiceAccount `ns/name` (watched).
    pub async fn account_exists(&self, ns: &str, name: &str) {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        let exists = await_condition(accounts, name, |sa: Option<&ServiceAccount>| sa.is_some());
        tokio::time::timeout(Duration::from_secs(60), exists)
            .await
            .unwrap_or_else(|_| panic!("ServiceAccount {ns}/{name} never appeared"))
            .unwrap();
    }

    pub async fn service_account(&self, ns: &str, name: &str) {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
    }

    /// Creates a pod running as `account`; returns its uid. (No kubelet:
    /// it stays Pending, which is all the operator looks at.)
    pub async fn pod(
        &self,
        ns: &str,
        name: &str,
        account: &str,
        labels: serde_json::Value,
    ) -> String {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        let pod = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"serviceAccountName": account, "containers": [{"name": "agent", "image": "agent"}]}}))
                .unwrap(),
            )
            .await
            .unwrap();
        pod.metadata.uid.unwrap()
    }

    /// A token for `account` (the API server's audience, bound to no pod),
    /// as a controller's projected token is.
    pub async fn account_token(&self, ns: &str, account: &str) -> String {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        let request: TokenRequest =
            serde_json::from_value(json!({"spec": {"expirationSeconds": 7200}})).unwrap();
        let minted = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .unwrap();
        minted.status.unwrap().token.unwrap()
    }

    /// A token for `account` bound to pod `pod` (uid), for `audiences`
    /// (empty: the API server's own), as the kubelet projects one.
    pub async fn token(
        &self,
        ns: &str,
        account: &str,
        pod: &str,
        uid: &str,
        audiences: &[&str],
    ) -> String {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        let mut spec = json!({"expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}});
        if !audiences.is_empty() {
            spec["audiences"] = json!(audiences);
        }
        let request: TokenRequest = serde_json::from_value(json!({"spec": spec})).unwrap();
        let minted = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .unwrap();
        minted.status.unwrap().token.unwrap()
    }

    /// A kubeconfig file in `dir` for the bearer `token`.
    pub fn kubeconfig(&self, dir: &Path, token: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("token-{n}.kubeconfig"));
        std::fs::write(&path, self.plane.kubeconfig_with_token(token)).unwrap();
        path
    }

    /// kubectl as `user`, in namespace `ns`.
    pub fn kubectl(&self, user: User, ns: &str) -> Kubectl {
        Kubectl {
            kubeconfig: self.plane.kubeconfig_file(user),
            namespace: ns.to_owned(),
        }
    }

    /// A kube-rs client for the bearer `token`.
    pub async fn client_with_token(&self, token: &str) -> Client {
        self.plane.client_with_token(token).await.unwrap()
    }

    /// Whether the API server can call webhooks this test serves on the
    /// host's loopback: only a control plane started here can. On a
    /// cluster given by `AIP_TEST_KUBECONFIG` (kind, a cloud) it cannot,
    /// and the test says so and stops.
    pub fn calls_back_here(&self, test: &str) -> bool {
        let local = self.plane.is_local();
        if !local {
            eprintln!(
                "{test}: skipped on {}: its API server cannot reach webhooks on this host's loopback",
                self.plane.url()
            );
        }
        local
    }

    /// The administrator's user name as the API server knows it (`admin`
    /// locally; a given cluster's own otherwise).
    pub async fn admin_name(&self) -> String {
        let api: Api<SelfSubjectReview> = Api::all(self.admin.clone());
        let review: SelfSubjectReview = serde_json::from_value(json!({})).unwrap();
        let answered = api.create(&PostParams::default(), &review).await.unwrap();
        answered
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap()
    }
}

/// The project's CRDs on `client`'s cluster (server-side applied, so that
/// concurrent tests may all ask), once each is Established.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let apply = PatchParams::apply(TEST_MANAGER).force();
    for crd in aip_api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &apply, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("the API server refused CRD {name}: {e}"));
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .unwrap_or_else(|_| panic!("CRD {name} never became Established"))
            .unwrap();
    }
}

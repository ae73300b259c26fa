//! Shared by the operator's integration tests: a fake API server with an
//! admin client, pods and their minted service-account tokens.

#![allow(dead_code, clippy::unwrap_used)]

pub mod agent;
pub mod kubectl;
pub mod local;

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, Config};
use serde_json::json;

pub struct Cluster {
    pub running: Running,
    pub admin: Client,
}

impl Cluster {
    pub async fn start() -> Cluster {
        Cluster::with_users("").await
    }

    /// A server that also knows the users of `token_file` (kube-apiserver's
    /// token file format: `token,user,uid,"group1,group2"` per line).
    pub async fn with_users(token_file: &str) -> Cluster {
        let options = Options {
            tokens: aip_fake_apiserver::auth::Tokens::parse(token_file).unwrap(),
            ..Options::default()
        };
        let running = aip_fake_apiserver::start(options).await.unwrap();
        let admin = client(&running, ADMIN_TOKEN).await;
        Cluster { running, admin }
    }

    pub async fn namespace(&self, name: &str) {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
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

    /// Creates a pod running as `account`; returns its uid.
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
    /// (empty: the API server's own).
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
}

impl Cluster {
    /// A kubeconfig file for the user of `token`.
    pub fn kubeconfig(&self, dir: &std::path::Path, token: &str) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("user-{n}.kubeconfig"));
        std::fs::write(&path, self.running.kubeconfig(token)).unwrap();
        path
    }
}

pub async fn client(running: &Running, token: &str) -> Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&running.kubeconfig(token)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

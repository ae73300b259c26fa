//! Finds a pod's lock in the API server, as the DaemonSet's identity (the
//! kubeconfig its installer wrote, which may get pods and nothing else).

use std::time::Duration;

use aip_api::egress_lock::LOCK_ANNOTATION;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::plugin::Pods;

/// How long a lookup may take, connection included: the kubelet's sandbox
/// creation waits for it.
const LOOKUP_PATIENCE: Duration = Duration::from_secs(5);

/// The API server, through the kubeconfig at `kubeconfig`.
pub struct ApiServer {
    pub kubeconfig: String,
}

impl Pods for ApiServer {
    fn lock_annotation(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        runtime.block_on(async {
            tokio::time::timeout(LOOKUP_PATIENCE, self.lookup(namespace, name))
                .await
                .map_err(|_| format!("no answer within {}s", LOOKUP_PATIENCE.as_secs()))?
        })
    }
}

impl ApiServer {
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| format!("cannot read kubeconfig {}: {e}", self.kubeconfig))?;
        let mut config = kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .map_err(|e| format!("kubeconfig {}: {e}", self.kubeconfig))?;
        config.connect_timeout = Some(LOOKUP_PATIENCE);
        config.read_timeout = Some(LOOKUP_PATIENCE);
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let pod = pods.get_metadata_opt(name).await.map_err(|e| match e {
            kube::Error::Api(status) => {
                format!("{} {}: {}", status.code, status.reason, status.message)
            }
            other => other.to_string(),
        })?;
        Ok(pod.and_then(|p| p.metadata.annotations?.get(LOCK_ANNOTATION).cloned()))
    }
}

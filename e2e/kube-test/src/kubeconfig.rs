//! Kubeconfigs handed to tests, kubectl and the processes under test, and
//! kube-rs clients built from them.

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::{Error, User};

/// How a kubeconfig's user proves who it is on the local control plane.
pub(crate) enum Credentials<'a> {
    Token(&'a str),
    ClientCertificate { cert_pem: &'a str, key_pem: &'a str },
}

/// A kubeconfig (YAML) for one user of the cluster at `server`, with the CA
/// embedded, so the file can be copied anywhere.
pub(crate) fn text(server: &str, ca_pem: &str, user: &str, credentials: Credentials<'_>) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let credentials = match credentials {
        Credentials::Token(token) => format!("    token: {token}\n"),
        Credentials::ClientCertificate { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: aip-kube-test
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
{credentials}contexts:
- name: {user}@aip-kube-test
  context:
    cluster: aip-kube-test
    user: {user}
    namespace: default
current-context: {user}@aip-kube-test
",
        ca = b64(ca_pem),
    )
}

/// The parts of a kubeconfig's current context: its context, cluster and
/// user, and nothing else.
pub(crate) fn current_only(config: &Kubeconfig) -> Result<Kubeconfig, String> {
    let current = config
        .current_context
        .clone()
        .ok_or("it has no current-context")?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == current)
        .ok_or_else(|| format!("its current-context {current:?} is not among its contexts"))?;
    let inner = context
        .context
        .as_ref()
        .ok_or_else(|| format!("context {current:?} is empty"))?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == inner.cluster)
        .ok_or_else(|| {
            format!(
                "context {current:?} names cluster {:?}, which it does not define",
                inner.cluster
            )
        })?;
    let user_name = inner.user.clone().unwrap_or_default();
    let user = config
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .ok_or_else(|| {
            format!("context {current:?} names user {user_name:?}, which it does not define")
        })?;
    Ok(Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        current_context: Some(current),
        contexts: vec![context.clone()],
        clusters: vec![cluster.clone()],
        auth_infos: vec![user.clone()],
        ..Kubeconfig::default()
    })
}

/// `admin` (a kubeconfig from [`current_only`]) impersonating `user`: the
/// same credentials, with `as`, `as-uid` and `as-groups` set.
pub(crate) fn impersonating(admin: &Kubeconfig, user: User) -> Kubeconfig {
    let mut config = admin.clone();
    if user != User::Admin {
        for named in &mut config.auth_infos {
            let info = named.auth_info.get_or_insert_with(Default::default);
            info.impersonate = Some(user.name().to_owned());
            info.impersonate_uid = Some(user.uid().to_owned());
            info.impersonate_groups = Some(user.groups().iter().map(|g| (*g).to_owned()).collect());
        }
    }
    config
}

pub(crate) async fn client(config: Kubeconfig, user: &'static str) -> Result<kube::Client, Error> {
    let failed = |source| Error::Client { user, source };
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .map_err(|e| failed(kube::Error::InferKubeconfig(e)))?;
    kube::Client::try_from(config).map_err(failed)
}

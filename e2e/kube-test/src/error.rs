use std::path::PathBuf;
use std::time::Duration;

/// Why a control plane could not be started or reached. Every variant
/// names what failed; a process that failed carries the end of its log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{binary} not found at {path}: run scripts/ensure-controlplane.sh (it builds kube-apiserver, \
         kube-controller-manager and etcd into target/controlplane/), or point AIP_CONTROLPLANE_DIR \
         at a directory holding them"
    )]
    BinaryMissing { binary: &'static str, path: PathBuf },

    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot make the control plane's certificates and keys: {0}")]
    Pki(#[from] rcgen::Error),

    #[error("cannot start {process}: {source}")]
    Spawn {
        process: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("{process} exited ({status}) before it was ready; the end of {log}:\n{tail}")]
    Exited {
        process: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },

    #[error(
        "{process} was not ready after {waited:?} (last seen: {last}); the end of {log}:\n{tail}"
    )]
    NotReady {
        process: &'static str,
        waited: Duration,
        last: String,
        log: PathBuf,
        tail: String,
    },

    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },

    #[error("cannot build a client for {user}: {source}")]
    Client {
        user: &'static str,
        #[source]
        source: kube::Error,
    },

    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("watching {what}: {source}")]
    Watch {
        what: String,
        #[source]
        source: kube::runtime::wait::Error,
    },

    /// Something a peer (Keycloak) needs before it starts.
    #[error("{0}")]
    Setup(String),

    #[error("{what} did not happen within {waited:?}")]
    Timeout { what: String, waited: Duration },

    #[error("{tool} is not on PATH: {hint}")]
    ToolMissing {
        tool: &'static str,
        hint: &'static str,
    },

    #[error("the node: {what}: {reason}")]
    Node { what: String, reason: String },

    #[error("cleaning up the node: {reason}")]
    Cleanup { reason: String },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Api { action, source }
    }
}

//! `aip-kube-test`: the genuine Kubernetes control plane for tests —
//! etcd, kube-apiserver and kube-controller-manager on loopback, with
//! fresh PKI, real service-account JWTs and static test identities — or,
//! when `AIP_TEST_KUBECONFIG` names a kubeconfig, any cluster.
//!
//! One control plane per test binary: [`shared`] starts it on first use;
//! [`fresh_namespace`] gives each test its own namespace. Its processes
//! never outlive the test process (see `process.rs`).
//!
//! It must never touch a cluster it was not given: without
//! `AIP_TEST_KUBECONFIG` it talks only to the processes it started, and it
//! ignores `KUBECONFIG`.

#![forbid(unsafe_code)]

mod error;
mod external;
mod identity;
pub mod keycloak;
mod kubeconfig;
mod local;
pub mod node;
mod pki;
mod process;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::config::Kubeconfig;
use tokio::sync::OnceCell;

pub use error::Error;
pub use identity::User;

/// The variable naming a kubeconfig whose current context [`shared`] uses
/// instead of starting a control plane.
pub const KUBECONFIG_ENV: &str = "AIP_TEST_KUBECONFIG";

/// The label every [`ControlPlane::fresh_namespace`] carries, so that
/// leftovers on a long-lived cluster can be found:
/// `kubectl delete ns -l aip.io/kube-test`.
pub const NAMESPACE_LABEL: &str = "aip.io/kube-test";

/// How long a fresh namespace may take to get its `default` ServiceAccount.
const NAMESPACE_READY: Duration = Duration::from_secs(60);

/// A Kubernetes API server for tests: one this crate started, or a cluster
/// named by a kubeconfig. Dropping a started one stops and reaps its
/// processes and removes its directory.
pub struct ControlPlane {
    url: String,
    ca_pem: Option<String>,
    version: String,
    started_in: Duration,
    kubeconfig_dir: PathBuf,
    cluster: Cluster,
}

enum Cluster {
    Local(local::Local),
    External(external::External),
    /// The control plane of the running test node (`aip-node run`), whose
    /// processes belong to the launcher.
    Node(node::NodeInfo),
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager in a fresh
    /// temporary directory, and returns once the API server is ready and
    /// the controllers run (`default/default` ServiceAccount exists).
    pub async fn start() -> Result<ControlPlane, Error> {
        let started = Instant::now();
        let local = local::start().await?;
        ControlPlane {
            url: local.url.clone(),
            ca_pem: Some(local.ca_pem.clone()),
            version: String::new(),
            started_in: Duration::ZERO,
            kubeconfig_dir: local.dir.clone(),
            cluster: Cluster::Local(local),
        }
        .finish(started)
        .await
    }

    /// Uses the cluster of `kubeconfig`'s current context; its credentials
    /// are the administrator's (see README.md for what they need).
    pub async fn connect(kubeconfig: &Path) -> Result<ControlPlane, Error> {
        let started = Instant::now();
        let external = external::load(kubeconfig)?;
        ControlPlane {
            url: external.url.clone(),
            ca_pem: external.ca_pem.clone(),
            version: String::new(),
            started_in: Duration::ZERO,
            kubeconfig_dir: external.dir.clone(),
            cluster: Cluster::External(external),
        }
        .finish(started)
        .await
    }

    /// The control plane of the node the launcher runs (`aip-node run` sets
    /// [`node::ENV`] to its directory for the command it runs).
    pub async fn attach_node(dir: &Path) -> Result<ControlPlane, Error> {
        let started = Instant::now();
        let info = node::NodeInfo::read(dir)?;
        ControlPlane {
            url: info.url.clone(),
            ca_pem: Some(info.ca_pem.clone()),
            version: String::new(),
            started_in: Duration::ZERO,
            kubeconfig_dir: info.dir.join("controlplane"),
            cluster: Cluster::Node(info),
        }
        .finish(started)
        .await
    }

    /// The running node, when this control plane is a node's.
    pub fn node(&self) -> Option<&node::NodeInfo> {
        match &self.cluster {
            Cluster::Node(info) => Some(info),
            _ => None,
        }
    }

    /// Writes every user's kubeconfig file and asks for `/version`.
    async fn finish(mut self, started: Instant) -> Result<ControlPlane, Error> {
        for user in User::ALL {
            local::write(&self.kubeconfig_file(user), &self.kubeconfig(user))?;
        }
        let admin = self.try_client(User::Admin).await?;
        let info = admin
            .apiserver_version()
            .await
            .map_err(Error::api(format!("asking {} for /version", self.url)))?;
        self.version = info.git_version;
        self.started_in = started.elapsed();
        Ok(self)
    }

    /// `https://127.0.0.1:PORT` (or the kubeconfig's server).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA that signed the API server's certificate, PEM (none when a
    /// kubeconfig trusts the system roots).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The API server's `gitVersion`, e.g. `v1.37.2`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// How long [`ControlPlane::start`] (or `connect`) took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Whether this crate started the control plane (rather than being
    /// given a cluster).
    pub fn is_local(&self) -> bool {
        matches!(self.cluster, Cluster::Local(_))
    }

    /// The started control plane's directory: the processes' logs
    /// (`etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`),
    /// certificates, keys and kubeconfigs.
    pub fn dir(&self) -> Option<&Path> {
        match &self.cluster {
            Cluster::Local(local) => Some(&local.dir),
            Cluster::External(_) => None,
            Cluster::Node(info) => Some(&info.dir),
        }
    }

    /// The static bearer token of `user` on a started control plane.
    pub fn token(&self, user: User) -> Option<&str> {
        match &self.cluster {
            Cluster::Local(local) => Some(local.token(user)),
            Cluster::External(_) => None,
            Cluster::Node(info) => info.tokens.get(user.name()).map(String::as_str),
        }
    }

    /// A kubeconfig (YAML; JSON for a given cluster, which YAML readers
    /// accept) that reaches this API server as `user`, with the CA
    /// embedded. Its context's namespace is `default`.
    pub fn kubeconfig(&self, user: User) -> String {
        match &self.cluster {
            Cluster::Local(local) => local.kubeconfig(user),
            Cluster::Node(_) => kubeconfig::text(
                &self.url,
                self.ca_pem.as_deref().unwrap_or_default(),
                user.name(),
                kubeconfig::Credentials::Token(self.token(user).unwrap_or_default()),
            ),
            Cluster::External(external) => {
                let config = kubeconfig::impersonating(&external.admin, user);
                serde_json::to_string_pretty(&config).unwrap_or_default()
            }
        }
    }

    /// [`ControlPlane::kubeconfig`] as a file (`USER.kubeconfig` in the
    /// control plane's directory), for kubectl and processes under test.
    pub fn kubeconfig_file(&self, user: User) -> PathBuf {
        self.kubeconfig_dir.join(format!("{user}.kubeconfig"))
    }

    /// A kube-rs client acting as `user`.
    ///
    /// A client belongs to the Tokio runtime it was made in (each
    /// `#[tokio::test]` has its own): make one per test, never store one
    /// next to the shared control plane.
    ///
    /// # Panics
    ///
    /// If the client cannot be built: the same kubeconfig built one when
    /// the control plane started, so this is a bug.
    pub async fn client(&self, user: User) -> kube::Client {
        match self.try_client(user).await {
            Ok(client) => client,
            Err(e) => panic!("{e}"),
        }
    }

    /// A kubeconfig (YAML) that reaches this API server with the bearer
    /// `token` (a service account's, from TokenRequest), CA embedded: what
    /// a process under test runs with when it plays a pod.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let ca = self.ca_pem.as_deref().unwrap_or_default();
        let text = kubeconfig::text(
            &self.url,
            ca,
            "token",
            kubeconfig::Credentials::Token(token),
        );
        if self.ca_pem.is_some() {
            text
        } else {
            // No CA: the cluster's certificate is trusted by the system roots.
            text.replace("    certificate-authority-data: \n", "")
        }
    }

    /// A kube-rs client with the bearer `token` (see
    /// [`ControlPlane::kubeconfig_with_token`]).
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, Error> {
        let config = Kubeconfig::from_yaml(&self.kubeconfig_with_token(token)).map_err(|e| {
            Error::Kubeconfig {
                path: PathBuf::from("(a kubeconfig for a bearer token)"),
                reason: e.to_string(),
            }
        })?;
        kubeconfig::client(config, "a bearer token").await
    }

    /// [`ControlPlane::client`], with the error.
    pub async fn try_client(&self, user: User) -> Result<kube::Client, Error> {
        let config = match &self.cluster {
            Cluster::Local(local) => {
                Kubeconfig::from_yaml(&local.kubeconfig(user)).map_err(|e| Error::Kubeconfig {
                    path: self.kubeconfig_file(user),
                    reason: e.to_string(),
                })?
            }
            Cluster::Node(_) => {
                Kubeconfig::from_yaml(&self.kubeconfig(user)).map_err(|e| Error::Kubeconfig {
                    path: self.kubeconfig_file(user),
                    reason: e.to_string(),
                })?
            }
            Cluster::External(external) => kubeconfig::impersonating(&external.admin, user),
        };
        kubeconfig::client(config, user.name()).await
    }

    /// Creates a namespace named `PREFIX-xxxxx` (the API server's
    /// `generateName`), labelled [`NAMESPACE_LABEL`], and returns its name
    /// once its `default` ServiceAccount exists (pods can be created in it
    /// from then on). Nothing deletes it: a started control plane goes
    /// away with its data.
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String, Error> {
        let client = self.try_client(User::Admin).await?;
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                labels: Some(BTreeMap::from([(
                    NAMESPACE_LABEL.to_owned(),
                    "true".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(Error::api(format!("creating namespace {prefix}-*")))?;
        let name = created.metadata.name.unwrap_or_default();
        let accounts: Api<ServiceAccount> = Api::namespaced(client, &name);
        let exists = kube::runtime::wait::await_condition(
            accounts,
            "default",
            |sa: Option<&ServiceAccount>| sa.is_some(),
        );
        match tokio::time::timeout(NAMESPACE_READY, exists).await {
            Ok(Ok(_)) => Ok(name),
            Ok(Err(source)) => Err(Error::Watch {
                what: format!("ServiceAccount {name}/default"),
                source,
            }),
            Err(_) => Err(Error::Timeout {
                what: format!("ServiceAccount {name}/default (the service-account controller)"),
                waited: NAMESPACE_READY,
            }),
        }
    }
}

static SHARED: OnceCell<Result<ControlPlane, Error>> = OnceCell::const_new();

/// The test binary's control plane: started on first use (or connected to
/// `AIP_TEST_KUBECONFIG`), then shared by every test. Its processes stop
/// when the test process exits.
///
/// # Panics
///
/// If it cannot be started; every later call panics with the same error.
pub async fn shared() -> &'static ControlPlane {
    match try_shared().await {
        Ok(control_plane) => control_plane,
        Err(e) => panic!("the shared control plane is not available: {e}"),
    }
}

/// [`shared`], with the error.
pub async fn try_shared() -> Result<&'static ControlPlane, &'static Error> {
    SHARED
        .get_or_init(|| async {
            let started = match std::env::var_os(KUBECONFIG_ENV) {
                Some(path) if !path.is_empty() => ControlPlane::connect(Path::new(&path)).await,
                _ => ControlPlane::start().await,
            };
            if let Ok(cp) = &started {
                eprintln!(
                    "aip-kube-test: {} {} ready in {:.1} s{}",
                    cp.url(),
                    cp.version(),
                    cp.started_in().as_secs_f64(),
                    cp.dir()
                        .map_or(String::new(), |d| format!(" (logs in {})", d.display())),
                );
            }
            started
        })
        .await
        .as_ref()
}

static NODE: OnceCell<Result<ControlPlane, Error>> = OnceCell::const_new();

/// The control plane of the test node that `aip-node run` started for this
/// test process (one node per test run; each test in namespaces of its
/// own).
///
/// # Panics
///
/// Without a node ([`node::ENV`] unset: the tests were not started by
/// `aip-node run`, e.g. `make node-test`), or when it cannot be reached.
pub async fn node() -> &'static ControlPlane {
    let attached = NODE
        .get_or_init(|| async {
            match std::env::var_os(node::ENV) {
                Some(dir) if !dir.is_empty() => ControlPlane::attach_node(Path::new(&dir)).await,
                _ => Err(Error::Node {
                    what: format!("{} is not set", node::ENV),
                    reason: "these tests run in real pods on the test node: run them with \
                             `make node-test`, or under `target/debug/aip-node run -- cargo test ...`"
                        .into(),
                }),
            }
        })
        .await;
    match attached {
        Ok(control_plane) => control_plane,
        Err(e) => panic!("{e}"),
    }
}

/// [`ControlPlane::fresh_namespace`] on the [`shared`] control plane.
///
/// # Panics
///
/// If the namespace cannot be created or never gets its ServiceAccount.
pub async fn fresh_namespace(prefix: &str) -> String {
    match shared().await.fresh_namespace(prefix).await {
        Ok(name) => name,
        Err(e) => panic!("{e}"),
    }
}

/// A control plane one test has to itself, for tests that install
/// cluster-wide objects under fixed names (the Helm chart is installed once
/// per cluster): a private one, started for it and stopped when it is
/// dropped; or, with `AIP_TEST_KUBECONFIG`, that cluster, shared (run such
/// tests one at a time there: `--test-threads=1`).
pub enum Dedicated {
    Started(Box<ControlPlane>),
    Given(&'static ControlPlane),
}

impl std::ops::Deref for Dedicated {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        match self {
            Dedicated::Started(control_plane) => control_plane,
            Dedicated::Given(control_plane) => control_plane,
        }
    }
}

/// A [`Dedicated`] control plane.
///
/// # Panics
///
/// If it cannot be started (or the given cluster reached).
pub async fn dedicated() -> Dedicated {
    let given = std::env::var_os(KUBECONFIG_ENV).is_some_and(|path| !path.is_empty());
    if given {
        return Dedicated::Given(shared().await);
    }
    match ControlPlane::start().await {
        Ok(control_plane) => {
            eprintln!(
                "aip-kube-test: a dedicated {} {} ready in {:.1} s",
                control_plane.url(),
                control_plane.version(),
                control_plane.started_in().as_secs_f64(),
            );
            Dedicated::Started(Box::new(control_plane))
        }
        Err(e) => panic!("a dedicated control plane could not be started: {e}"),
    }
}

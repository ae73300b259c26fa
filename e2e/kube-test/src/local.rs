//! The genuine control plane on loopback: etcd, kube-apiserver and
//! kube-controller-manager in a fresh directory, with fresh PKI.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::config::Kubeconfig;

use crate::kubeconfig::{self, Credentials};
use crate::pki::{self, NodeIdentity, Pki};
use crate::process::Supervised;
use crate::{Error, User};

/// Where the binaries are looked for, relative to the workspace root,
/// unless `AIP_CONTROLPLANE_DIR` says otherwise.
const DEFAULT_DIR: &str = "target/controlplane";

/// The service network: `kubernetes` gets 10.96.0.1, as on kind.
pub(crate) const SERVICE_CIDR: &str = "10.96.0.0/16";

/// The controllers the tests need. The names are 1.37's
/// (`kube-controller-manager --help`); the short forms (`namespace`, ...)
/// are still accepted as aliases.
pub(crate) const CONTROLLERS: &[&str] = &[
    // Empties and removes deleted namespaces.
    "namespace-controller",
    // Deletes objects whose ownerReferences are gone.
    "garbage-collector-controller",
    // Creates each namespace's `default` ServiceAccount.
    "serviceaccount-controller",
    // Fills legacy `kubernetes.io/service-account-token` Secrets (charts
    // still create them); needs --service-account-private-key-file.
    "serviceaccount-token-controller",
    // Publishes the `kube-root-ca.crt` ConfigMap in every namespace (what
    // projected service-account volumes mount as ca.crt).
    "root-ca-certificate-publisher-controller",
    // Fills aggregated ClusterRoles: view, edit, admin.
    "clusterrole-aggregation-controller",
    // Make the pods of Deployments and Jobs, as examples/cluster applies
    // them: their pods meet the injection webhook as a controller's do
    // (no scheduler, so they stay Pending).
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
];

/// How long the API server may take to report ready (a loaded 2-core
/// machine building in parallel takes far longer than an idle one).
const APISERVER_READY: Duration = Duration::from_secs(120);
/// How long the controller manager may take to create `default/default`.
const CONTROLLERS_READY: Duration = Duration::from_secs(60);
/// Attempts at finding free ports before a clash is reported.
const PORT_ATTEMPTS: u32 = 4;

/// Where a control plane serves, and for whom.
#[derive(Clone, Copy)]
pub(crate) enum Layout<'a> {
    /// Alone on loopback: an API server for tests of the API; no scheduler,
    /// no kubelet, pods stay Pending.
    Loopback,
    /// The control plane of a node, inside the node's network namespace:
    /// the API server listens on every address there (6443), advertises
    /// the node's address (the `kubernetes` Service's endpoint, which pods
    /// reach through kube-proxy), talks to the kubelet with a client
    /// certificate; every default controller and the scheduler run.
    Node(NodeIdentity<'a>),
}

/// The API server's port on a node (its own network namespace: no clash).
pub(crate) const NODE_APISERVER_PORT: u16 = 6443;

struct Binaries {
    etcd: PathBuf,
    apiserver: PathBuf,
    controller_manager: PathBuf,
    scheduler: Option<PathBuf>,
}

impl Binaries {
    fn find(layout: Layout<'_>) -> Result<Binaries, Error> {
        Ok(Binaries {
            etcd: binary("etcd")?,
            apiserver: binary("kube-apiserver")?,
            controller_manager: binary("kube-controller-manager")?,
            scheduler: match layout {
                Layout::Loopback => None,
                Layout::Node(_) => Some(binary("kube-scheduler")?),
            },
        })
    }
}

/// The directory holding the Kubernetes binaries: `AIP_CONTROLPLANE_DIR`,
/// or `target/controlplane` of the workspace.
pub(crate) fn binaries_dir() -> PathBuf {
    match std::env::var_os("AIP_CONTROLPLANE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join(DEFAULT_DIR),
    }
}

/// A binary of [`binaries_dir`], or the error that names the script that
/// builds it.
pub(crate) fn binary(name: &'static str) -> Result<PathBuf, Error> {
    let path = binaries_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::BinaryMissing { binary: name, path })
    }
}

/// The workspace root: two levels above this crate's manifest.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// A running local control plane. Dropping it stops the controller
/// manager, the API server and etcd, in that order, reaps them and removes
/// the directory (unless `AIP_KUBE_TEST_KEEP` is set).
pub(crate) struct Local {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub url: String,
    pub tokens: Vec<(User, String)>,
    keep: bool,
    etcd_url: String,
    etcd: Option<Supervised>,
    apiserver: Option<Supervised>,
    /// How the API server was started: a node starts it again the same
    /// way when it dies (as a kubelet restarts a static pod).
    apiserver_command: Option<(PathBuf, Vec<String>)>,
    controller_manager: Option<Supervised>,
    scheduler: Option<Supervised>,
}

impl Drop for Local {
    fn drop(&mut self) {
        for process in [
            self.scheduler.as_mut(),
            self.controller_manager.as_mut(),
            self.apiserver.as_mut(),
            self.etcd.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            process.stop();
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Local {
    pub fn token(&self, user: User) -> &str {
        self.tokens
            .iter()
            .find(|(u, _)| *u == user)
            .map_or("", |(_, token)| token.as_str())
    }

    pub fn kubeconfig(&self, user: User) -> String {
        kubeconfig::text(
            &self.url,
            &self.ca_pem,
            user.name(),
            Credentials::Token(self.token(user)),
        )
    }

    /// The first of its processes found to have exited, as an error.
    fn exited(&mut self) -> Option<Error> {
        [
            self.etcd.as_mut(),
            self.apiserver.as_mut(),
            self.controller_manager.as_mut(),
            self.scheduler.as_mut(),
        ]
        .into_iter()
        .flatten()
        .find_map(|p| p.exit_status().map(|status| p.exited_error(status)))
    }
}

/// Starts the control plane; returns once the API server is ready and the
/// controller manager has created the `default` namespace's `default`
/// ServiceAccount.
pub(crate) async fn start() -> Result<Local, Error> {
    let keep = std::env::var_os("AIP_KUBE_TEST_KEEP").is_some_and(|v| !v.is_empty());
    start_in(fresh_dir()?, Layout::Loopback, keep).await
}

/// Starts a control plane of `layout` in `dir` (which exists, mode 0700).
/// `keep`: leave the directory when it stops.
pub(crate) async fn start_in(dir: PathBuf, layout: Layout<'_>, keep: bool) -> Result<Local, Error> {
    let mut local = Local {
        dir: dir.clone(),
        ca_pem: String::new(),
        url: String::new(),
        tokens: User::ALL.iter().map(|u| (*u, random_token())).collect(),
        keep,
        etcd_url: String::new(),
        etcd: None,
        apiserver: None,
        apiserver_command: None,
        controller_manager: None,
        scheduler: None,
    };
    // Once `local` holds the directory: a binary missing removes it too.
    let binaries = Binaries::find(layout)?;
    let node = match layout {
        Layout::Loopback => None,
        Layout::Node(node) => Some(node),
    };
    let pki = pki::generate(node)?;
    local.ca_pem = pki.ca_pem.clone();
    write_files(&dir, &pki, &local.tokens)?;

    let mut attempt = 0;
    loop {
        attempt += 1;
        match start_apiserver(&mut local, &binaries, layout).await {
            Ok(()) => break,
            Err(Error::Exited { ref tail, .. })
                if attempt < PORT_ATTEMPTS && tail.contains("address already in use") =>
            {
                // Another process took a port between our probe and the
                // bind: whichever process failed is started again on a new one.
                if local
                    .etcd
                    .as_mut()
                    .is_some_and(|p| p.exit_status().is_some())
                {
                    local.etcd = None;
                    // A member directory from the failed start would pin
                    // the old peer URL.
                    let data = dir.join("etcd");
                    match std::fs::remove_dir_all(&data) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(Error::io("cannot remove", &data)(e));
                        }
                        _ => {}
                    }
                }
                if let Some(mut apiserver) = local.apiserver.take() {
                    apiserver.stop();
                }
            }
            Err(e) => return Err(e),
        }
    }

    let manager_kubeconfig = dir.join("kube-controller-manager.kubeconfig");
    write(
        &manager_kubeconfig,
        &kubeconfig::text(
            &local.url,
            &pki.ca_pem,
            "system:kube-controller-manager",
            Credentials::ClientCertificate {
                cert_pem: &pki.controller_manager_cert_pem,
                key_pem: &pki.controller_manager_key_pem,
            },
        ),
    )?;
    let controllers = match layout {
        Layout::Loopback => CONTROLLERS.join(","),
        // A node runs what any cluster runs: endpoints, pod GC, TTL after
        // finished, node lifecycle, ...
        Layout::Node(_) => "*".to_owned(),
    };
    let args = [
        format!("--kubeconfig={}", manager_kubeconfig.display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        format!("--root-ca-file={}", dir.join("ca.crt").display()),
        format!(
            "--service-account-private-key-file={}",
            dir.join("service-account.key").display()
        ),
        "--use-service-account-credentials=false".into(),
        format!("--controllers={controllers}"),
    ];
    local.controller_manager = Some(Supervised::spawn(
        "kube-controller-manager",
        &binaries.controller_manager,
        &args,
        &dir,
        None,
    )?);
    if let Some(scheduler) = &binaries.scheduler {
        // The controller manager's identity (system:masters) serves the
        // scheduler too: one test client certificate fewer.
        let args = [
            format!("--kubeconfig={}", manager_kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        local.scheduler = Some(Supervised::spawn(
            "kube-scheduler",
            scheduler,
            &args,
            &dir,
            None,
        )?);
    }
    wait_for_controllers(&mut local).await?;
    Ok(local)
}

/// Starts etcd (unless it runs already) and the API server on fresh ports,
/// and waits for `/readyz`.
async fn start_apiserver(
    local: &mut Local,
    binaries: &Binaries,
    layout: Layout<'_>,
) -> Result<(), Error> {
    let dir = local.dir.clone();
    let [client_port, peer_port, mut secure_port] = free_ports()?;
    let etcd_url = match &local.etcd {
        Some(_) => local.etcd_url.clone(),
        None => {
            let client = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let args = [
                "--name=aip-kube-test".to_owned(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=aip-kube-test={peer}"),
                // Test data need not survive a power cut; fsync is most of
                // etcd's latency on a busy disk.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ];
            // etcd stops last, so its watchdog removes the directory when
            // the test process goes away.
            let cleanup = (!local.keep).then_some(dir.as_path());
            local.etcd = Some(Supervised::spawn(
                "etcd",
                &binaries.etcd,
                &args,
                &dir,
                cleanup,
            )?);
            local.etcd_url = client.clone();
            client
        }
    };
    let file = |name: &str| dir.join(name).display().to_string();
    let (bind, advertise) = match layout {
        Layout::Loopback => ("127.0.0.1", "127.0.0.1"),
        Layout::Node(node) => {
            secure_port = NODE_APISERVER_PORT;
            ("0.0.0.0", node.address)
        }
    };
    let url = format!("https://{advertise}:{secure_port}");
    let mut args = vec![
        format!("--bind-address={bind}"),
        // Without it the server looks for a default-route interface.
        format!("--advertise-address={advertise}"),
        format!("--secure-port={secure_port}"),
        format!("--etcd-servers={etcd_url}"),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        // Nothing is written there (the serving certificate is given), but
        // the default is /var/run/kubernetes.
        format!("--cert-dir={}", file("apiserver-certs")),
        format!("--client-ca-file={}", file("client-ca.crt")),
        format!("--token-auth-file={}", file("tokens.csv")),
        "--authorization-mode=Node,RBAC".into(),
        format!("--service-account-issuer={url}"),
        format!("--service-account-key-file={}", file("service-account.pub")),
        format!(
            "--service-account-signing-key-file={}",
            file("service-account.key")
        ),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--profiling=false".into(),
    ];
    match layout {
        // No Endpoints for the `kubernetes` Service: nothing in a test can
        // reach a ClusterIP anyway.
        Layout::Loopback => args.push("--endpoint-reconciler-type=none".into()),
        Layout::Node(_) => args.extend([
            format!(
                "--kubelet-client-certificate={}",
                file("apiserver-kubelet-client.crt")
            ),
            format!(
                "--kubelet-client-key={}",
                file("apiserver-kubelet-client.key")
            ),
            format!("--kubelet-certificate-authority={}", file("ca.crt")),
            // Else it resolves the node's hostname with the host's resolver.
            "--kubelet-preferred-address-types=InternalIP".into(),
        ]),
    }
    local.url = url;
    local.apiserver = Some(Supervised::spawn(
        "kube-apiserver",
        &binaries.apiserver,
        &args,
        &dir,
        None,
    )?);
    local.apiserver_command = Some((binaries.apiserver.clone(), args));
    wait_for_readyz(local).await
}

impl Local {
    /// Starts the API server again, the same way, if it has exited (a test
    /// killed it): what a node's supervisor does. Returns whether it did;
    /// the caller waits for it to be ready as any client does.
    pub(crate) fn revive_apiserver(&mut self) -> Result<bool, Error> {
        let exited = self
            .apiserver
            .as_mut()
            .is_some_and(|p| p.exit_status().is_some());
        let Some((program, args)) = self.apiserver_command.clone().filter(|_| exited) else {
            return Ok(false);
        };
        if let Some(mut old) = self.apiserver.take() {
            old.stop();
        }
        self.apiserver = Some(Supervised::spawn(
            "kube-apiserver",
            &program,
            &args,
            &self.dir,
            None,
        )?);
        Ok(true)
    }
}

/// Polls `/readyz` (the admin's token, the generated CA) until it says
/// `ok`, or a process exits, or [`APISERVER_READY`] passes.
async fn wait_for_readyz(local: &mut Local) -> Result<(), Error> {
    let started = Instant::now();
    let config =
        Kubeconfig::from_yaml(&local.kubeconfig(User::Admin)).map_err(|e| Error::Kubeconfig {
            path: local.dir.join("admin.kubeconfig"),
            reason: e.to_string(),
        })?;
    let client = kubeconfig::client(config, User::Admin.name()).await?;
    let mut last;
    loop {
        if let Some(exited) = local.exited() {
            return Err(exited);
        }
        let request = http::Request::get("/readyz").body(Vec::new());
        match request {
            Ok(request) => match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() > APISERVER_READY {
            let apiserver = local.apiserver.as_ref();
            return Err(Error::NotReady {
                process: "kube-apiserver",
                waited: APISERVER_READY,
                last,
                log: apiserver.map(|p| p.log.clone()).unwrap_or_default(),
                tail: apiserver.map(Supervised::tail).unwrap_or_default(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the controller manager's service-account controller to
/// create `default/default`: proof that it is connected and running.
async fn wait_for_controllers(local: &mut Local) -> Result<(), Error> {
    let config =
        Kubeconfig::from_yaml(&local.kubeconfig(User::Admin)).map_err(|e| Error::Kubeconfig {
            path: local.dir.join("admin.kubeconfig"),
            reason: e.to_string(),
        })?;
    let client = kubeconfig::client(config, User::Admin.name()).await?;
    let api: Api<ServiceAccount> = Api::namespaced(client, "default");
    let created =
        kube::runtime::wait::await_condition(api, "default", |sa: Option<&ServiceAccount>| {
            sa.is_some()
        });
    tokio::pin!(created);
    let deadline = tokio::time::Instant::now() + CONTROLLERS_READY;
    loop {
        tokio::select! {
            done = &mut created => {
                return done.map(drop).map_err(|source| Error::Watch {
                    what: "ServiceAccount default/default".into(),
                    source,
                });
            }
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if let Some(exited) = local.exited() {
                    return Err(exited);
                }
                if tokio::time::Instant::now() > deadline {
                    let manager = local.controller_manager.as_ref();
                    return Err(Error::NotReady {
                        process: "kube-controller-manager",
                        waited: CONTROLLERS_READY,
                        last: "no ServiceAccount default/default yet".into(),
                        log: manager.map(|p| p.log.clone()).unwrap_or_default(),
                        tail: manager.map(Supervised::tail).unwrap_or_default(),
                    });
                }
            }
        }
    }
}

fn write_files(dir: &Path, pki: &Pki, tokens: &[(User, String)]) -> Result<(), Error> {
    write(&dir.join("ca.crt"), &pki.ca_pem)?;
    write(&dir.join("apiserver.crt"), &pki.serving_cert_pem)?;
    write(&dir.join("apiserver.key"), &pki.serving_key_pem)?;
    write(&dir.join("client-ca.crt"), &pki.client_ca_pem)?;
    write(
        &dir.join("service-account.key"),
        &pki.service_account_key_pem,
    )?;
    write(
        &dir.join("service-account.pub"),
        &pki.service_account_public_pem,
    )?;
    if let Some(node) = &pki.node {
        for (name, text) in [
            ("kubelet.crt", &node.kubelet_serving_cert_pem),
            ("kubelet.key", &node.kubelet_serving_key_pem),
            ("kubelet-client.crt", &node.kubelet_client_cert_pem),
            ("kubelet-client.key", &node.kubelet_client_key_pem),
            (
                "apiserver-kubelet-client.crt",
                &node.apiserver_kubelet_client_cert_pem,
            ),
            (
                "apiserver-kubelet-client.key",
                &node.apiserver_kubelet_client_key_pem,
            ),
        ] {
            write(&dir.join(name), text)?;
        }
    }
    let lines: String = tokens
        .iter()
        .map(|(user, token)| crate::identity::token_file_line(*user, token))
        .collect();
    write(&dir.join("tokens.csv"), &lines)
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(Error::io("cannot write", path))
}

/// A new directory under the system temp dir, named for this process,
/// readable by this user only (it holds keys and credentials).
pub(crate) fn fresh_dir() -> Result<PathBuf, Error> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let name = format!(
        "aip-kube-test-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let dir = base.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(Error::io("cannot create", &dir))?;
    Ok(dir)
}

fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Three distinct free loopback ports (held together while probing so
/// they differ; another process may still take one before it is bound,
/// hence the retries in [`start`]).
fn free_ports() -> Result<[u16; 3], Error> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
            .map_err(Error::io("cannot bind", "127.0.0.1:0"))
    };
    let (a, _la) = bind()?;
    let (b, _lb) = bind()?;
    let (c, _lc) = bind()?;
    Ok([a, b, c])
}

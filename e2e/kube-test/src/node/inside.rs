//! The node itself: what runs inside its network and mount namespaces (the
//! launcher starts this as `aip-node inside` under `unshare`). It lays out
//! the namespace (loopback, the node's address, tmpfs over the paths a
//! kubelet and containerd write to), starts the control plane, containerd,
//! the kubelet, kube-proxy and CoreDNS, imports the images, says `ready`
//! on stdout, and stops everything when its stdin closes: the launcher
//! closed it, or died.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::{NODE_ADDRESS, NODE_NAME, NodeInfo, cgroups, config};
use crate::kubeconfig::{self, Credentials};
use crate::local::{self, Layout, Local, SERVICE_CIDR, write};
use crate::pki::NodeIdentity;
use crate::process::Supervised;
use crate::{Error, User};

/// Paths of the machine that a kubelet, containerd, runc and the CNI
/// plugins write to whatever their configuration says (device plugins,
/// container logs, shim sockets, CNI caches, the iptables lock): a tmpfs of
/// the node's own mount namespace over each, so nothing lands on the host.
const PRIVATE_PATHS: &[&str] = &["/run", "/var/lib", "/var/log"];

/// How long the node may take to become Ready once the kubelet runs.
const NODE_READY: Duration = Duration::from_secs(120);
/// How long containerd, kube-proxy and CoreDNS may take to answer.
const PART_READY: Duration = Duration::from_secs(60);

/// The node's running processes, stopped in reverse order of start.
struct Parts {
    control_plane: Option<Local>,
    processes: Vec<Supervised>,
}

impl Drop for Parts {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop();
        }
        drop(self.control_plane.take());
    }
}

/// Runs the node in `dir` until stdin closes; `images` are archives to
/// import into containerd before the node is ready.
pub async fn serve(dir: &Path, images: &[PathBuf]) -> Result<(), Error> {
    let started = Instant::now();
    let me = std::process::id();
    cgroups::join(me).map_err(Error::io("cannot join cgroup", cgroups::ROOT))?;
    lay_out_namespace()?;
    let mut parts = Parts {
        control_plane: None,
        processes: Vec::new(),
    };
    let result = start(dir, images, &mut parts, started).await;
    if let Err(e) = &result {
        eprintln!("aip-node: {e}");
    } else {
        println!("ready");
        let _ = std::io::stdout().flush();
        // Until the launcher closes our stdin (or dies).
        let closed = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            let stdin = std::io::stdin();
            while stdin.lock().read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        tokio::pin!(closed);
        let mut watch = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = &mut closed => break,
                _ = watch.tick() => supervise(&mut parts),
            }
        }
        eprintln!("aip-node: stopping");
    }
    drop(parts);
    // Containers and shims that outlived containerd, and a command the
    // launcher ran (it may have died); then, moved out of the subtree,
    // everything else the launcher would undo: a killed launcher leaves
    // the machine as a stopped one does.
    let killed = cgroups::kill_all(Some(me));
    cgroups::leave(me);
    killed.map_err(|reason| Error::Cleanup { reason })?;
    // This namespace still holds containerd's mounts under the node's
    // directory (image layers, pod network namespaces): detached here,
    // they go, and the directory with them.
    unmount_below(dir.parent().unwrap_or(dir));
    super::clean_leftovers()?;
    result
}

/// What a node's supervisor does while the node runs: an API server that
/// died (the tests kill it to restart it) is started again. The other
/// processes are not restarted: their death is a failure a test shows.
fn supervise(parts: &mut Parts) {
    let Some(control_plane) = parts.control_plane.as_mut() else {
        return;
    };
    match control_plane.revive_apiserver() {
        Ok(true) => eprintln!("aip-node: kube-apiserver exited; started it again"),
        Ok(false) => {}
        Err(e) => eprintln!("aip-node: cannot start kube-apiserver again: {e}"),
    }
}

/// Detaches every mount of this namespace below `dir`, deepest first.
fn unmount_below(dir: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut targets: Vec<&str> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|target| Path::new(target).starts_with(dir))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for target in targets {
        let _ = Command::new("umount").args(["--lazy", target]).output();
    }
}

fn lay_out_namespace() -> Result<(), Error> {
    for path in PRIVATE_PATHS {
        run(
            "mount",
            &["-t", "tmpfs", "-o", "mode=0755", "aip-node", path],
        )?;
    }
    run("ip", &["link", "set", "lo", "up"])?;
    // No dummy links on these machines: a veth pair, both ends here.
    run(
        "ip",
        &[
            "link", "add", "aip0", "type", "veth", "peer", "name", "aip1",
        ],
    )?;
    run(
        "ip",
        &["addr", "add", &format!("{NODE_ADDRESS}/24"), "dev", "aip0"],
    )?;
    run("ip", &["link", "set", "aip0", "up"])?;
    run("ip", &["link", "set", "aip1", "up"])?;
    // The node's own clients of Services (the API server calling a
    // webhook, kubectl in the tests) need a route for ClusterIPs before
    // kube-proxy's DNAT in OUTPUT sends them to a pod; a node's default
    // route does that elsewhere, and there is none here.
    run("ip", &["route", "add", SERVICE_CIDR, "dev", "aip0"])?;
    // Both are this namespace's own (kube-proxy and the bridge need them).
    for (key, value) in [
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
    ] {
        let path = Path::new("/proc/sys").join(key);
        std::fs::write(&path, value).map_err(Error::io("cannot write", &path))?;
    }
    Ok(())
}

async fn start(
    dir: &Path,
    images: &[PathBuf],
    parts: &mut Parts,
    started: Instant,
) -> Result<(), Error> {
    let controlplane_dir = dir.join("controlplane");
    mkdir(&controlplane_dir)?;
    let layout = Layout::Node(NodeIdentity {
        name: NODE_NAME,
        address: NODE_ADDRESS,
    });
    let control_plane = local::start_in(controlplane_dir.clone(), layout, true).await?;
    progress("control plane", started);
    for user in User::ALL {
        write(
            &controlplane_dir.join(format!("{user}.kubeconfig")),
            &control_plane.kubeconfig(user),
        )?;
    }
    let admin = kubeconfig::text(
        &control_plane.url,
        &control_plane.ca_pem,
        User::Admin.name(),
        Credentials::Token(control_plane.token(User::Admin)),
    );
    let url = control_plane.url.clone();
    let ca_pem = control_plane.ca_pem.clone();
    let tokens = control_plane.tokens.clone();
    parts.control_plane = Some(control_plane);

    let cert = |name: &str| std::fs::read_to_string(controlplane_dir.join(name));
    let read =
        |name: &str| cert(name).map_err(Error::io("cannot read", controlplane_dir.join(name)));
    let kubelet_kubeconfig = kubeconfig::text(
        &url,
        &ca_pem,
        &format!("system:node:{NODE_NAME}"),
        Credentials::ClientCertificate {
            cert_pem: &read("kubelet-client.crt")?,
            key_pem: &read("kubelet-client.key")?,
        },
    );
    for (name, text) in [
        ("containerd.toml", config::containerd(dir)),
        ("kubelet.yaml", config::kubelet(dir, &controlplane_dir)),
        ("kubelet.kubeconfig", kubelet_kubeconfig),
        ("kube-proxy.yaml", config::kube_proxy(dir)),
        ("kube-proxy.kubeconfig", admin.clone()),
        ("Corefile", config::corefile(dir)),
        ("coredns.kubeconfig", admin),
        (
            &format!("{}/10-aip-node.conflist", super::CNI_CONF),
            config::cni(dir),
        ),
    ] {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            mkdir(parent)?;
        }
        write(&path, &text)?;
    }

    link_system_plugins(&dir.join(super::CNI_BIN))?;

    let socket = dir.join("containerd.sock");
    parts.processes.push(Supervised::spawn(
        "containerd",
        Path::new(&which("containerd")?),
        &[format!(
            "--config={}",
            dir.join("containerd.toml").display()
        )],
        dir,
        None,
    )?);
    wait_for("containerd", parts, PART_READY, || {
        ctr(&socket, &["version"]).is_ok()
    })
    .await?;
    for image in images {
        let path = image.display().to_string();
        ctr(
            &socket,
            &[
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
                &path,
            ],
        )
        .map_err(|reason| Error::Node {
            what: format!("importing {path} into containerd"),
            reason,
        })?;
    }
    progress(&format!("containerd, {} images", images.len()), started);

    let binary = |name: &'static str| local::binary(name);
    parts.processes.push(Supervised::spawn(
        "kubelet",
        &binary("kubelet")?,
        &[
            format!("--config={}", dir.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", dir.join("kubelet.kubeconfig").display()),
            "--root-dir=/var/lib/kubelet".into(),
            format!("--node-ip={NODE_ADDRESS}"),
            format!("--hostname-override={NODE_NAME}"),
            "--v=1".into(),
        ],
        dir,
        None,
    )?);
    parts.processes.push(Supervised::spawn(
        "kube-proxy",
        &binary("kube-proxy")?,
        &[format!(
            "--config={}",
            dir.join("kube-proxy.yaml").display()
        )],
        dir,
        None,
    )?);
    let coredns = local::binaries_dir().join("coredns");
    if !coredns.is_file() {
        return Err(Error::BinaryMissing {
            binary: "coredns",
            path: coredns,
        });
    }
    parts.processes.push(Supervised::spawn(
        "coredns",
        &coredns,
        &["-conf".into(), dir.join("Corefile").display().to_string()],
        dir,
        None,
    )?);

    let client = {
        let control_plane = parts.control_plane.as_ref().ok_or(Error::Node {
            what: "the control plane".into(),
            reason: "gone".into(),
        })?;
        let config = kube::config::Kubeconfig::from_yaml(&control_plane.kubeconfig(User::Admin))
            .map_err(|e| Error::Kubeconfig {
                path: dir.join("admin.kubeconfig"),
                reason: e.to_string(),
            })?;
        kubeconfig::client(config, User::Admin.name()).await?
    };
    let nodes: Api<Node> = Api::all(client);
    let deadline = Instant::now() + NODE_READY;
    loop {
        if let Ok(node) = nodes.get(NODE_NAME).await {
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                break;
            }
        }
        check_running(parts)?;
        if Instant::now() > deadline {
            return Err(not_ready(parts, "kubelet", NODE_READY, "Node not Ready"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    progress("kubelet (Node Ready)", started);
    wait_for("kube-proxy", parts, PART_READY, || {
        http_ok("127.0.0.1:10256", "/healthz")
    })
    .await?;
    wait_for("coredns", parts, PART_READY, || {
        http_ok("127.0.0.1:8181", "/ready")
    })
    .await?;
    progress("kube-proxy and CoreDNS", started);

    let info = NodeInfo {
        url,
        ca_pem,
        tokens: tokens
            .iter()
            .map(|(user, token)| (user.name().to_owned(), token.clone()))
            .collect(),
        node_name: NODE_NAME.into(),
        node_address: NODE_ADDRESS.into(),
        pid: std::process::id(),
        dir: dir.to_path_buf(),
        containerd_socket: socket,
        started_in_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    let text = serde_json::to_string_pretty(&info).map_err(|e| Error::Node {
        what: "writing node.json".into(),
        reason: e.to_string(),
    })?;
    write(&dir.join("node.json"), &text)
}

/// The machine's CNI plugins, each linked into the node's own binary
/// directory (which the aip-cni DaemonSet may write to).
fn link_system_plugins(bin: &Path) -> Result<(), Error> {
    mkdir(bin)?;
    let system = Path::new(super::SYSTEM_CNI_PLUGINS);
    let entries = std::fs::read_dir(system).map_err(Error::io("cannot read", system))?;
    for entry in entries.flatten() {
        let link = bin.join(entry.file_name());
        if !link.exists() {
            std::os::unix::fs::symlink(entry.path(), &link)
                .map_err(Error::io("cannot link", &link))?;
        }
    }
    Ok(())
}

fn progress(what: &str, started: Instant) {
    eprintln!(
        "aip-node: {what} ready ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// The first supervised process found to have exited, as an error.
fn check_running(parts: &mut Parts) -> Result<(), Error> {
    for process in &mut parts.processes {
        if let Some(status) = process.exit_status() {
            return Err(process.exited_error(status));
        }
    }
    Ok(())
}

fn not_ready(parts: &Parts, name: &str, waited: Duration, last: &str) -> Error {
    let process = parts.processes.iter().find(|p| p.name == name);
    Error::NotReady {
        process: process.map_or("node", |p| p.name),
        waited,
        last: last.into(),
        log: process.map(|p| p.log.clone()).unwrap_or_default(),
        tail: process.map(Supervised::tail).unwrap_or_default(),
    }
}

async fn wait_for(
    name: &'static str,
    parts: &mut Parts,
    waited: Duration,
    ready: impl Fn() -> bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + waited;
    loop {
        if ready() {
            return Ok(());
        }
        check_running(parts)?;
        if Instant::now() > deadline {
            return Err(not_ready(parts, name, waited, "not answering"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain HTTP GET on loopback answered 200.
fn http_ok(address: &str, path: &str) -> bool {
    use std::io::Read;
    let Ok(mut stream) = std::net::TcpStream::connect(address) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// `ctr --address SOCKET ARGS...`; its stderr as the error.
pub(crate) fn ctr(socket: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ctr: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), Error> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::Node {
            what: format!("{program} {}", args.join(" ")),
            reason: e.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Node {
            what: format!("{program} {}", args.join(" ")),
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn which(program: &'static str) -> Result<String, Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .ok_or(Error::ToolMissing {
            tool: program,
            hint: "scripts/ensure-node.sh installs what the node needs",
        })
}

fn mkdir(path: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(path).map_err(Error::io("cannot create", path))
}

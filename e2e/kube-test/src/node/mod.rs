//! A real node for the tests: the control plane, containerd, runc, the CNI
//! plugins, the kubelet, kube-proxy and CoreDNS on this machine, with pods
//! that really run. One node per test run (its ports, cgroup paths and
//! kubelet directories are the machine's): the launcher (`aip-node`, see
//! `src/bin/aip-node.rs`) starts it once, runs the test command inside its
//! network namespace, and every test process attaches to it through
//! [`ENV`], each test in a namespace of its own.
//!
//! Where it lives, and why that leaves the machine as it was:
//! - a network namespace of its own, made by `unshare`, with a veth pair
//!   holding the node's address ([`NODE_ADDRESS`]): node, pod and Service
//!   addresses exist only there, and traffic stays on that namespace's
//!   loopback and bridge. Its iptables chains go with it.
//! - a mount namespace of its own, with tmpfs over /run, /var/lib and
//!   /var/log: the kubelet's, containerd's and runc's files and mounts go
//!   with it.
//! - one cgroup subtree (`/aip-node`, see `cgroups.rs`): every process of
//!   the node, of its pods and of the test command is in it, so they can be
//!   killed as one and the subtree removed.
//! - the global sysctls a kubelet sets are saved first and put back
//!   (`host.rs`).
//!
//! A launcher that is killed leaves the node to notice its closed stdin and
//! clean up; a node killed with it is cleaned up by the next start.

pub mod cgroups;
mod config;
pub mod host;
mod inside;
mod launcher;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use inside::serve;
pub use launcher::{Launched, base_dir, clean_leftovers, enter, launch};

/// The variable that names a running node's directory (its `node.json`):
/// set by the launcher for the command it runs.
pub const ENV: &str = "AIP_TEST_NODE";

/// The node's name, as the Node object and the kubelet's certificate have
/// it.
pub const NODE_NAME: &str = "aip-node";
/// The node's address, on a veth link inside the node's network
/// namespace: the API server, the kubelet and CoreDNS listen on it.
pub const NODE_ADDRESS: &str = "10.223.0.1";
/// The pods' addresses (kube-proxy's cluster CIDR) and the one node's
/// share of them (the bridge's subnet).
pub const POD_CIDR: &str = "10.224.0.0/16";
pub const POD_SUBNET: &str = "10.224.0.0/24";
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The node's CNI binary and configuration directories, below its own
/// directory ([`NodeInfo::dir`]): the machine's plugins (/usr/lib/cni) are
/// linked into the first, and the chart's aip-cni DaemonSet installs into
/// both, so nothing lands in a system path.
pub const CNI_BIN: &str = "cni-bin";
pub const CNI_CONF: &str = "cni";
/// Where Debian's containernetworking-plugins are.
pub const SYSTEM_CNI_PLUGINS: &str = "/usr/lib/cni";
/// The sandbox image, built from e2e/peers/cmd/pause by `make images`.
pub const PAUSE_IMAGE: &str = "localhost/aip-node/pause:1.0";

/// What the node tells the processes that attach to it (`node.json` in its
/// directory). It holds the test identities' tokens: the directory is 0700.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub url: String,
    pub ca_pem: String,
    /// Each test identity's static bearer token, by user name.
    pub tokens: BTreeMap<String, String>,
    pub node_name: String,
    pub node_address: String,
    /// The node's process: its network namespace is
    /// `/proc/PID/ns/net`.
    pub pid: u32,
    pub dir: PathBuf,
    pub containerd_socket: PathBuf,
    /// From the launcher's start of the node to Node Ready with DNS.
    pub started_in_ms: u64,
}

impl NodeInfo {
    /// Reads `DIR/node.json`.
    pub fn read(dir: &std::path::Path) -> Result<NodeInfo, crate::Error> {
        let path = dir.join("node.json");
        let text =
            std::fs::read_to_string(&path).map_err(crate::Error::io("cannot read", &path))?;
        serde_json::from_str(&text).map_err(|e| crate::Error::Node {
            what: format!("reading {}", path.display()),
            reason: e.to_string(),
        })
    }
}

/// Sends SIGTERM to process `pid` (a container's, as the kubelet stops
/// it), at once: a test that times what follows starts its clock here.
/// False when there is no such process.
pub fn terminate(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|target| {
            rustix::process::kill_process(target, rustix::process::Signal::TERM).is_ok()
        })
}

/// Sends SIGKILL to every process of the node named `name` (its
/// `/proc/PID/comm`, e.g. `kube-apiserver`); how many there were. The node
/// starts a killed API server again.
pub fn kill(name: &str) -> usize {
    let mut killed = 0;
    for pid in cgroups::processes() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let target = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(target) = target
            && rustix::process::kill_process(target, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

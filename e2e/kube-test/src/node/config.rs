//! The node's configuration files: containerd, CNI, kubelet, kube-proxy
//! and CoreDNS, each pointed at the node's own directory, so nothing is
//! read from or written to the machine's /etc, /var or /run.

use std::path::Path;

use super::{
    CLUSTER_DOMAIN, CNI_BIN, CNI_CONF, NODE_ADDRESS, NODE_NAME, PAUSE_IMAGE, POD_CIDR, POD_SUBNET,
};

/// containerd 1.6 (Debian's; `version = 2` config) for the kubelet's CRI.
pub fn containerd(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
# Plugins that need hardware or kernels this machine lacks, and the
# registries' TCP service: nothing is pulled, every image is imported.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_tcp_service = true
  # The machine gives no CAP_SYS_RESOURCE: runc may not raise a
  # container's oom_score_adj above its own.
  restrict_oom_score_adj = true
  # hugetlb lives on cgroup v2 here, the other controllers on v1.
  tolerate_missing_hugetlb_controller = true
  # Pod network namespaces as files of the node, not of /run/netns.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"

  # Directories of the node's own: the chart's aip-cni DaemonSet installs
  # into them, never into the machine's /usr/lib/cni or /etc/cni.
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/{CNI_BIN}"
    conf_dir = "{d}/{CNI_CONF}"
"#
    )
}

/// The pod network: one bridge, addresses from host-local (its state in
/// the node's directory), port mappings.
pub fn cni(dir: &Path) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "aip-node",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{POD_SUBNET}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}],
        "dataDir": "{}/cni-ipam"
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#,
        dir.display()
    )
}

/// The kubelet's configuration file.
pub fn kubelet(dir: &Path, controlplane: &Path) -> String {
    let d = dir.display();
    let cp = controlplane.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_ADDRESS}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {cp}/kubelet.crt
tlsPrivateKeyFile: {cp}/kubelet.key
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {cp}/client-ca.crt}}
# Only clients with a certificate of the client CA get in (the API server).
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: unix://{d}/containerd.sock
# This machine mounts cgroup v1 controllers (hybrid): the cgroupfs driver,
# and pods under one subtree of the node's own.
cgroupDriver: cgroupfs
cgroupRoot: /{root}
failCgroupV1: false
failSwapOn: false
resolvConf: ""
clusterDNS: [{NODE_ADDRESS}]
clusterDomain: {CLUSTER_DOMAIN}
volumePluginDir: {d}/volume-plugins
podLogsDir: /var/log/pods
# The test machine's disk is shared, large and may be nearly full: evict
# late, at an absolute floor (1% of a 252 GiB disk is 2.5 GiB, which a CI
# run's builds had already taken).
evictionHard: {{memory.available: "100Mi", nodefs.available: "256Mi", nodefs.inodesFree: "1%", imagefs.available: "256Mi"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 5s
serializeImagePulls: false
"#,
        root = super::cgroups::ROOT,
    )
}

/// kube-proxy in iptables mode. The conntrack settings are zero: they are
/// global sysctls of the machine, which a test node leaves alone.
pub fn kube_proxy(dir: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {}/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        dir.display()
    )
}

/// CoreDNS: the cluster's names from the API server, as a kubeadm cluster
/// serves them; nothing is forwarded (there is nowhere to forward to).
pub fn corefile(dir: &Path) -> String {
    format!(
        r#".:53 {{
    errors
    # Not 8080: kubectl without a kubeconfig tries localhost:8080.
    health 127.0.0.1:8091
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {}/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loadbalance
}}
"#,
        dir.display()
    )
}

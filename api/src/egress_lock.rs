//! EgressLock: locks the egress of every governed pod of its namespace to
//! the pod's gateway. Inside each such pod's network namespace, connections
//! opened by any user but the sidecar's are refused, except to loopback
//! (the gateway), the cluster's DNS and the destinations listed here.
//!
//! It is Kubernetes configuration, not part of the AIP document: the
//! platform team owns it, and a policy's author cannot widen it. Several
//! EgressLocks in one namespace add up (their destinations are merged).
//! The rules are fixed when a pod's sandbox is created (the CNI plugin
//! programs them then); the injector stamps each pod with the rules it is
//! to get ([`LOCK_ANNOTATION`]), so that a pod created before a change keeps
//! its rules and status counts it as on an older setting.

use std::net::IpAddr;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// On a governed pod: the rules its network namespace gets, as [`Lock`]
/// JSON, written by the injector. The CNI plugin programs exactly these.
pub const LOCK_ANNOTATION: &str = "aip.io/egress-lock";

/// The egress lock of a namespace's governed pods.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "aip.io",
    version = "v1alpha1",
    kind = "EgressLock",
    doc = "Locks the egress of every governed pod of its namespace to the pod's aip gateway: other users' connections are refused except to loopback, cluster DNS and the destinations listed.",
    plural = "egresslocks",
    shortname = "egl",
    category = "aip",
    namespaced,
    status = "EgressLockStatus",
    printcolumn = r#"{"name":"Destinations","type":"integer","jsonPath":".status.destinations"}"#,
    printcolumn = r#"{"name":"Locked","type":"integer","jsonPath":".status.lockedPods"}"#,
    printcolumn = r#"{"name":"Stale","type":"integer","jsonPath":".status.stalePods"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EgressLockSpec {
    /// Destinations the agents may reach directly (the model provider's
    /// API, for example), by address range and port. Names are not
    /// accepted: the rules are fixed when the pod starts, and a name's
    /// addresses change after that.
    /// At most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allow: Vec<Destination>,
}

/// An address range, a protocol and a port range the agents may reach.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "isCIDR(self.cidr) && cidr(self.cidr) == cidr(self.cidr).masked()", "message": "cidr must be an address range such as 203.0.113.0/24 or 2001:db8::/32, with no bits set past its prefix", "fieldPath": ".cidr"},
    {"rule": "!has(self.endPort) || (has(self.port) && self.endPort >= self.port)", "message": "endPort needs port, and must not be below it", "fieldPath": ".endPort"}
]))]
pub struct Destination {
    /// IPv4 or IPv6 range, e.g. 203.0.113.0/24 or 2001:db8::/32
    /// (a single address is /32 or /128).
    #[schemars(length(max = 43))]
    pub cidr: String,
    /// TCP (the default) or UDP.
    #[serde(default)]
    pub protocol: Protocol,
    /// The port; every port when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// With port, a range port..=endPort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<u16>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

/// What the operator observed of the lock.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressLockStatus {
    /// How many destinations the namespace's locks allow together.
    #[serde(default)]
    pub destinations: u32,
    /// Governed pods of the namespace whose gateway runs behind a proven
    /// lock.
    #[serde(default)]
    pub locked_pods: u32,
    /// Of those, pods locked with rules from before the current setting
    /// (rules are fixed when a pod starts: re-create them to apply it).
    #[serde(default)]
    pub stale_pods: u32,
    /// The generation these counts were made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The rules of one pod, as [`LOCK_ANNOTATION`] carries them: who may send
/// anywhere, where DNS is, what else is allowed.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lock {
    /// The sidecar's user id: its connections are not locked.
    pub sidecar_uid: u32,
    /// The cluster's DNS servers: UDP and TCP port 53 to them is allowed.
    pub dns: Vec<IpAddr>,
    /// Further destinations, merged from the namespace's EgressLocks.
    #[serde(default)]
    pub allow: Vec<Destination>,
}

impl Lock {
    /// A short digest of the rules (hex of the first 8 bytes of their
    /// sha256): pods with the same digest have the same rules.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&text)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

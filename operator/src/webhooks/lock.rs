//! The egress lock's part of injection, for pods of a namespace with an
//! EgressLock: what the pod must not be able to do (every container under
//! an explicit non-root user other than the gateway's, no privilege
//! escalation, no capability that rewrites the rules or changes the user),
//! the rules it carries for the CNI plugin ([`LOCK_ANNOTATION`]), and its
//! proof of the lock (a first init container, [`CHECK`], that fails unless
//! a forbidden connection is refused).

use std::net::{IpAddr, SocketAddr};

use aip_api::egress_lock::{Destination, LOCK_ANNOTATION, Lock};
use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};
use serde_json::{Value, json};

/// The proof's container name.
pub const CHECK: &str = "aip-lock-check";
/// The proof's user: neither the gateway's nor, by the checks below, one an
/// agent can take (it is not exempt from the lock either way).
pub const DEFAULT_CHECK_USER: i64 = 7302;

/// Capabilities that would let a process rewrite the pod's rules, open raw
/// sockets past them, or become the gateway's user.
const FORBIDDEN_CAPABILITIES: &[&str] = &[
    "NET_ADMIN",
    "NET_RAW",
    "SETUID",
    "SETGID",
    "SYS_ADMIN",
    "ALL",
];

/// What the operator knows of the cluster for every lock.
#[derive(Clone, Debug, Default)]
pub struct LockSettings {
    /// The cluster's DNS servers (the kube-dns Service's addresses).
    pub cluster_dns: Vec<IpAddr>,
    /// The proof's user id.
    pub check_user: i64,
}

/// The addresses of Service kube-system/kube-dns (a kubeadm cluster's,
/// and most others'), for a lock's DNS rules; none when there is no such
/// Service (`--cluster-dns` says then), logged either way.
pub async fn cluster_dns(client: &kube::Client) -> Vec<IpAddr> {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "kube-system");
    match services.get_opt("kube-dns").await {
        Ok(Some(service)) => {
            let spec = service.spec.unwrap_or_default();
            let addresses: Vec<IpAddr> = spec
                .cluster_ips
                .unwrap_or_default()
                .iter()
                .chain(spec.cluster_ip.iter())
                .filter_map(|a| a.parse().ok())
                .fold(Vec::new(), |mut out, a| {
                    if !out.contains(&a) {
                        out.push(a);
                    }
                    out
                });
            tracing::info!(addresses = ?addresses, "locked pods may reach the cluster's DNS at Service kube-system/kube-dns");
            addresses
        }
        Ok(None) => {
            tracing::info!(
                "no Service kube-system/kube-dns: pods of namespaces with an EgressLock are refused until --cluster-dns names the cluster's DNS servers"
            );
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(error = %crate::errors::Api(&e), "cannot read Service kube-system/kube-dns: pods of namespaces with an EgressLock are refused until --cluster-dns names the cluster's DNS servers");
            Vec::new()
        }
    }
}

/// The namespace's EgressLocks as the API server has them now (not the
/// index, which may not have seen one created a moment ago): the
/// destinations they allow together, None when there are none.
pub async fn namespace_allow(
    client: &kube::Client,
    namespace: &str,
) -> Result<Option<Vec<aip_api::egress_lock::Destination>>, kube::Error> {
    let api: kube::Api<aip_api::EgressLock> = kube::Api::namespaced(client.clone(), namespace);
    let list = api.list(&Default::default()).await?;
    Ok(crate::index::egress::merged(
        list.items.iter().map(|l| &l.spec),
    ))
}

/// Why a pod may not run under its namespace's lock. Each names the pod
/// and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockRefusal {
    #[error(
        "pod {pod}: {field} {state}: under the namespace's EgressLock every container must run as an explicit non-root user other than the gateway's ({sidecar}), since a process that is root or the gateway's user goes around the lock"
    )]
    User {
        pod: String,
        field: String,
        state: String,
        sidecar: i64,
    },
    #[error(
        "pod {pod}: {field} must be set to false under the namespace's EgressLock: a process that can gain privileges can become the gateway's user"
    )]
    Escalation { pod: String, field: String },
    #[error("pod {pod}: {field} is true: a privileged container can rewrite the pod's egress lock")]
    Privileged { pod: String, field: String },
    #[error(
        "pod {pod}: {field} adds {capability}, which the namespace's EgressLock forbids (it would let a process rewrite the lock, send raw packets past it or become the gateway's user)"
    )]
    Capability {
        pod: String,
        field: String,
        capability: String,
    },
    #[error(
        "pod {pod} is to be locked (its namespace has an EgressLock), and the operator does not know the cluster's DNS servers: set the chart's egressLock.clusterDNS (--cluster-dns)"
    )]
    NoDns { pod: String },
}

/// Why a change to a running pod is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateRefusal {
    #[error(
        "pod {pod}: metadata.annotations[{LOCK_ANNOTATION}] is the injector's record of the pod's egress lock, fixed when the pod was made; it cannot be added, changed or removed"
    )]
    Annotation { pod: String },
    #[error(transparent)]
    Container(#[from] LockRefusal),
}

/// An UPDATE of a pod (or of its ephemeral containers): the lock's record
/// stays as the injector wrote it, and an ephemeral container added to a
/// locked pod is held to what its other containers are.
pub fn review_update(old: &Pod, new: &Pod, sidecar: i64) -> Result<(), UpdateRefusal> {
    let pod = new.metadata.name.clone().unwrap_or_default();
    let lock = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LOCK_ANNOTATION).cloned())
    };
    if lock(old) != lock(new) {
        return Err(UpdateRefusal::Annotation { pod });
    }
    if lock(old).is_none() {
        return Ok(());
    }
    let spec = new.spec.clone().unwrap_or_default();
    let before: Vec<String> = old
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .map(|list| list.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        if before.contains(&c.name) {
            continue;
        }
        let security = c.security_context.clone().unwrap_or_default();
        let path = format!("spec.ephemeralContainers[{i}]");
        check_security(&path, &security, pod_user, &pod, sidecar)?;
    }
    Ok(())
}

/// Checks every container of `pod` (its own, before injection) against the
/// lock. `sidecar` is the gateway's user id.
pub fn check_containers(pod: &Pod, name: &str, sidecar: i64) -> Result<(), LockRefusal> {
    let spec = pod.spec.clone().unwrap_or_default();
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (path, c) in containers {
        check_container(&path, c, pod_user, name, sidecar)?;
    }
    Ok(())
}

/// One container (an ephemeral one too, whose path names it).
pub fn check_container(
    path: &str,
    c: &Container,
    pod_user: Option<i64>,
    pod: &str,
    sidecar: i64,
) -> Result<(), LockRefusal> {
    let security = c.security_context.clone().unwrap_or_default();
    check_security(path, &security, pod_user, pod, sidecar)
}

/// A container's security context (shared by containers and ephemeral
/// containers, whose types differ).
pub fn check_security(
    path: &str,
    security: &SecurityContext,
    pod_user: Option<i64>,
    pod: &str,
    sidecar: i64,
) -> Result<(), LockRefusal> {
    let user_field = format!("{path}.securityContext.runAsUser");
    let state = match security.run_as_user.or(pod_user) {
        None => Some("is not set (nor spec.securityContext.runAsUser)".to_owned()),
        Some(0) => Some("is 0 (root)".to_owned()),
        Some(u) if u == sidecar => Some(format!("is {u}, the gateway's user")),
        Some(_) => None,
    };
    if let Some(state) = state {
        return Err(LockRefusal::User {
            pod: pod.to_owned(),
            field: user_field,
            state,
            sidecar,
        });
    }
    if security.allow_privilege_escalation != Some(false) {
        return Err(LockRefusal::Escalation {
            pod: pod.to_owned(),
            field: format!("{path}.securityContext.allowPrivilegeEscalation"),
        });
    }
    if security.privileged == Some(true) {
        return Err(LockRefusal::Privileged {
            pod: pod.to_owned(),
            field: format!("{path}.securityContext.privileged"),
        });
    }
    let added = security
        .capabilities
        .as_ref()
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    for capability in added {
        let bare = capability
            .trim()
            .to_ascii_uppercase()
            .trim_start_matches("CAP_")
            .to_owned();
        if FORBIDDEN_CAPABILITIES.contains(&bare.as_str()) {
            return Err(LockRefusal::Capability {
                pod: pod.to_owned(),
                field: format!("{path}.securityContext.capabilities.add"),
                capability,
            });
        }
    }
    Ok(())
}

/// The rules a pod of this namespace gets.
pub fn lock_for(
    settings: &LockSettings,
    sidecar: i64,
    allow: &[Destination],
    pod: &str,
) -> Result<Lock, LockRefusal> {
    if settings.cluster_dns.is_empty() {
        return Err(LockRefusal::NoDns {
            pod: pod.to_owned(),
        });
    }
    Ok(Lock {
        sidecar_uid: u32::try_from(sidecar).unwrap_or(u32::MAX),
        dns: settings.cluster_dns.clone(),
        allow: allow.to_vec(),
    })
}

/// The annotation that carries `lock`, as (key, value).
pub fn annotation(lock: &Lock) -> (String, String) {
    (
        LOCK_ANNOTATION.to_owned(),
        serde_json::to_string(lock).unwrap_or_default(),
    )
}

/// Documentation addresses (RFC 5737) the proof may knock on: the first
/// that no allowed destination covers.
const PROBES: &[&str] = &["192.0.2.1:9", "198.51.100.1:9", "203.0.113.1:9"];

/// Where the proof knocks: a documentation address the lock forbids.
pub fn probe(allow: &[Destination]) -> SocketAddr {
    let candidates: Vec<SocketAddr> = PROBES.iter().filter_map(|p| p.parse().ok()).collect();
    candidates
        .iter()
        .find(|p| !allow.iter().any(|d| covers(d, p)))
        .or(candidates.first())
        .copied()
        .unwrap_or_else(|| SocketAddr::from(([192, 0, 2, 1], 9)))
}

fn covers(d: &Destination, p: &SocketAddr) -> bool {
    let Some((address, prefix)) = d.cidr.split_once('/') else {
        return false;
    };
    let (Ok(IpAddr::V4(net)), Ok(prefix), IpAddr::V4(ip)) =
        (address.parse::<IpAddr>(), prefix.parse::<u32>(), p.ip())
    else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    let in_range = u32::from(net) & mask == u32::from(ip) & mask;
    let port_ok = match (d.port, d.end_port) {
        (None, _) => true,
        (Some(lo), hi) => (lo..=hi.unwrap_or(lo)).contains(&p.port()),
    };
    in_range && port_ok
}

/// The proof's container: the gateway's image, `lock-check`, under a user
/// of its own, with nothing it could misuse.
pub fn check_container_spec(
    image: &str,
    pull_policy: &str,
    settings: &LockSettings,
    probe: SocketAddr,
) -> Value {
    json!({
        "name": CHECK,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": ["lock-check", "--probe", probe.to_string()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": settings.check_user,
            "runAsGroup": settings.check_user,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "8Mi"},
            "limits": {"memory": "32Mi"}
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "agent-1"}, "spec": spec})).unwrap()
    }

    fn safe() -> Value {
        json!({"runAsUser": 1000, "allowPrivilegeEscalation": false})
    }

    #[test]
    fn every_container_needs_its_own_user_and_no_escalation_each_refusal_names_the_field() {
        let ok =
            pod(json!({"containers": [{"name": "a", "image": "a", "securityContext": safe()}]}));
        check_containers(&ok, "agent-1", 7301).unwrap();
        // The pod's user counts for a container that sets none.
        let ok = pod(json!({"securityContext": {"runAsUser": 1000},
            "containers": [{"name": "a", "image": "a", "securityContext": {"allowPrivilegeEscalation": false}}]}));
        check_containers(&ok, "agent-1", 7301).unwrap();

        for (security, said) in [
            (
                json!({"allowPrivilegeEscalation": false}),
                "spec.containers[0].securityContext.runAsUser is not set",
            ),
            (
                json!({"runAsUser": 0, "allowPrivilegeEscalation": false}),
                "spec.containers[0].securityContext.runAsUser is 0 (root)",
            ),
            (
                json!({"runAsUser": 7301, "allowPrivilegeEscalation": false}),
                "spec.containers[0].securityContext.runAsUser is 7301, the gateway's user",
            ),
            (
                json!({"runAsUser": 1000}),
                "spec.containers[0].securityContext.allowPrivilegeEscalation must be set to false",
            ),
            (
                json!({"runAsUser": 1000, "allowPrivilegeEscalation": false, "privileged": true}),
                "spec.containers[0].securityContext.privileged is true",
            ),
            (
                json!({"runAsUser": 1000, "allowPrivilegeEscalation": false, "capabilities": {"add": ["CAP_NET_ADMIN"]}}),
                "spec.containers[0].securityContext.capabilities.add adds CAP_NET_ADMIN",
            ),
            (
                json!({"runAsUser": 1000, "allowPrivilegeEscalation": false, "capabilities": {"add": ["net_raw"]}}),
                "adds net_raw",
            ),
            (
                json!({"runAsUser": 1000, "allowPrivilegeEscalation": false, "capabilities": {"add": ["SETUID"]}}),
                "adds SETUID",
            ),
        ] {
            let p = pod(
                json!({"containers": [{"name": "a", "image": "a", "securityContext": security}]}),
            );
            let err = check_containers(&p, "agent-1", 7301)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("pod agent-1: "), "{err}");
            assert!(err.contains(said), "{said}: {err}");
        }
        // Init containers too, by their own path.
        let p = pod(json!({
            "initContainers": [{"name": "setup", "image": "s"}],
            "containers": [{"name": "a", "image": "a", "securityContext": safe()}]}));
        let err = check_containers(&p, "agent-1", 7301)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.initContainers[0].securityContext.runAsUser"),
            "{err}"
        );
    }

    #[test]
    fn a_running_pods_lock_record_stays_and_a_debug_container_is_held_to_it() {
        let locked = |extra: Value| {
            let mut pod = json!({"metadata": {"name": "agent-1",
                    "annotations": {LOCK_ANNOTATION: "{\"sidecarUid\":7301,\"dns\":[]}"}},
                "spec": {"containers": [{"name": "a", "image": "a"}]}});
            if let Some(ephemeral) = extra.get("ephemeralContainers") {
                pod["spec"]["ephemeralContainers"] = ephemeral.clone();
            }
            serde_json::from_value::<Pod>(pod).unwrap()
        };
        let old = locked(json!({}));
        review_update(&old, &old, 7301).unwrap();
        let mut stripped = old.clone();
        stripped.metadata.annotations = Some(Default::default());
        let err = review_update(&old, &stripped, 7301)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata.annotations[aip.io/egress-lock]"),
            "{err}"
        );
        // Added to an unlocked pod, it would lie about it.
        assert!(review_update(&stripped, &old, 7301).is_err());

        let debug = locked(json!({"ephemeralContainers": [{"name": "debug", "image": "busybox"}]}));
        let err = review_update(&old, &debug, 7301).unwrap_err().to_string();
        assert!(
            err.contains("spec.ephemeralContainers[0].securityContext.runAsUser is not set"),
            "{err}"
        );
        let fine = locked(
            json!({"ephemeralContainers": [{"name": "debug", "image": "busybox",
            "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": false}}]}),
        );
        review_update(&old, &fine, 7301).unwrap();
        // An unlocked pod's debug containers are not this webhook's business.
        let mut plain = debug.clone();
        plain.metadata.annotations = None;
        let mut plain_old = old.clone();
        plain_old.metadata.annotations = None;
        review_update(&plain_old, &plain, 7301).unwrap();
    }

    #[test]
    fn the_probe_is_a_documentation_address_the_lock_forbids() {
        assert_eq!(probe(&[]).to_string(), "192.0.2.1:9");
        let wide = Destination {
            cidr: "192.0.0.0/8".into(),
            protocol: Default::default(),
            port: None,
            end_port: None,
        };
        assert_eq!(probe(&[wide]).to_string(), "198.51.100.1:9");
        let other_port = Destination {
            cidr: "192.0.2.0/24".into(),
            protocol: Default::default(),
            port: Some(443),
            end_port: None,
        };
        assert_eq!(probe(&[other_port]).to_string(), "192.0.2.1:9");
    }

    #[test]
    fn without_the_clusters_dns_a_locked_pod_is_refused_with_the_setting_to_change() {
        let err = lock_for(&LockSettings::default(), 7301, &[], "agent-1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("egressLock.clusterDNS (--cluster-dns)"),
            "{err}"
        );
    }
}

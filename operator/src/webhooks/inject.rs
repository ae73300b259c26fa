//! Sidecar injection (`POST /inject`, mutating, Pod CREATE): a pod opted in
//! by its namespace's or its own `aip.io/inject: enabled` label gets
//! aip-sidecar as a native sidecar (an init container with `restartPolicy:
//! Always`, first, with a startup probe), so its agent containers start only
//! once the gateway is ready and Jobs still complete. Only the sidecar
//! mounts the projected token with this system's audience; it runs as its
//! own non-root user with a read-only root filesystem and no capabilities.
//! Every other container is told where its gateway is. Its admin port
//! (connections, upstream URLs, catalogs) listens on loopback; only
//! /healthz, /readyz and /metrics are served on the pod's IP, where the
//! kubelet's probes and Prometheus reach them. Injecting twice changes
//! nothing; a pod that shares the node's network or its processes is
//! refused, because there the gateway could be bypassed or read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::{Value, json};

use super::lock::{self, LockRefusal, LockSettings};
use crate::certs::ServedRx;
use aip_api::egress_lock::{Destination, LOCK_ANNOTATION};

/// The opt-in label, on a namespace or a pod; `disabled` on a pod opts out.
pub const INJECT_LABEL: &str = "aip.io/inject";
/// Stamped on injected pods; the operator reads it to find pods a policy
/// governs that run without a gateway.
pub const INJECTED_ANNOTATION: &str = "aip.io/sidecar";
/// The injected container's name.
pub const SIDECAR: &str = "aip-sidecar";
/// Agent containers find their gateway's MCP endpoint here.
pub const MCP_URL_ENV: &str = "AIP_MCP_URL";
const TOKEN_VOLUME: &str = "aip-token";
const TOKEN_DIR: &str = "/var/run/secrets/aip.io/serviceaccount";
/// Where the sidecar keeps the newest CA bundle the operator handed it, so
/// that a restarted sidecar container still trusts a rotated operator: an
/// emptyDir lives as long as the pod, across container restarts.
const TRUST_VOLUME: &str = "aip-trust";
const TRUST_DIR: &str = "/var/run/aip/trust";

/// What an injected sidecar looks like.
#[derive(Clone, Debug)]
pub struct Injection {
    pub image: String,
    pub pull_policy: String,
    /// The operator's gRPC URL as seen from pods.
    pub operator_url: String,
    /// The name the operator's certificate is verified for.
    pub server_name: Option<String>,
    /// The CA bundle the sidecar trusts for the operator (PEM), unless
    /// `trust` says otherwise.
    pub ca_pem: String,
    /// The operator's serving certificate as it rotates: each pod gets the
    /// bundle of the moment it is created.
    pub trust: Option<ServedRx>,
    /// The agents' port on loopback.
    pub port: u16,
    /// Every admin route (connections with their upstream URLs, catalogs,
    /// health, metrics), on `admin_address`.
    pub admin_port: u16,
    /// Loopback by default: the pod's own containers (and `kubectl
    /// port-forward`) reach it there, nothing outside the pod does.
    pub admin_address: IpAddr,
    /// /healthz, /readyz and /metrics only, on `metrics_address`: the
    /// probes' port.
    pub metrics_port: u16,
    /// Every address by default, i.e. the pod's IP: the kubelet probes from
    /// the node, which cannot reach the pod's loopback.
    pub metrics_address: IpAddr,
    /// The gateway's user id: the egress lock lets its connections through.
    pub user_id: i64,
    /// What pods of a namespace with an EgressLock get.
    pub lock: LockSettings,
    pub audience: String,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
}

/// Why a pod is refused: where it runs, the gateway could be bypassed or
/// read. Each names the pod and the field that makes it so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "pod {pod} sets hostNetwork: its containers would share the node's network, where the gateway's loopback port is open to every host-network pod and agents can reach tools without it; {label} cannot govern it (remove hostNetwork, or label the pod {label}=disabled)",
        label = INJECT_LABEL
    )]
    HostNetwork { pod: String },
    #[error(
        "pod {pod} sets shareProcessNamespace: its agent containers could read the gateway's memory and credentials through /proc; {label} cannot govern it (remove shareProcessNamespace, or label the pod {label}=disabled)",
        label = INJECT_LABEL
    )]
    SharedProcesses { pod: String },
    #[error(transparent)]
    Lock(#[from] LockRefusal),
}

/// Defaults of the injected container (the operator's flags use them too).
pub const DEFAULT_PORT: u16 = 15001;
pub const DEFAULT_ADMIN_PORT: u16 = 15021;
pub const DEFAULT_ADMIN_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const DEFAULT_METRICS_PORT: u16 = 15020;
pub const DEFAULT_METRICS_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// A user id of the gateway's own: not distroless's 65532 (which most
/// images, this project's included, run as), nor Istio's 1337 or Linkerd's
/// 2102, whose proxies may share a pod with it.
pub const DEFAULT_USER: i64 = 7301;
pub const DEFAULT_PULL_POLICY: &str = "IfNotPresent";
pub const DEFAULT_CPU_REQUEST: &str = "50m";
pub const DEFAULT_MEMORY_REQUEST: &str = "32Mi";
pub const DEFAULT_MEMORY_LIMIT: &str = "128Mi";

impl Injection {
    /// `image`, pointed at `operator_url` and trusting `ca_pem`, with every
    /// other setting at its default.
    pub fn new(image: &str, operator_url: &str, ca_pem: &str) -> Injection {
        Injection {
            image: image.to_owned(),
            pull_policy: DEFAULT_PULL_POLICY.to_owned(),
            operator_url: operator_url.to_owned(),
            server_name: None,
            ca_pem: ca_pem.to_owned(),
            trust: None,
            port: DEFAULT_PORT,
            admin_port: DEFAULT_ADMIN_PORT,
            admin_address: DEFAULT_ADMIN_ADDRESS,
            metrics_port: DEFAULT_METRICS_PORT,
            metrics_address: DEFAULT_METRICS_ADDRESS,
            user_id: DEFAULT_USER,
            lock: LockSettings {
                cluster_dns: Vec::new(),
                check_user: lock::DEFAULT_CHECK_USER,
            },
            audience: aip_proto::TOKEN_AUDIENCE.to_owned(),
            cpu_request: DEFAULT_CPU_REQUEST.to_owned(),
            memory_request: DEFAULT_MEMORY_REQUEST.to_owned(),
            memory_limit: DEFAULT_MEMORY_LIMIT.to_owned(),
        }
    }

    /// Hands each pod the bundle `trust` holds when the pod is created.
    pub fn following(mut self, trust: ServedRx) -> Injection {
        self.trust = Some(trust);
        self
    }

    /// The bundle a pod created now is to trust.
    fn ca_bundle(&self) -> String {
        match &self.trust {
            Some(trust) => trust.borrow().bundle_pem.clone(),
            None => self.ca_pem.clone(),
        }
    }

    /// See [`port_conflict`].
    pub fn port_conflict(&self) -> Option<String> {
        port_conflict(self.port, self.admin_port, self.metrics_port)
    }

    /// True when the admin routes would be reachable from outside the pod.
    pub fn admin_exposed(&self) -> bool {
        !self.admin_address.is_loopback()
    }
}

/// Why the sidecar could not start with these ports: its three listeners
/// share the pod's network namespace, and a port bound on every address is
/// taken on loopback too. Names the operator's flags.
pub fn port_conflict(port: u16, admin_port: u16, metrics_port: u16) -> Option<String> {
    let ports = [
        ("--sidecar-port", port),
        ("--sidecar-admin-port", admin_port),
        ("--sidecar-metrics-port", metrics_port),
    ];
    ports.iter().enumerate().find_map(|(i, (flag, port))| {
        ports[i + 1..]
            .iter()
            .find(|(_, other)| other == port)
            .map(|(other, _)| {
                format!("{other} {port} is also {flag}: the injected sidecar needs a port of its own for each listener")
            })
    })
}

/// The verdict on one pod. `egress`: the destinations its namespace's
/// EgressLocks allow, None when it has none.
pub fn review(
    injection: &Injection,
    request: &AdmissionRequest<DynamicObject>,
    upstream_tokens: &[(String, u32, String)],
    egress: Option<&[Destination]>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if request.operation != Operation::Create {
        return response;
    }
    let pod: Pod = match request
        .object
        .as_ref()
        .map(serde_json::to_value)
        .and_then(Result::ok)
        .map(serde_json::from_value)
    {
        Some(Ok(pod)) => pod,
        _ => return response.deny("the request carries no Pod"),
    };
    match patch(injection, &pod, upstream_tokens, egress) {
        Ok(None) => response,
        Ok(Some(ops)) => match serde_json::from_value::<json_patch::Patch>(Value::Array(ops)) {
            Ok(p) => response
                .with_patch(p)
                .unwrap_or_else(|e| AdmissionResponse::invalid(e.to_string())),
            Err(e) => response.deny(format!("internal error building the patch: {e}")),
        },
        Err(refusal) => response.deny(refusal.to_string()),
    }
}

/// The JSON patch operations that inject the sidecar into `pod`; None when
/// there is nothing to do (opted out, or injected already).
/// `upstream_tokens` (audience, lifetime, path) are the projected tokens
/// its namespace's connections authenticate upstream with: they join the
/// sidecar's own in its volume, which no other container mounts.
/// `egress`: the destinations of the namespace's EgressLocks, which lock
/// the pod (see `lock.rs`); None when the namespace has none.
pub fn patch(
    injection: &Injection,
    pod: &Pod,
    upstream_tokens: &[(String, u32, String)],
    egress: Option<&[Destination]>,
) -> Result<Option<Vec<Value>>, Refusal> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if labels.get(INJECT_LABEL).map(String::as_str) == Some("disabled") {
        return Ok(None);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let init = spec.init_containers.clone().unwrap_or_default();
    if init
        .iter()
        .chain(&spec.containers)
        .any(|c| c.name == SIDECAR)
    {
        return Ok(None);
    }
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone().map(|g| format!("{g}*")))
        .unwrap_or_default();
    if spec.host_network == Some(true) {
        return Err(Refusal::HostNetwork { pod: name });
    }
    if spec.share_process_namespace == Some(true) {
        return Err(Refusal::SharedProcesses { pod: name });
    }
    let locked = match egress {
        Some(allow) => {
            lock::check_containers(pod, &name, injection.user_id)?;
            let rules = lock::lock_for(&injection.lock, injection.user_id, allow, &name)?;
            Some((rules, lock::probe(allow)))
        }
        None => None,
    };
    let mut ops = Vec::new();
    // The proof of the lock first (nothing of the pod runs before it), then
    // the gateway, then the pod's own init containers.
    let mut first = vec![container(injection)];
    if let Some((_, probe)) = &locked {
        let check = lock::check_container_spec(
            &injection.image,
            &injection.pull_policy,
            &injection.lock,
            *probe,
        );
        first.insert(0, check);
    }
    let inserted = first.len();
    if spec.init_containers.is_none() {
        ops.push(json!({"op": "add", "path": "/spec/initContainers", "value": first}));
    } else {
        for c in first.into_iter().rev() {
            ops.push(json!({"op": "add", "path": "/spec/initContainers/0", "value": c}));
        }
    }
    let volumes = [
        token_volume(&injection.audience, upstream_tokens),
        trust_volume(),
    ];
    if spec.volumes.is_none() {
        ops.push(json!({"op": "add", "path": "/spec/volumes", "value": volumes}));
    } else {
        for volume in volumes {
            ops.push(json!({"op": "add", "path": "/spec/volumes/-", "value": volume}));
        }
    }
    let url = format!("http://127.0.0.1:{}/mcp", injection.port);
    let env = json!({"name": MCP_URL_ENV, "value": url});
    // The pod's init containers shift by what went in before them.
    let others = init
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("/spec/initContainers/{}", i + inserted), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("/spec/containers/{i}"), c)),
        );
    for (path, c) in others {
        let env_list = c.env.clone().unwrap_or_default();
        if env_list.iter().any(|e| e.name == MCP_URL_ENV) {
            continue;
        }
        if c.env.is_none() {
            ops.push(json!({"op": "add", "path": format!("{path}/env"), "value": [env]}));
        } else {
            ops.push(json!({"op": "add", "path": format!("{path}/env/-"), "value": env}));
        }
    }
    let mut annotations = vec![(INJECTED_ANNOTATION.to_owned(), "injected".to_owned())];
    if let Some((rules, _)) = &locked {
        annotations.push(lock::annotation(rules));
    }
    match &pod.metadata.annotations {
        None => {
            let value: serde_json::Map<String, Value> = annotations
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": value}));
        }
        Some(existing) => {
            for (key, value) in annotations {
                let path = format!("/metadata/annotations/{}", key.replace('/', "~1"));
                ops.push(json!({"op": "add", "path": path, "value": value}));
            }
            // Only the injector says what a pod's lock is.
            if locked.is_none() && existing.contains_key(LOCK_ANNOTATION) {
                let path = format!(
                    "/metadata/annotations/{}",
                    LOCK_ANNOTATION.replace('/', "~1")
                );
                ops.push(json!({"op": "remove", "path": path}));
            }
        }
    }
    Ok(Some(ops))
}

/// The projected token with this system's audience, and those the
/// connections authenticate upstream with, for the sidecar only.
fn token_volume(audience: &str, upstream: &[(String, u32, String)]) -> Value {
    let mut sources = vec![json!({"serviceAccountToken": {
        "audience": audience, "expirationSeconds": 3600, "path": "token"}})];
    for (audience, life, path) in upstream {
        sources.push(json!({"serviceAccountToken": {
            "audience": audience, "expirationSeconds": life, "path": path}}));
    }
    json!({"name": TOKEN_VOLUME, "projected": {"sources": sources}})
}

/// The sidecar's own copy of the newest CA bundle (small, in memory).
fn trust_volume() -> Value {
    json!({"name": TRUST_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
}

fn container(injection: &Injection) -> Value {
    let mut args = vec![
        "--log-format".to_owned(),
        "json".to_owned(),
        "run".to_owned(),
        "--listen".to_owned(),
        format!("127.0.0.1:{}", injection.port),
        "--admin".to_owned(),
        SocketAddr::new(injection.admin_address, injection.admin_port).to_string(),
        "--metrics-listen".to_owned(),
        SocketAddr::new(injection.metrics_address, injection.metrics_port).to_string(),
        "--operator".to_owned(),
        injection.operator_url.clone(),
        "--token-file".to_owned(),
        format!("{TOKEN_DIR}/token"),
        "--operator-ca-cache".to_owned(),
        format!("{TRUST_DIR}/operator-ca.crt"),
    ];
    if let Some(name) = &injection.server_name {
        args.extend(["--operator-server-name".to_owned(), name.clone()]);
    }
    // The probes go to the metrics listener: the kubelet connects from the
    // node to the pod's IP, and the admin port is on loopback.
    let probe = |path: &str, period: u32, failures: u32| {
        json!({"httpGet": {"path": path, "port": injection.metrics_port},
               "periodSeconds": period, "failureThreshold": failures})
    };
    let mut ports = vec![
        json!({"name": "aip-metrics", "containerPort": injection.metrics_port, "protocol": "TCP"}),
    ];
    if injection.admin_exposed() {
        ports.push(
            json!({"name": "aip-admin", "containerPort": injection.admin_port, "protocol": "TCP"}),
        );
    }
    json!({
        "name": SIDECAR,
        "image": injection.image,
        "imagePullPolicy": injection.pull_policy,
        "restartPolicy": "Always",
        "args": args,
        "env": [{"name": "AIP_OPERATOR_CA_PEM", "value": injection.ca_bundle()}],
        "ports": ports,
        // Ready means configured by the operator: until then the agents
        // would meet a gateway that refuses everything.
        "startupProbe": probe("/readyz", 1, 300),
        "livenessProbe": probe("/healthz", 10, 3),
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": injection.user_id,
            "runAsGroup": injection.user_id,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "resources": {
            "requests": {"cpu": injection.cpu_request, "memory": injection.memory_request},
            "limits": {"memory": injection.memory_limit}
        },
        "volumeMounts": [
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true},
            {"name": TRUST_VOLUME, "mountPath": TRUST_DIR}
        ]
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn injection() -> Injection {
        Injection::new(
            "ghcr.io/aip-k8s/aip-sidecar:0.1.0",
            "https://aip-operator.aip-system.svc:8443",
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        )
    }

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "agent-1"}, "spec": spec})).unwrap()
    }

    fn applied(pod: &Pod) -> Pod {
        let ops = patch(&injection(), pod, &[], None).unwrap().unwrap();
        let mut doc = serde_json::to_value(pod).unwrap();
        let p: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut doc, &p).unwrap();
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn the_sidecar_goes_first_and_only_it_mounts_the_token() {
        let before = pod(json!({
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [
                {"name": "agent", "image": "agent", "env": [{"name": "A", "value": "1"}]},
                {"name": "helper", "image": "helper"}
            ],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }));
        let after = applied(&before);
        let spec = after.spec.unwrap();
        let init = spec.init_containers.unwrap();
        assert_eq!(init[0].name, SIDECAR);
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        assert!(init[0].startup_probe.is_some());
        let security = init[0].security_context.clone().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(init[1].name, "setup");
        let mounts = |c: &k8s_openapi::api::core::v1::Container| {
            c.volume_mounts
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|m| m.name == TOKEN_VOLUME)
        };
        assert!(mounts(&init[0]));
        assert!(!mounts(&init[1]) && !spec.containers.iter().any(mounts));
        let audience = spec.volumes.unwrap()[1]
            .projected
            .clone()
            .unwrap()
            .sources
            .unwrap()[0]
            .service_account_token
            .clone()
            .unwrap()
            .audience;
        assert_eq!(audience.as_deref(), Some("aip.io/sidecar"));
        for c in spec.containers.iter().chain(&init[1..]) {
            let env = c.env.clone().unwrap();
            let url = env.iter().find(|e| e.name == MCP_URL_ENV).unwrap();
            assert_eq!(url.value.as_deref(), Some("http://127.0.0.1:15001/mcp"));
        }
        assert_eq!(
            after.metadata.annotations.unwrap()[INJECTED_ANNOTATION],
            "injected"
        );
    }

    fn sidecar_of(injection: &Injection) -> k8s_openapi::api::core::v1::Container {
        let before = pod(json!({"containers": [{"name": "agent", "image": "a"}]}));
        let ops = patch(injection, &before, &[], None).unwrap().unwrap();
        let mut doc = serde_json::to_value(&before).unwrap();
        let p: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut doc, &p).unwrap();
        let after: Pod = serde_json::from_value(doc).unwrap();
        after.spec.unwrap().init_containers.unwrap().remove(0)
    }

    fn flag(c: &k8s_openapi::api::core::v1::Container, name: &str) -> Option<String> {
        let args = c.args.clone().unwrap();
        let at = args.iter().position(|a| a == name)?;
        args.get(at + 1).cloned()
    }

    fn probe_port(probe: Option<k8s_openapi::api::core::v1::Probe>) -> i32 {
        match probe.unwrap().http_get.unwrap().port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => p,
            other => panic!("a numbered port, not {other:?}"),
        }
    }

    /// A pod gets the bundle of the moment it is created, and a place of
    /// its own to keep the newer ones its sidecar is handed.
    #[test]
    fn each_pod_trusts_the_bundle_of_its_creation_and_keeps_newer_ones() {
        use crate::certs::Served;
        use crate::grpc::tls::ServerTls;
        let (old, new) = (
            ServerTls::self_signed(&["a".to_owned()]).unwrap(),
            ServerTls::self_signed(&["a".to_owned()]).unwrap(),
        );
        let served = |tls: &ServerTls, bundle: String| {
            std::sync::Arc::new(Served::new(tls.clone(), bundle).unwrap())
        };
        let (tx, rx) = tokio::sync::watch::channel(served(&old, old.cert_pem.clone()));
        let injection = injection().following(rx);
        let ca = |c: &k8s_openapi::api::core::v1::Container| {
            let env = c.env.clone().unwrap();
            let e = env
                .iter()
                .find(|e| e.name == "AIP_OPERATOR_CA_PEM")
                .unwrap();
            e.value.clone().unwrap()
        };
        assert_eq!(ca(&sidecar_of(&injection)), old.cert_pem);
        let both = format!("{}{}", old.cert_pem, new.cert_pem);
        tx.send(served(&old, both.clone())).unwrap();
        let sidecar = sidecar_of(&injection);
        assert_eq!(ca(&sidecar), both, "a pod created during a rotation");
        assert_eq!(
            flag(&sidecar, "--operator-ca-cache").unwrap(),
            format!("{TRUST_DIR}/operator-ca.crt")
        );
        let mount = sidecar
            .volume_mounts
            .unwrap()
            .into_iter()
            .find(|m| m.name == TRUST_VOLUME)
            .unwrap();
        assert_eq!(mount.mount_path, TRUST_DIR);
        assert_ne!(mount.read_only, Some(true), "the sidecar writes there");
    }

    #[test]
    fn the_admin_port_is_on_loopback_and_the_probes_use_the_metrics_port() {
        let sidecar = sidecar_of(&injection());
        assert_eq!(flag(&sidecar, "--admin").unwrap(), "127.0.0.1:15021");
        assert_eq!(flag(&sidecar, "--metrics-listen").unwrap(), "0.0.0.0:15020");
        assert_eq!(flag(&sidecar, "--listen").unwrap(), "127.0.0.1:15001");
        assert_eq!(probe_port(sidecar.startup_probe.clone()), 15020);
        assert_eq!(probe_port(sidecar.liveness_probe.clone()), 15020);
        let ports: Vec<(Option<String>, i32)> = sidecar
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name, p.container_port))
            .collect();
        assert_eq!(ports, [(Some("aip-metrics".to_owned()), 15020)]);
    }

    #[test]
    fn addresses_and_ports_are_configurable_and_an_exposed_admin_port_is_declared() {
        let mut custom = injection();
        custom.admin_address = "0.0.0.0".parse().unwrap();
        custom.admin_port = 9901;
        custom.metrics_address = "::".parse().unwrap();
        custom.metrics_port = 9902;
        let sidecar = sidecar_of(&custom);
        assert_eq!(flag(&sidecar, "--admin").unwrap(), "0.0.0.0:9901");
        assert_eq!(flag(&sidecar, "--metrics-listen").unwrap(), "[::]:9902");
        assert_eq!(probe_port(sidecar.startup_probe.clone()), 9902);
        let names: Vec<String> = sidecar
            .ports
            .unwrap()
            .into_iter()
            .filter_map(|p| p.name)
            .collect();
        assert_eq!(names, ["aip-metrics", "aip-admin"]);
        assert!(custom.admin_exposed() && !injection().admin_exposed());
    }

    #[test]
    fn listeners_sharing_a_port_are_named_by_their_flags() {
        assert_eq!(injection().port_conflict(), None);
        let mut same = injection();
        same.metrics_port = same.admin_port;
        assert_eq!(
            same.port_conflict().unwrap(),
            "--sidecar-metrics-port 15021 is also --sidecar-admin-port: the injected sidecar needs a port of its own for each listener"
        );
        let mut same = injection();
        same.metrics_port = same.port;
        assert!(
            same.port_conflict()
                .unwrap()
                .starts_with("--sidecar-metrics-port 15001 is also --sidecar-port")
        );
    }

    #[test]
    fn injecting_twice_changes_nothing() {
        let once = applied(&pod(
            json!({"containers": [{"name": "agent", "image": "a"}]}),
        ));
        assert_eq!(patch(&injection(), &once, &[], None).unwrap(), None);
    }

    #[test]
    fn upstream_tokens_join_the_sidecars_own_volume() {
        let p = pod(json!({"containers": [{"name": "agent", "image": "a"}]}));
        let tokens = [(
            "https://as/realms/r".to_owned(),
            600,
            "upstream/00ff".to_owned(),
        )];
        let ops = patch(&injection(), &p, &tokens, None).unwrap().unwrap();
        let text = serde_json::to_string(&ops).unwrap();
        let volumes = ops
            .iter()
            .find(|o| o["path"] == "/spec/volumes")
            .map(|o| o["value"].clone())
            .unwrap_or_else(|| panic!("{text}"));
        let sources = &volumes[0]["projected"]["sources"];
        assert_eq!(sources[0]["serviceAccountToken"]["path"], "token");
        assert_eq!(
            sources[1]["serviceAccountToken"],
            json!({"audience": "https://as/realms/r", "expirationSeconds": 600, "path": "upstream/00ff"})
        );
        // Still mounted by the sidecar alone.
        let applied = applied(&p);
        let spec = applied.spec.unwrap();
        let agent = &spec.containers[0];
        assert!(
            agent
                .volume_mounts
                .as_ref()
                .is_none_or(|m| m.iter().all(|m| m.name != TOKEN_VOLUME))
        );
    }

    #[test]
    fn host_network_and_shared_processes_are_refused_with_why() {
        let err = patch(
            &injection(),
            &pod(json!({"hostNetwork": true, "containers": [{"name": "a", "image": "a"}]})),
            &[],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("pod agent-1 sets hostNetwork"), "{err}");
        let err = patch(
            &injection(),
            &pod(
                json!({"shareProcessNamespace": true, "containers": [{"name": "a", "image": "a"}]}),
            ),
            &[],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("could read the gateway's memory"), "{err}");
    }

    #[test]
    fn a_locked_pod_proves_its_lock_first_and_carries_its_rules() {
        let mut injection = injection();
        injection.lock.cluster_dns = vec!["10.96.0.10".parse().unwrap()];
        let safe = json!({"runAsUser": 1000, "allowPrivilegeEscalation": false});
        let before = pod(json!({
            "initContainers": [{"name": "setup", "image": "s", "securityContext": safe}],
            "containers": [{"name": "agent", "image": "a", "securityContext": safe}]
        }));
        let allow = [aip_api::egress_lock::Destination {
            cidr: "203.0.113.0/24".into(),
            protocol: Default::default(),
            port: Some(443),
            end_port: None,
        }];
        let ops = patch(&injection, &before, &[], Some(&allow))
            .unwrap()
            .unwrap();
        let mut doc = serde_json::to_value(&before).unwrap();
        let p: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut doc, &p).unwrap();
        let after: Pod = serde_json::from_value(doc).unwrap();
        let init = after.spec.clone().unwrap().init_containers.unwrap();
        let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [lock::CHECK, SIDECAR, "setup"]);
        assert_eq!(
            init[0].args.clone().unwrap(),
            ["lock-check", "--probe", "192.0.2.1:9"]
        );
        let check_user = init[0].security_context.clone().unwrap().run_as_user;
        assert_eq!(check_user, Some(lock::DEFAULT_CHECK_USER));
        assert_eq!(
            init[1].security_context.clone().unwrap().run_as_user,
            Some(DEFAULT_USER)
        );
        // The pod's own init container was told where its gateway is.
        assert!(
            init[2]
                .env
                .clone()
                .unwrap()
                .iter()
                .any(|e| e.name == MCP_URL_ENV)
        );
        let annotations = after.metadata.annotations.unwrap();
        let rules: aip_api::egress_lock::Lock =
            serde_json::from_str(&annotations[LOCK_ANNOTATION]).unwrap();
        assert_eq!(rules.sidecar_uid, 7301);
        assert_eq!(
            rules.dns,
            ["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(rules.allow, allow);

        // Without a lock in the namespace, a lock the pod wrote itself goes.
        let mut own = pod(json!({"containers": [{"name": "agent", "image": "a"}]}));
        own.metadata.annotations = Some([(LOCK_ANNOTATION.to_owned(), "{}".to_owned())].into());
        let ops = patch(&injection, &own, &[], None).unwrap().unwrap();
        assert!(ops.iter().any(
            |o| o["op"] == "remove" && o["path"] == "/metadata/annotations/aip.io~1egress-lock"
        ));

        // A root agent is refused, naming the field.
        let root = pod(json!({"containers": [{"name": "agent", "image": "a",
            "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false}}]}));
        let err = patch(&injection, &root, &[], Some(&allow))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.containers[0].securityContext.runAsUser is 0 (root)"),
            "{err}"
        );
    }

    #[test]
    fn a_pod_labelled_disabled_is_left_alone() {
        let mut p = pod(json!({"hostNetwork": true, "containers": [{"name": "a", "image": "a"}]}));
        p.metadata.labels = Some([(INJECT_LABEL.to_owned(), "disabled".to_owned())].into());
        assert_eq!(patch(&injection(), &p, &[], None).unwrap(), None);
    }
}

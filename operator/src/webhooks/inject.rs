//! Sidecar injection (`POST /inject`, mutating, Pod CREATE): a pod opted in
//! by its namespace's or its own `aip.io/inject: enabled` label gets
//! aip-sidecar as a native sidecar (an init container with `restartPolicy:
//! Always`, first, with a startup probe), so its agent containers start only
//! once the gateway is ready and Jobs still complete. Only the sidecar
//! mounts the projected token with this system's audience; it runs as its
//! own non-root user with a read-only root filesystem and no capabilities.
//! Every other container is told where its gateway is. Injecting twice
//! changes nothing; a pod that shares the node's network or its processes
//! is refused, because there the gateway could be bypassed or read.

use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::{Value, json};

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

/// What an injected sidecar looks like.
#[derive(Clone, Debug)]
pub struct Injection {
    pub image: String,
    pub pull_policy: String,
    /// The operator's gRPC URL as seen from pods.
    pub operator_url: String,
    /// The name the operator's certificate is verified for.
    pub server_name: Option<String>,
    /// The CA bundle the sidecar trusts for the operator (PEM).
    pub ca_pem: String,
    /// The agents' port on loopback.
    pub port: u16,
    /// Health and metrics, for the kubelet's probes.
    pub admin_port: u16,
    pub user_id: i64,
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
}

/// Defaults of the injected container (the operator's flags use them too).
pub const DEFAULT_PORT: u16 = 15001;
pub const DEFAULT_ADMIN_PORT: u16 = 15021;
pub const DEFAULT_USER: i64 = 65532;
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
            port: DEFAULT_PORT,
            admin_port: DEFAULT_ADMIN_PORT,
            user_id: DEFAULT_USER,
            audience: aip_proto::TOKEN_AUDIENCE.to_owned(),
            cpu_request: DEFAULT_CPU_REQUEST.to_owned(),
            memory_request: DEFAULT_MEMORY_REQUEST.to_owned(),
            memory_limit: DEFAULT_MEMORY_LIMIT.to_owned(),
        }
    }
}

/// The verdict on one pod.
pub fn review(
    injection: &Injection,
    request: &AdmissionRequest<DynamicObject>,
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
    match patch(injection, &pod) {
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
pub fn patch(injection: &Injection, pod: &Pod) -> Result<Option<Vec<Value>>, Refusal> {
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
    let mut ops = Vec::new();
    let sidecar = container(injection);
    if spec.init_containers.is_none() {
        ops.push(json!({"op": "add", "path": "/spec/initContainers", "value": [sidecar]}));
    } else {
        ops.push(json!({"op": "add", "path": "/spec/initContainers/0", "value": sidecar}));
    }
    let volume = token_volume(&injection.audience);
    if spec.volumes.is_none() {
        ops.push(json!({"op": "add", "path": "/spec/volumes", "value": [volume]}));
    } else {
        ops.push(json!({"op": "add", "path": "/spec/volumes/-", "value": volume}));
    }
    let url = format!("http://127.0.0.1:{}/mcp", injection.port);
    let env = json!({"name": MCP_URL_ENV, "value": url});
    // Init containers shift by one: the sidecar went in first.
    let others = init
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("/spec/initContainers/{}", i + 1), c))
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
    let key = INJECTED_ANNOTATION.replace('/', "~1");
    if pod.metadata.annotations.is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {INJECTED_ANNOTATION: "injected"}}));
    } else {
        ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": "injected"}));
    }
    Ok(Some(ops))
}

/// The projected token with this system's audience, for the sidecar only.
fn token_volume(audience: &str) -> Value {
    json!({
        "name": TOKEN_VOLUME,
        "projected": {"sources": [{"serviceAccountToken": {
            "audience": audience, "expirationSeconds": 3600, "path": "token"}}]}
    })
}

fn container(injection: &Injection) -> Value {
    let mut args = vec![
        "--log-format".to_owned(),
        "json".to_owned(),
        "run".to_owned(),
        "--listen".to_owned(),
        format!("127.0.0.1:{}", injection.port),
        "--admin".to_owned(),
        format!("0.0.0.0:{}", injection.admin_port),
        "--operator".to_owned(),
        injection.operator_url.clone(),
        "--token-file".to_owned(),
        format!("{TOKEN_DIR}/token"),
    ];
    if let Some(name) = &injection.server_name {
        args.extend(["--operator-server-name".to_owned(), name.clone()]);
    }
    let probe = |path: &str, period: u32, failures: u32| {
        json!({"httpGet": {"path": path, "port": injection.admin_port},
               "periodSeconds": period, "failureThreshold": failures})
    };
    json!({
        "name": SIDECAR,
        "image": injection.image,
        "imagePullPolicy": injection.pull_policy,
        "restartPolicy": "Always",
        "args": args,
        "env": [{"name": "AIP_OPERATOR_CA_PEM", "value": injection.ca_pem}],
        "ports": [{"name": "aip-admin", "containerPort": injection.admin_port}],
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
        "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true}]
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
        let ops = patch(&injection(), pod).unwrap().unwrap();
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

    #[test]
    fn injecting_twice_changes_nothing() {
        let once = applied(&pod(
            json!({"containers": [{"name": "agent", "image": "a"}]}),
        ));
        assert_eq!(patch(&injection(), &once).unwrap(), None);
    }

    #[test]
    fn host_network_and_shared_processes_are_refused_with_why() {
        let err = patch(
            &injection(),
            &pod(json!({"hostNetwork": true, "containers": [{"name": "a", "image": "a"}]})),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("pod agent-1 sets hostNetwork"), "{err}");
        let err = patch(
            &injection(),
            &pod(
                json!({"shareProcessNamespace": true, "containers": [{"name": "a", "image": "a"}]}),
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("could read the gateway's memory"), "{err}");
    }

    #[test]
    fn a_pod_labelled_disabled_is_left_alone() {
        let mut p = pod(json!({"hostNetwork": true, "containers": [{"name": "a", "image": "a"}]}));
        p.metadata.labels = Some([(INJECT_LABEL.to_owned(), "disabled".to_owned())].into());
        assert_eq!(patch(&injection(), &p).unwrap(), None);
    }
}

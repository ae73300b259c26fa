//! What the node stories share: the node's control plane, the chart
//! installed once per node, kubectl as each person, waiting on the
//! cluster with `kubectl wait` (it watches).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aip_kube_test::{Dedicated, User};
use serde_json::Value;

use crate::common::Cluster;
use crate::common::kubectl::Kubectl;

/// The operator's namespace and release, as the quickstart names them.
pub const RELEASE: &str = "aip";
pub const OPERATOR_NAMESPACE: &str = "aip-system";

/// How long a pod may take to be scheduled, pulled from containerd's
/// store and started on the loaded 2-core machine.
pub const POD_PATIENCE: Duration = Duration::from_secs(120);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The node's cluster, with the chart installed (once per node: the first
/// test to get here installs it, the others wait for it).
pub async fn cluster() -> Cluster {
    let plane = Dedicated::Given(aip_kube_test::node().await);
    let admin = plane.client(User::Admin).await;
    let cluster = Cluster { plane, admin };
    let kubectl = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    tokio::task::spawn_blocking(move || install_chart_once(&kubectl))
        .await
        .unwrap();
    cluster
}

/// `helm install` of charts/aip as it ships, `--wait`ing for the operator's
/// Deployment; under a lock in the node's directory, so that test processes
/// (a runner may start one per test) install it once between them.
fn install_chart_once(kubectl: &Kubectl) {
    static ONCE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut installed = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if *installed {
        return;
    }
    let node_dir = std::env::var_os(aip_kube_test::node::ENV).unwrap();
    let lock = Path::new(&node_dir).join("chart.lock");
    let helm = repo().join("target/bin/helm");
    let chart = repo().join("charts/aip");
    let script = format!(
        "{helm} status {RELEASE} -n {OPERATOR_NAMESPACE} >/dev/null 2>&1 || \
         {helm} install {RELEASE} {chart} --namespace {OPERATOR_NAMESPACE} --create-namespace --wait --timeout 5m",
        helm = helm.display(),
        chart = chart.display(),
    );
    let out = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", &script])
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .output()
        .expect("flock and sh");
    assert!(
        out.status.success(),
        "helm install failed:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        kubectl
            .run(
                &["get", "pods,events", "-n", OPERATOR_NAMESPACE, "-o", "wide"],
                None
            )
            .1
    );
    *installed = true;
}

/// `kubectl wait --for=FOR OBJECT` in the kubectl's namespace, for up to
/// `patience`; kubectl's own words on failure, with the namespace's pods
/// and Events.
pub fn wait_for(kubectl: &Kubectl, object: &str, condition: &str, patience: Duration) {
    let timeout = format!("--timeout={}s", patience.as_secs());
    let (ok, out, err) = kubectl.run(
        &[
            "wait",
            "-n",
            &kubectl.namespace,
            object,
            &format!("--for={condition}"),
            &timeout,
        ],
        None,
    );
    assert!(
        ok,
        "kubectl wait {object} --for={condition}: {out}{err}\n{}",
        describe(kubectl)
    );
}

/// The namespace's pods and Events, for a failure report.
pub fn describe(kubectl: &Kubectl) -> String {
    let (_, pods, _) = kubectl.run(
        &["get", "pods", "-n", &kubectl.namespace, "-o", "wide"],
        None,
    );
    let (_, events, _) = kubectl.run(
        &[
            "get",
            "events",
            "-n",
            &kubectl.namespace,
            "--sort-by=.lastTimestamp",
        ],
        None,
    );
    format!("pods:\n{pods}\nevents:\n{events}")
}

/// The one pod matching `selector`, as JSON, once it exists.
pub async fn pod(kubectl: &Kubectl, selector: &str) -> Value {
    let deadline = tokio::time::Instant::now() + POD_PATIENCE;
    loop {
        let (ok, out, _) = kubectl.run(
            &[
                "get",
                "pods",
                "-n",
                &kubectl.namespace,
                "-l",
                selector,
                "-o",
                "json",
            ],
            None,
        );
        if let Some(pod) = serde_json::from_str::<Value>(&out)
            .ok()
            .filter(|_| ok)
            .and_then(|list| list["items"].get(0).cloned())
        {
            return pod;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pod {selector}:\n{}",
            describe(kubectl)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl logs` of one container of the pods matching `selector`.
pub fn logs(kubectl: &Kubectl, object: &str, container: &str) -> String {
    kubectl
        .run(
            &["logs", "-n", &kubectl.namespace, object, "-c", container],
            None,
        )
        .1
}

/// Waits until `container`'s log of `object` has a line containing
/// `needle`; the whole log.
pub async fn log_line(
    kubectl: &Kubectl,
    object: &str,
    container: &str,
    needle: &str,
    patience: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let log = logs(kubectl, object, container);
        if log.contains(needle) {
            return log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{object} container {container} never logged {needle:?}; its log:\n{log}\n{}",
            describe(kubectl)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The name of the one pending ApprovalRequest, once there is one.
pub async fn pending_request(kubectl: &Kubectl, patience: Duration) -> String {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let names = kubectl.get(
            "approvalrequests",
            "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
        );
        if !names.is_empty() && !names.contains(' ') {
            return names;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending ApprovalRequest:\n{}",
            describe(kubectl)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An RFC 3339 time of the API (second resolution), comparable as text.
pub fn time<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("no {what} in {value}"))
}

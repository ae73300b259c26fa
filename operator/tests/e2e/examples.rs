//! examples/cluster as a platform team applies it, on the genuine control
//! plane with the chart installed: `kubectl apply -k` creates every object
//! (the API server's validation and the operator's webhooks accept them),
//! kube-controller-manager makes the Deployment's and the Job's pods, the
//! injector gives the agent's pod its gateway and leaves the tool server's
//! alone, the policy is accepted, the connection waits for its grant and
//! stops waiting once `kubectl aip grant` ran. The script the ConfigMap
//! carries is valid (the fault server's check), and the images named are
//! the ones `make images` builds. (No kubelet here: the pods stay Pending;
//! operator/tests/node/ runs the same example in real pods.)

use std::path::Path;
use std::process::Command;

use aip_kube_test::User;
use serde_json::Value;

use crate::common::Cluster;
use crate::common::kubectl::{Kubectl, tempdir};
use crate::support::*;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster");
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_example_applies_and_its_pods_come_out_as_described() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("the_cluster_example_applies_and_its_pods_come_out_as_described") {
        return;
    }
    let admin = cluster.kubectl(User::Admin, "agents");
    // The cluster's DNS Service, as every cluster has one: the operator
    // reads its address at start for the example's egress lock.
    admin.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: kube-dns, namespace: kube-system}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: dns, port: 53, protocol: UDP}]\n",
    );
    let (_installed, _operator) = Installed::start(&cluster, &admin, &dir).await;

    let applied = admin.ok(&["apply", "-k", EXAMPLE], None);
    for created in [
        "namespace/agents created",
        "namespace/tools created",
        "serviceaccount/agent created",
        "secret/fs-token created",
        "service/files created",
        "deployment.apps/files created",
        "job.batch/agent created",
        "toolconnection.aip.io/fs created",
        "agentpolicy.aip.io/files created",
        "rolebinding.rbac.authorization.k8s.io/approvers created",
        "egresslock.aip.io/default created",
    ] {
        assert!(
            applied.contains(created),
            "{created} missing from:\n{applied}"
        );
    }
    assert_eq!(applied.matches("configmap/").count(), 1, "{applied}");

    // The Job controller's pod comes back from the injector with its
    // gateway; the Deployment's, in a namespace not opted in, without.
    let agent = pod_of(&admin, "agents", "job-name=agent").await;
    let containers = |pod: &Value, kind: &str| -> Vec<String> {
        pod["spec"][kind]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["image"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    // Its namespace is locked: first the proof of the lock (the gateway's
    // image), then the gateway; its rules name the cluster's DNS Service.
    let sidecar = format!("ghcr.io/aip-k8s/aip-sidecar:{VERSION}");
    assert_eq!(
        containers(&agent, "initContainers"),
        [sidecar.clone(), sidecar],
        "{agent}"
    );
    assert_eq!(agent["spec"]["initContainers"][0]["name"], "aip-lock-check");
    let lock: Value = serde_json::from_str(
        agent["metadata"]["annotations"]["aip.io/egress-lock"]
            .as_str()
            .unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}: {agent}"));
    assert_eq!(lock["dns"], serde_json::json!(["10.96.0.10"]), "{lock}");
    assert_eq!(lock["sidecarUid"], 7301, "{lock}");
    let env = agent["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("AIP_MCP_URL"), "{env}");
    let files = pod_of(&admin, "tools", "app=files").await;
    assert_eq!(containers(&files, "initContainers"), Vec::<String>::new());
    assert_eq!(
        containers(&files, "containers"),
        [format!("ghcr.io/aip-k8s/aip-fault-server:{VERSION}")]
    );

    // The policy is the operator's; the connection names its missing grant
    // until the grant is there.
    admin.wait(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Accepted\")].status}",
        "True",
    );
    let credentials = "{.status.conditions[?(@.type==\"CredentialsResolved\")].status}";
    admin.wait("toolconnection/fs", credentials, "False");
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");
    admin.wait("toolconnection/fs", credentials, "True");
}

#[test]
fn the_example_scripts_are_valid() {
    let script = Path::new(EXAMPLE).join("upstream.yaml");
    let checked = Command::new(binary("aip-fault-server"))
        .args(["--check", "--config"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The first pod matching `selector` in `ns`, once a controller made it.
async fn pod_of(kubectl: &Kubectl, ns: &'static str, selector: &'static str) -> Value {
    eventually(&format!("a pod {selector} in {ns}"), || {
        let kubectl = kubectl.clone();
        async move {
            let (ok, out, _) = kubectl.run(
                &["get", "pods", "-n", ns, "-l", selector, "-o", "json"],
                None,
            );
            let list: Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
            list["items"].get(0).cloned()
        }
    })
    .await
}

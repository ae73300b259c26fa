//! The chart as it ships, installed with `helm install --wait` (support.rs):
//! the operator runs in pods from its image, as the chart's ServiceAccount,
//! under the chart's securityContext, ready, and serves its webhooks
//! in-cluster (every injected pod of the other stories went through them).

use aip_kube_test::User;
use serde_json::Value;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_in_cluster_from_its_image_under_the_charts_identity() {
    let cluster = cluster().await;
    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    wait_for(
        &operator,
        "deployment/aip-operator",
        "condition=Available",
        POD_PATIENCE,
    );
    let pods: Value = serde_json::from_str(&operator.ok(
        &[
            "get",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=aip-operator",
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "the chart's replicaCount");
    for pod in pods {
        let spec = &pod["spec"];
        assert_eq!(spec["serviceAccountName"], "aip-operator", "{pod}");
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{pod}");
        let container = &spec["containers"][0];
        assert_eq!(
            container["image"],
            format!("ghcr.io/aip-k8s/aip-operator:{VERSION}")
        );
        assert_eq!(
            container["securityContext"]["readOnlyRootFilesystem"], true,
            "{pod}"
        );
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"][0], "ALL",
            "{pod}"
        );
        let status = &pod["status"]["containerStatuses"][0];
        assert_eq!(status["ready"], true, "{pod}");
        assert_eq!(status["restartCount"], 0, "{pod}");
    }
    // The webhooks are the chart's Service, answered by those pods.
    let service = operator.get("service/aip-operator", "{.spec.type}");
    assert_eq!(service, "ClusterIP");
    let endpoints = operator.ok(
        &[
            "get",
            "endpointslices",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "kubernetes.io/service-name=aip-operator",
            "-o",
            "jsonpath={.items[*].endpoints[*].conditions.ready}",
        ],
        None,
    );
    assert_eq!(
        endpoints
            .split_whitespace()
            .filter(|r| *r == "true")
            .count(),
        2,
        "{endpoints}"
    );
}

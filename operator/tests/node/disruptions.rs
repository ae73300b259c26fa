//! The control plane goes away under running pods: the operator's pods
//! (every replica), and the API server in the middle of an approval. Each
//! story has the node to itself (it stops what the others need).

use std::time::Duration;

use aip_kube_test::User;
use serde_json::json;

use crate::support::*;

const OPERATOR: &str = "deployment/aip-operator";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=aip-operator";

/// With no operator replica running: the running sidecar keeps the policy
/// it has and enforces it; a new pod that would be injected is refused as
/// the chart documents (failurePolicy Fail); once the operator is back,
/// that pod is admitted with its gateway and a policy change reaches the
/// running sidecar again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_keep_enforcing_while_the_operator_is_gone_and_all_converge_when_it_is_back() {
    let cluster = cluster_alone().await;
    let story = Story::new(&cluster, "operator-down").await;
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");
    story.agent_pod("agent-1");
    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let replicas = operator.get(OPERATOR, "{.spec.replicas}");

    operator.ok(
        &["scale", OPERATOR, "-n", OPERATOR_NAMESPACE, "--replicas=0"],
        None,
    );
    let (ok, out, err) = operator.run(
        &[
            "wait",
            "--for=delete",
            "pod",
            "-l",
            OPERATOR_PODS,
            "-n",
            OPERATOR_NAMESPACE,
            "--timeout=120s",
        ],
        None,
    );
    assert!(ok, "{out}{err}");
    assert_eq!(operator_pod_names(&operator), "");

    // The running pod's gateway still answers, with the policy it had.
    let (forward, mut agent) = story.agent_session("agent-1", "fs_read_file").await;
    reads(&mut agent).await;
    let refused = agent.call("fs_delete_file", json!({"path": "/old"})).await;
    assert_eq!(refused["error"]["code"], -32001, "{refused}");

    // A pod that would get a gateway is not created without one.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: agent-2, namespace: {}, labels: {{app: agent}}}}\nspec:\n  containers: [{{name: agent, image: {PAUSE}}}]\n",
        story.namespace
    );
    let (ok, out, err) = story.admin.run(&["apply", "-f", "-"], Some(&pod));
    assert!(!ok, "a pod was admitted without the injector: {out}");
    assert!(err.contains("failed calling webhook"), "{err}");

    operator.ok(
        &[
            "scale",
            OPERATOR,
            "-n",
            OPERATOR_NAMESPACE,
            &format!("--replicas={replicas}"),
        ],
        None,
    );
    wait_for(&operator, OPERATOR, "condition=Available", POD_PATIENCE);
    wait_injector(&story.admin, &story.namespace, POD_PATIENCE);
    story.admin.apply(&pod);
    wait_for(&story.admin, "pod/agent-2", "condition=Ready", POD_PATIENCE);
    assert_eq!(
        story.pod_json("agent-2")["spec"]["initContainers"][0]["name"],
        "aip-sidecar"
    );
    story.policy(&["fs_read_file", "fs_delete_file"], "");
    let deleted = until_allowed(&forward, &agent, "fs_delete_file", Duration::from_secs(90)).await;
    assert_eq!(
        deleted["result"]["content"][0]["text"], "deleted",
        "{deleted}"
    );
}

/// The API server dies and comes back while a call waits for a person: the
/// agent (inside its pod: nothing of its path goes through the API server)
/// keeps waiting, the ApprovalRequest is still there to approve, and the
/// call completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_survives_an_api_server_restart_and_the_call_runs_once() {
    let cluster = cluster_alone().await;
    let story = Story::new(&cluster, "apiserver-restart").await;
    story.tools("tok-1", "tok-1");
    story.policy(
        &["fs_read_file", "fs_delete_file"],
        "    - {tool: fs_delete_file, action: ask}\n",
    );
    story.admin.ok(
        &[
            "create",
            "rolebinding",
            "approvers",
            "-n",
            &story.namespace,
            "--clusterrole=aip-approver",
            "--group=approvers",
        ],
        None,
    );
    story.example_agent("agent-1");
    let alice = cluster.kubectl(User::Alice, &story.namespace);
    let request = pending_request(&alice, POD_PATIENCE).await;

    assert_eq!(aip_kube_test::node::kill("kube-apiserver"), 1);
    // The node starts it again; kubectl answers once it is ready.
    eventually("the API server back", Duration::from_secs(120), || {
        let admin = story.admin.clone();
        async move {
            admin
                .run(&["get", "--raw", "/readyz"], None)
                .0
                .then_some(())
        }
    })
    .await;

    let (ok, out, err) = alice.aip(&[
        "approve",
        &request,
        "-n",
        &story.namespace,
        "--reason",
        "checked",
    ]);
    assert!(ok, "kubectl aip approve after the restart: {out}{err}");
    wait_for(
        &story.admin,
        "pod/agent-1",
        "jsonpath={.status.phase}=Succeeded",
        POD_PATIENCE,
    );
    let log = logs(&story.admin, "pod/agent-1", "agent");
    assert!(log.contains("fs_delete_file: ok: deleted"), "{log}");
    assert_eq!(story.upstream_calls("delete_file").len(), 1);
    let line = audit_line(&story, "agent-1", "fs_delete_file", false).await;
    assert_eq!(
        (line["decision"].as_str(), line["approval"].as_str()),
        (Some("ALLOW"), Some(request.as_str())),
        "{line}"
    );
    let decision = story
        .admin
        .get(&format!("approvalrequest/{request}"), "{.status.decision}");
    assert_eq!(decision, "Approved");
    assert_logs_are_json(&story, &cluster);
}

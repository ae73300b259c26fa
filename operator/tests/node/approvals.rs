//! Held calls through the faults of an ordinary day, in real pods: a reset
//! of the sidecar's connection to the operator, the lease holder killed, a
//! `helm upgrade` of the chart, the operator away past a request's expiry,
//! and the gateway stopped with SIGTERM. Each asserts what the agent was
//! told (its error code, or the call's result), the gateway's audit line,
//! the ApprovalRequest's final state and how often the tool server ran the
//! call: a call runs once after its approval and never without one, and
//! no record says a person decided what a fault decided. Every line the
//! sidecars and the operator printed meanwhile parses as JSON.

use std::time::{Duration, Instant};

use aip_kube_test::User;
use serde_json::{Value, json};

use crate::common::Cluster;
use crate::common::agent::Agent;
use crate::common::kubectl::Kubectl;
use crate::support::*;

/// How long a held call may wait in these stories.
const HELD: Duration = Duration::from_secs(300);
/// How long the answer may take once the decision (or the fault) is there.
const ANSWER: Duration = Duration::from_secs(60);

/// An asking story: the tool server, the policy holding fs_delete_file,
/// one agent pod, a session through its gateway, and alice.
async fn asking(
    cluster: &Cluster,
    prefix: &str,
    timeout_seconds: u32,
) -> (Story, Forward, Agent, Kubectl) {
    let story = Story::new(cluster, prefix).await;
    story.tools("tok-1", "tok-1");
    story.asking(timeout_seconds);
    story.agent_pod("agent-1");
    let (forward, agent) = story.agent_session("agent-1", "fs_delete_file").await;
    let alice = cluster.kubectl(User::Alice, &story.namespace);
    (story, forward, agent, alice)
}

/// fs_delete_file as request `id` of `agent`'s session, held; its answer.
fn held(forward: &Forward, agent: &Agent, id: u64) -> tokio::task::JoinHandle<Value> {
    let agent = Agent::resume(forward.addr, &agent.session);
    tokio::spawn(async move {
        agent
            .held_call_as(id, "fs_delete_file", json!({"path": "/old"}), HELD)
            .await
    })
}

async fn answered(call: tokio::task::JoinHandle<Value>, patience: Duration) -> Value {
    tokio::time::timeout(patience, call)
        .await
        .expect("the held call answered in time")
        .unwrap()
}

/// `kubectl aip approve` as alice, again while the operator's webhooks are
/// not reached (a replica killed or replaced a moment ago).
async fn approve(alice: &Kubectl, request: &str) {
    eventually("alice's approval", POD_PATIENCE, || async {
        let (ok, out, err) = alice.aip(&[
            "approve",
            request,
            "-n",
            &alice.namespace,
            "--reason",
            "checked",
        ]);
        assert!(
            ok || err.contains("failed calling webhook") || err.contains("connection refused"),
            "kubectl aip approve: {out}{err}"
        );
        ok.then_some(())
    })
    .await;
}

fn status(story: &Story, request: &str) -> (String, String) {
    let object = format!("approvalrequest/{request}");
    (
        story.admin.get(&object, "{.status.decision}"),
        story.admin.get(&object, "{.status.reason}"),
    )
}

/// The call ran once, after alice's approval: the agent has its result,
/// the audit line says ALLOW for that request, the request says Approved.
async fn ran_once_approved(story: &Story, call: tokio::task::JoinHandle<Value>, request: &str) {
    let answer = answered(call, ANSWER).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "deleted",
        "{answer}"
    );
    assert_eq!(story.upstream_calls("delete_file").len(), 1, "exactly once");
    let line = audit_line(story, "agent-1", "fs_delete_file", false).await;
    assert_eq!(line["decision"], "ALLOW", "{line}");
    assert_eq!(line["approval"], request, "{line}");
    assert_eq!(status(story, request).0, "Approved");
}

/// The sidecar's connection to the operator is reset (both ends get a TCP
/// RST, as a conntrack flush or a load balancer does): the sidecar is back
/// within moments as the same instance, the request stays Pending (never
/// Withdrawn), alice approves, and the call runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_outlives_a_reset_of_the_connection_to_the_operator() {
    let cluster = cluster().await;
    let (story, forward, agent, alice) = asking(&cluster, "reset", 300).await;
    let call = held(&forward, &agent, 7);
    let request = pending_request(&alice, POD_PATIENCE).await;

    let sidecar = container_id(&story, "agent-1", "aip-sidecar");
    let port = operator_port(&story, "agent-1");
    let reset = reset_connections(container_pid(&sidecar), port);
    assert!(reset >= 1, "no connection to the operator to reset");
    log_line(
        &story.admin,
        "pod/agent-1",
        "aip-sidecar",
        "approval stream back",
        POD_PATIENCE,
    )
    .await;
    assert_eq!(status(&story, &request).0, "Pending", "not withdrawn");
    assert!(!call.is_finished(), "the agent still waits");

    approve(&alice, &request).await;
    ran_once_approved(&story, call, &request).await;
    assert_eq!(story.sidecar_restarts("agent-1"), 0, "the same instance");
    assert_logs_are_json(&story, &cluster);
}

/// The operator replica that holds the lease is killed (SIGKILL) while a
/// call waits: the other takes over, the sidecar follows its request there
/// if it was on the killed one, and the approval releases the call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_outlives_the_lease_holder_being_killed() {
    let cluster = cluster_alone().await;
    let (story, forward, agent, alice) = asking(&cluster, "lease-killed", 300).await;
    let call = held(&forward, &agent, 8);
    let request = pending_request(&alice, POD_PATIENCE).await;

    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let holder = operator.get("lease/aip-operator", "{.spec.holderIdentity}");
    let pod = operator.ok(
        &[
            "get",
            "pod",
            &holder,
            "-n",
            OPERATOR_NAMESPACE,
            "-o",
            "jsonpath={.status.containerStatuses[0].containerID}",
        ],
        None,
    );
    let id = pod.trim().strip_prefix("containerd://").unwrap().to_owned();
    let renewed = operator.get("lease/aip-operator", "{.spec.renewTime}");
    signal_container(&id, "SIGKILL");
    // The kubelet restarts it; the lease is held again (by either replica:
    // the restarted one may take it back under its pod's name).
    eventually("the killed replica restarted", POD_PATIENCE, || async {
        let restarts = operator.get(
            &format!("pod/{holder}"),
            "{.status.containerStatuses[0].restartCount}",
        );
        (restarts == "1").then_some(())
    })
    .await;
    eventually("the lease held again", POD_PATIENCE, || async {
        let now = operator.get("lease/aip-operator", "{.spec.renewTime}");
        (now != renewed).then_some(())
    })
    .await;
    assert_eq!(status(&story, &request).0, "Pending", "not withdrawn");

    approve(&alice, &request).await;
    ran_once_approved(&story, call, &request).await;
    wait_for(
        &operator,
        "deployment/aip-operator",
        "condition=Available",
        POD_PATIENCE,
    );
    assert_logs_are_json(&story, &cluster);
}

/// `helm upgrade` of the chart rolls every operator replica while a call
/// waits: the request stays Pending through the rollout and the approval
/// made afterwards releases the call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_outlives_a_helm_upgrade_of_the_chart() {
    let cluster = cluster_alone().await;
    let (story, forward, agent, alice) = asking(&cluster, "upgrade", 300).await;
    let call = held(&forward, &agent, 9);
    let request = pending_request(&alice, POD_PATIENCE).await;

    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let before = operator_pod_names(&operator);
    helm_upgrade(
        &operator,
        &format!("podAnnotations.aip\\.io/rolled={}", story.namespace),
    );
    eventually("every replica replaced", POD_PATIENCE, || async {
        let after = operator_pod_names(&operator);
        before
            .split_whitespace()
            .all(|p| !after.split_whitespace().any(|a| a == p))
            .then_some(())
    })
    .await;
    assert_eq!(status(&story, &request).0, "Pending", "not withdrawn");

    approve(&alice, &request).await;
    ran_once_approved(&story, call, &request).await;
    assert_logs_are_json(&story, &cluster);
}

/// With no operator replica running, a held call is answered as expired at
/// the request's `expiresAt` (within a second), as AIP's -32005; the
/// request reads Expired once an operator is back, and nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_operator_away_a_held_call_expires_at_its_expiry() {
    let cluster = cluster_alone().await;
    let (story, forward, agent, alice) = asking(&cluster, "expiry-away", 40).await;
    let call = held(&forward, &agent, 10);
    let request = pending_request(&alice, POD_PATIENCE).await;
    let expires = story
        .admin
        .get(&format!("approvalrequest/{request}"), "{.spec.expiresAt}");
    let expires: std::time::SystemTime = humantime::parse_rfc3339(&expires).unwrap();

    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let replicas = OperatorReplicas::scale_to_zero(operator.clone());
    let (ok, out, err) = operator.run(
        &[
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=aip-operator",
            "-n",
            OPERATOR_NAMESPACE,
            "--timeout=120s",
        ],
        None,
    );
    assert!(ok, "{out}{err}");
    assert!(
        std::time::SystemTime::now() < expires,
        "the operator took until the expiry to stop; the story proves nothing"
    );

    let answer = answered(call, HELD).await;
    let at = std::time::SystemTime::now();
    assert_eq!(answer["error"]["code"], -32005, "{answer}");
    let off = at
        .duration_since(expires)
        .or_else(|e| Ok::<_, ()>(e.duration()))
        .unwrap();
    assert!(
        off <= Duration::from_secs(1),
        "answered {off:?} away from expiresAt"
    );
    let line = audit_line(&story, "agent-1", "fs_delete_file", false).await;
    assert_eq!(line["decision"], "APPROVAL_TIMEOUT", "{line}");

    replicas.restore();
    story.admin.wait_within(
        &format!("approvalrequest/{request}"),
        "{.status.decision}",
        "Expired",
        POD_PATIENCE,
    );
    assert!(story.upstream_calls("delete_file").is_empty(), "never ran");
    assert_logs_are_json(&story, &cluster);
}

/// The gateway is stopped with SIGTERM while a call waits: the agent is
/// told at once (within a second) that the gateway is shutting down
/// (-32016, not a person's denial), the audit line says GATEWAY_SHUTDOWN,
/// the request is Withdrawn for that reason, and nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_stopped_with_sigterm_answers_its_held_call_at_once() {
    let cluster = cluster().await;
    let (story, forward, agent, alice) = asking(&cluster, "sigterm", 300).await;
    let call = held(&forward, &agent, 11);
    let request = pending_request(&alice, POD_PATIENCE).await;

    let sidecar = container_pid(&container_id(&story, "agent-1", "aip-sidecar"));
    let sent = Instant::now();
    assert!(
        aip_kube_test::node::terminate(sidecar),
        "no sidecar process"
    );
    let answer = answered(call, ANSWER).await;
    assert!(
        sent.elapsed() <= Duration::from_secs(1),
        "answered {:?} after SIGTERM",
        sent.elapsed()
    );
    assert_eq!(answer["error"]["code"], -32016, "{answer}");
    assert_eq!(
        answer["error"]["data"]["cause"], "GatewayShutdown",
        "{answer}"
    );

    story.admin.wait(
        &format!("approvalrequest/{request}"),
        "{.status.decision}",
        "Withdrawn",
    );
    assert_eq!(
        status(&story, &request),
        ("Withdrawn".to_owned(), "GatewayShutdown".to_owned())
    );
    // The kubelet restarts the gateway; the line is in the log it left.
    eventually("the sidecar restarted", POD_PATIENCE, || async {
        (story.sidecar_restarts("agent-1") == 1).then_some(())
    })
    .await;
    let line = audit_line(&story, "agent-1", "fs_delete_file", true).await;
    assert_eq!(line["decision"], "GATEWAY_SHUTDOWN", "{line}");
    assert_eq!(line["cause"], "GatewayShutdown", "{line}");
    assert!(story.upstream_calls("delete_file").is_empty(), "never ran");
    drop(forward);
    assert_logs_are_json(&story, &cluster);
}

/// `helm upgrade` of the release with the chart as it ships, `--reuse-values`
/// and `set` (one `--set` value), waiting for the rollout; then for the
/// webhooks to answer through the Service again.
fn helm_upgrade(kubectl: &Kubectl, set: &str) {
    let helm = repo().join("target/bin/helm");
    let chart = repo().join("charts/aip");
    let out = std::process::Command::new(helm)
        .args(["upgrade", RELEASE])
        .arg(chart)
        .args([
            "--namespace",
            OPERATOR_NAMESPACE,
            "--reuse-values",
            "--set",
            set,
        ])
        .args(["--wait", "--timeout", "5m"])
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .output()
        .expect("helm");
    assert!(
        out.status.success(),
        "helm upgrade: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        kubectl,
        "deployment/aip-operator",
        "condition=Available",
        POD_PATIENCE,
    );
}

//! examples/cluster, verbatim, as docs/quickstart.md tells a platform
//! engineer to run it: `kubectl apply -k`, `kubectl aip grant`, the agent
//! Job's pod injected and run by the kubelet, the native sidecar ready
//! before the agent starts, an allowed call, a refused call with the
//! policy's reason, a held call approved by alice with `kubectl aip
//! approve`, the Job Complete (the sidecar does not hold it open), and what
//! kubectl shows of it afterwards.

use std::time::Duration;

use aip_kube_test::User;
use serde_json::Value;

use crate::support::*;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_example_runs_in_real_pods_as_the_quickstart_says() {
    let cluster = cluster().await;
    let admin = cluster.kubectl(User::Admin, "agents");
    let alice = cluster.kubectl(User::Alice, "agents");

    admin.ok(&["apply", "-k", EXAMPLE], None);
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");

    // The agent first reads straight from the tool server, around its
    // gateway: the namespace's EgressLock refuses that at once. Then it
    // lists its tools, reads a file and is refused fs_chmod; its delete
    // waits for a person.
    let request = pending_request(&alice, POD_PATIENCE * 2).await;
    let log = log_line(
        &admin,
        "job/agent",
        "agent",
        "fs_delete_file: waiting",
        POD_PATIENCE,
    )
    .await;
    let direct = log
        .lines()
        .find(|l| l.starts_with("read_file straight to "))
        .unwrap_or_else(|| panic!("no direct attempt in:\n{log}"));
    assert!(
        direct.contains("(around the gateway): refused in ")
            && direct.ends_with("the pod's egress lock holds"),
        "{direct}"
    );
    let tools = log
        .lines()
        .find(|l| l.starts_with("tools: "))
        .unwrap_or_default();
    let mut tools: Vec<&str> = tools.trim_start_matches("tools: ").split(", ").collect();
    tools.sort_unstable();
    assert_eq!(tools, ["fs_delete_file", "fs_read_file"], "{log}");
    assert!(
        log.contains("fs_read_file: ok: Q3: revenue up 12%"),
        "{log}"
    );
    let refused = log
        .lines()
        .find(|l| l.starts_with("fs_chmod: refused:"))
        .unwrap_or_else(|| panic!("no refusal of fs_chmod in:\n{log}"));
    assert!(
        refused.contains("-32001 Forbidden") && refused.contains("Tool not in allowed_tools list"),
        "{refused}"
    );

    // While it waits: the gateway
    // reached the operator by its Service's name with the pod's projected
    // token (the operator's TokenReview names the pod); the refusal is in
    // the gateway's audit log, which kubectl reads.
    // The policy is synced: the lease holder counts the pod whichever of
    // the chart's two replicas its sidecar acked to (their sync reports).
    wait_for(
        &admin,
        "agentpolicy/files",
        "jsonpath={.status.synced}=1/1",
        POD_PATIENCE,
    );
    let running = pod(&admin, "job-name=agent").await;
    let pod_name = running["metadata"]["name"].as_str().unwrap().to_owned();
    // The example's namespace is locked: the pod proves its lock first,
    // then its gateway starts.
    let init = &running["spec"]["initContainers"];
    assert_eq!(init[0]["name"], "aip-lock-check", "{running}");
    assert_eq!(init[1]["name"], "aip-sidecar", "{running}");
    let args = init[1]["args"].to_string();
    assert!(
        args.contains("\"--operator\",\"https://aip-operator.aip-system.svc:"),
        "{args}"
    );
    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let connected = operator_logs(&operator);
    assert!(
        connected
            .lines()
            .any(|l| l.contains("sidecar connected") && l.contains(&pod_name)),
        "no operator replica says the pod's sidecar connected:\n{connected}"
    );
    let audit = logs(&admin, &format!("pod/{pod_name}"), "aip-sidecar");
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"decision\":\"BLOCK\"") && l.contains("fs_chmod")),
        "no audit record of the refusal:\n{audit}"
    );

    let (ok, out, err) = alice.aip(&["approve", &request, "-n", "agents", "--reason", "checked"]);
    assert!(ok, "kubectl aip approve: {out}{err}");
    // The Job's pod finishes: within 5 s it is no longer governed, so the
    // policy does not wait for a sidecar that will never run again.
    wait_for(
        &admin,
        &format!("pod/{pod_name}"),
        "jsonpath={.status.phase}=Succeeded",
        POD_PATIENCE,
    );
    let finished = std::time::Instant::now();
    wait_for(
        &admin,
        "agentpolicy/files",
        "jsonpath={.status.governedPods}=0",
        Duration::from_secs(5),
    );
    assert!(finished.elapsed() <= Duration::from_secs(5));
    wait_for(&admin, "job/agent", "condition=Complete", POD_PATIENCE);
    let log = logs(&admin, "job/agent", "agent");
    assert!(log.contains("fs_delete_file: ok: deleted"), "{log}");

    // The kubelet ran the injected gateway as a native sidecar: started and
    // initialized before the agent container started.
    let pod = pod(&admin, "job-name=agent").await;
    let check = &pod["status"]["initContainerStatuses"][0];
    assert_eq!(check["name"], "aip-lock-check", "{pod}");
    assert_eq!(check["state"]["terminated"]["exitCode"], 0, "{pod}");
    let sidecar = &pod["status"]["initContainerStatuses"][1];
    assert_eq!(sidecar["name"], "aip-sidecar", "{pod}");
    let agent = &pod["status"]["containerStatuses"][0];
    assert_eq!(agent["name"], "agent", "{pod}");
    let agent_started = time(&agent["state"]["terminated"]["startedAt"], "agent start");
    assert_eq!(agent["state"]["terminated"]["exitCode"], 0, "{pod}");
    let initialized = condition(&pod, "Initialized");
    assert!(
        time(&initialized["lastTransitionTime"], "Initialized") <= agent_started,
        "the agent started before the pod was initialized: {pod}"
    );

    // What kubectl shows of it: nothing governed runs, and a policy
    // change afterwards is Ready at once (0/0), not waiting on the
    // finished pod.
    let aip = admin.ok(&["get", "aip", "-n", "agents"], None);
    assert!(aip.contains("files") && aip.contains("0/0"), "{aip}");
    admin.ok(
        &[
            "patch",
            "agentpolicy",
            "files",
            "-n",
            "agents",
            "--type=merge",
            "-p",
            r#"{"spec":{"approval":{"timeoutSeconds":121}}}"#,
        ],
        None,
    );
    let generation = admin.get("agentpolicy/files", "{.metadata.generation}");
    wait_for(
        &admin,
        "agentpolicy/files",
        &format!("jsonpath={{.status.observedGeneration}}={generation}"),
        POD_PATIENCE,
    );
    wait_for(&admin, "agentpolicy/files", "condition=Ready", POD_PATIENCE);
    assert_eq!(admin.get("agentpolicy/files", "{.status.synced}"), "0/0");
    wait_for(
        &admin,
        "toolconnection/fs",
        "jsonpath={.status.conditions[?(@.type==\"Healthy\")].status}=True",
        POD_PATIENCE,
    );
    let decision = admin.get(&format!("approvalrequest/{request}"), "{.status.decision}");
    assert_eq!(decision, "Approved");
    let events = admin.ok(&["get", "events", "-n", "agents"], None);
    assert!(
        events.contains("ApprovalRequested") && events.contains(&request),
        "{events}"
    );

    // Run again, as `make demo-cluster` does: the Job deleted and made
    // anew; the tool server answers every run; Complete again, the policy
    // Ready after it.
    admin.ok(
        &["delete", "job", "agent", "-n", "agents", "--wait=true"],
        None,
    );
    admin.ok(&["apply", "-k", EXAMPLE], None);
    let again = eventually(
        "a second pending ApprovalRequest",
        POD_PATIENCE * 2,
        || async {
            let names = alice.get(
                "approvalrequests",
                "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
            );
            (!names.is_empty() && names != request).then_some(names)
        },
    )
    .await;
    let (ok, out, err) = alice.aip(&["approve", &again, "-n", "agents"]);
    assert!(ok, "kubectl aip approve: {out}{err}");
    wait_for(&admin, "job/agent", "condition=Complete", POD_PATIENCE);
    let log = logs(&admin, "job/agent", "agent");
    assert!(log.contains("fs_delete_file: ok: deleted"), "{log}");
    assert!(log.contains("fs_read_file: ok: "), "{log}");
    wait_for(&admin, "agentpolicy/files", "condition=Ready", POD_PATIENCE);

    // Done as the quickstart says, nothing of it is a warning in the
    // operator's log (the other stories' faults may be, elsewhere).
    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let warned: Vec<String> = operator_logs(&operator)
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        // The example's namespace, as a field or quoted in a message.
        .filter(|l| l.contains("\"agents\"") || l.contains("\\\"agents\\\""))
        .map(str::to_owned)
        .collect();
    assert!(
        warned.is_empty(),
        "the operator warned:\n{}",
        warned.join("\n")
    );
}

fn condition(pod: &Value, kind: &str) -> Value {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no condition {kind}: {pod}"))
}

//! The approver's story, end to end: an `ask` rule holds an agent's call in
//! its sidecar; the real operator (running as its own identity, with its
//! admission webhooks registered) makes an ApprovalRequest; alice lists it
//! and approves it with the `kubectl aip` plugin, and the call reaches the
//! fault server exactly once. Whoever may not decide is refused with the
//! webhook's reason (the pod's own token, another service account of its
//! namespace, the operator) or by RBAC; a decision is final. Cancelled calls
//! are withdrawn and never sent; identical calls need one approval each; a
//! denial and an expiry reach the agent as -32004 and -32005. The operator
//! restarted mid-wait still delivers the decision; a sidecar restarted while
//! the operator was away has its old requests withdrawn; decided requests go
//! away after the retention; every decision is an Event.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use aip_kube_test::User;

use crate::common::Cluster;
use crate::common::agent::{Agent, modern};
use crate::common::kubectl::{Kubectl, tempdir};
use crate::support::*;

/// What a platform team grants with the chart's roles: approvers decide,
/// viewers look; and (a mistake the webhook catches) the approver role for
/// the agent's namespace's service accounts.
const RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: viewers}
subjects: [{kind: Group, name: viewers, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: aip-viewer, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: approvers}
subjects: [{kind: Group, name: approvers, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: aip-approver, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: too-wide, namespace: agents}
subjects:
- {kind: ServiceAccount, name: agent, namespace: agents}
- {kind: ServiceAccount, name: helper, namespace: agents}
roleRef: {kind: ClusterRole, name: aip-approver, apiGroup: rbac.authorization.k8s.io}
";

/// The retention the restarted operator runs with, so the test sees it.
const RETENTION: &str = "6s";

fn asking_policy(extra: &str) -> String {
    format!(
        "{}  tool_rules: [{{tool: fs_delete_file, action: ask}}]\n{extra}",
        policy(&["fs_read_file", "fs_delete_file"])
    )
}

/// The running system and the people at the keyboard.
struct Story {
    admin: Kubectl,
    alice: Kubectl,
    agent: Agent,
}

impl Story {
    /// Starts `tool` with `arguments` as a call of its own; its answer.
    fn call(&self, id: u64, arguments: Value) -> tokio::task::JoinHandle<Value> {
        let agent = clone_agent(&self.agent);
        // Held while a person decides and, once, across an operator
        // restart: `answer` bounds the wait after each decision.
        tokio::spawn(async move {
            agent
                .held_call_as(id, "fs_delete_file", arguments, 4 * PATIENCE)
                .await
        })
    }

    fn decision(&self, name: &str) -> String {
        self.admin
            .get(&format!("approvalrequest/{name}"), "{.status.decision}")
    }

    /// Alice decides with the plugin; what it printed.
    fn alice_says(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.alice.aip(args);
        assert!(ok, "kubectl aip {args:?}:\n{out}{err}");
        out
    }
}

async fn answer(call: tokio::task::JoinHandle<Value>) -> Value {
    tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap()
}

// kubectl blocks a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_decides_each_held_call_with_kubectl() {
    let dir = tempdir();
    // alice the approver (group approvers), victor who may only look
    // (viewers), carol with no rights at all.
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("a_person_decides_each_held_call_with_kubectl") {
        return;
    }
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (fault_url, attempts) = start_fault_server(&dir, &shutdown).await;

    // The chart, and the operator as the chart runs it.
    let (installed, mut operator) = Installed::start(&cluster, &admin, &dir).await;
    let (ports, op_kubeconfig) = (installed.ports, installed.kubeconfig.clone());
    let operator_identity = Kubectl {
        kubeconfig: op_kubeconfig.clone(),
        namespace: "agents".to_owned(),
    };
    let operator_ca = installed.ca.clone();

    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    admin.apply(&secret("tok-A"));
    admin.apply(&connection(&fault_url));
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");
    admin.apply(&asking_policy(""));
    cluster.service_account("agents", "agent").await;
    cluster.service_account("agents", "helper").await;
    admin.apply(RBAC);
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let helper_uid = cluster
        .pod("agents", "helper-1", "helper", json!({"app": "helper"}))
        .await;
    let sidecar_token = sidecar_token(&cluster, &dir, "agent", "agent-1", &uid).await;

    // The people, and the tokens a compromised pod could use.
    let as_user = |token: &str| Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, token),
        namespace: "agents".to_owned(),
    };
    let alice = cluster.kubectl(User::Alice, "agents");
    let carol = cluster.kubectl(User::Carol, "agents");
    let victor = cluster.kubectl(User::Victor, "agents");
    let pod_token = cluster.token("agents", "agent", "agent-1", &uid, &[]).await;
    let the_pod = as_user(&pod_token);
    let helper_token = cluster
        .token("agents", "helper", "helper-1", &helper_uid, &[])
        .await;
    let helper = as_user(&helper_token);

    let sidecar = start_sidecar(&operator_ca, ports.grpc, &sidecar_token);
    let agent = agent_of(&sidecar).await;
    lists(&agent, "fs_delete_file").await;
    let mut story = Story {
        admin,
        alice,
        agent,
    };
    let admin = &story.admin;

    // The call waits; the agent's other calls do not.
    let held = story.call(10, json!({"path": "held"}));
    let name = pending_request(admin).await;
    assert!(name.starts_with("fs-delete-file-"), "{name}");
    let mut reader = clone_agent(&story.agent);
    let other = reader
        .call("fs_read_file", json!({"path": "meanwhile"}))
        .await;
    assert_eq!(other["result"]["content"][0]["text"], "contents", "{other}");
    assert_eq!(deletes(&attempts), 0, "nothing sent while it waits");

    // What alice sees.
    let listed = story.alice_says(&["approvals", "-n", "agents"]);
    let row = listed.lines().find(|l| l.starts_with(&name)).unwrap_or("");
    for cell in ["fs_delete_file", "agent-1", r#"{"path":"held"}"#, "in 4m"] {
        assert!(row.contains(cell), "{cell} missing from:\n{listed}");
    }

    // Who may not decide, and why they are told.
    let refused = |who: &Kubectl, expected: &str| {
        let (ok, said) = who.decide(&name, "Approved", "");
        assert!(!ok, "{said}");
        assert!(said.contains(expected), "expected {expected:?} in:\n{said}");
    };
    refused(&carol, "Forbidden");
    refused(&victor, "cannot patch resource \"approvalrequests/status\"");
    refused(
        &the_pod,
        "system:serviceaccount:agents:agent is bound to pod agent-1, which asked; a pod cannot approve its own calls",
    );
    refused(
        &helper,
        "system:serviceaccount:agents:helper is a service account of namespace agents, where the asking pod runs",
    );
    // The operator's RBAC has no use for reading a status, so kubectl's
    // patch (which reads first) is refused by RBAC; a bare PATCH, which
    // RBAC allows it, meets the webhook.
    refused(
        &operator_identity,
        "cannot get resource \"approvalrequests/status\"",
    );
    let said = patch_status_as(&op_kubeconfig, &name, "Approved").await;
    assert!(
        said.contains("the operator (system:serviceaccount:aip-system:aip-operator) may only set Expired or Withdrawn, not Approved"),
        "{said}"
    );
    assert_eq!(story.decision(&name), "Pending");

    // alice approves with kubectl: the call runs once, and the record says
    // she did.
    let (ok, said) = story
        .alice
        .decide(&name, "Approved", r#","reason":"looks fine""#);
    assert!(ok, "{said}");
    let released = answer(held).await;
    assert_eq!(
        released["result"]["content"][0]["text"], "deleted",
        "{released}"
    );
    assert_eq!(deletes(&attempts), 1, "forwarded exactly once");
    let apr = format!("approvalrequest/{name}");
    assert_eq!(admin.get(&apr, "{.status.decidedBy}"), "alice");
    assert_eq!(admin.get(&apr, "{.status.reason}"), "looks fine");
    let (ok, said) = story.alice.decide(&name, "Denied", "");
    assert!(!ok);
    assert!(
        said.contains("was already decided (Approved by alice); a decision is final"),
        "{said}"
    );
    let events = eventually("the request and the pod carry Events", || {
        let kubectl = admin.clone();
        let name = name.clone();
        async move {
            let events = events(&kubectl);
            let want = [
                format!("ApprovalRequested ApprovalRequest/{name}"),
                "ApprovalRequested Pod/agent-1".to_owned(),
                format!("Approved ApprovalRequest/{name}"),
                "Approved Pod/agent-1".to_owned(),
            ];
            want.iter().all(|w| events.contains(w)).then_some(events)
        }
    })
    .await;
    assert!(events.contains("approved by alice"), "{events}");

    // Cancelled by the agent: withdrawn, and no later decision sends it.
    let cancelled = story.call(777, json!({"path": "cancelled"}));
    let withdrawn = pending_request(admin).await;
    story
        .agent
        .notify("notifications/cancelled", json!({"requestId": 777}))
        .await;
    admin.wait(
        &format!("approvalrequest/{withdrawn}"),
        "{.status.decision}",
        "Withdrawn",
    );
    assert_eq!(
        admin.get(&format!("approvalrequest/{withdrawn}"), "{.status.reason}"),
        "Cancelled",
        "named for what happened"
    );
    let answered = answer(cancelled).await;
    assert!(answered.get("result").is_none(), "{answered}");
    let (ok, out, err) = story.alice.aip(&["approve", &withdrawn, "-n", "agents"]);
    assert!(!ok && err.contains("is already Withdrawn"), "{out}{err}");
    let (ok, said) = story.alice.decide(&withdrawn, "Approved", "");
    assert!(!ok && said.contains("a decision is final"), "{said}");
    assert_eq!(deletes(&attempts), 1, "never sent");

    // Two identical calls: two requests, one approval each.
    let first = story.call(21, json!({"path": "twice"}));
    let second = story.call(22, json!({"path": "twice"}));
    let both = eventually("two requests are pending", || {
        let kubectl = admin.clone();
        async move {
            let names = pending(&kubectl);
            (names.len() == 2).then_some(names)
        }
    })
    .await;
    let said = story.alice_says(&["approve", &both[0], "-n", "agents", "--reason", "once"]);
    assert!(
        said.contains(&format!("approvalrequest.aip.io/{} approved", both[0])),
        "{said}"
    );
    eventually("one of the two runs", || {
        let attempts = attempts.clone();
        async move { (deletes(&attempts) == 2).then_some(()) }
    })
    .await;
    assert!(
        !(first.is_finished() && second.is_finished()),
        "the other still waits"
    );
    assert_eq!(story.decision(&both[1]), "Pending");
    story.alice_says(&["approve", &both[1], "-n", "agents"]);
    for call in [first, second] {
        let r = answer(call).await;
        assert_eq!(r["result"]["content"][0]["text"], "deleted", "{r}");
    }
    assert_eq!(deletes(&attempts), 3);

    // A denial: -32004, nothing sent, the reason recorded.
    let denied_call = story.call(30, json!({"path": "denied"}));
    let denied = pending_request(admin).await;
    let said = story.alice_says(&["deny", &denied, "-n", "agents", "--reason", "not today"]);
    assert!(said.contains("denied"), "{said}");
    let refused_answer = answer(denied_call).await;
    assert_eq!(refused_answer["error"]["code"], -32004, "{refused_answer}");
    assert_eq!(deletes(&attempts), 3);

    // The operator restarts while a call waits: nothing is lost.
    let waiting = story.call(40, json!({"path": "across a restart"}));
    let across = pending_request(admin).await;
    operator.terminate();
    let mut operator = installed.restart(&["--approval-retention", RETENTION]);
    operator.line("cluster state loaded").await;
    assert_eq!(
        story.decision(&across),
        "Pending",
        "not withdrawn by the restart"
    );
    story.alice_says(&["approve", &across, "-n", "agents"]);
    let released = answer(waiting).await;
    assert_eq!(
        released["result"]["content"][0]["text"], "deleted",
        "{released}"
    );
    assert_eq!(deletes(&attempts), 4, "once");

    // Decided requests go when the retention is over.
    admin.ok(
        &[
            "wait",
            "-n",
            "agents",
            "--for=delete",
            &apr,
            "--timeout=30s",
        ],
        None,
    );

    // A sidecar that restarts while the operator is away has lost the
    // call: its request is withdrawn when it comes back.
    let orphan = story.call(50, json!({"path": "orphan"}));
    let orphaned = pending_request(admin).await;
    operator.terminate();
    drop(sidecar);
    let _ = answer(orphan).await;
    let sidecar = start_sidecar(&operator_ca, ports.grpc, &sidecar_token);
    let operator = installed.restart(&[]);
    operator.line("cluster state loaded").await;
    admin.wait(
        &format!("approvalrequest/{orphaned}"),
        "{.status.decision}",
        "Withdrawn",
    );
    assert_eq!(
        admin.get(&format!("approvalrequest/{orphaned}"), "{.status.reason}"),
        "SidecarRestarted"
    );
    story.agent = agent_of(&sidecar).await;
    lists(&story.agent, "fs_delete_file").await;
    assert_eq!(deletes(&attempts), 4);

    // Undecided until it expires: -32005, and the request says Expired.
    admin.apply(&asking_policy("  approval: {timeoutSeconds: 1}\n"));
    let expired = eventually("the short timeout is in force", || {
        let agent = clone_agent(&story.agent);
        async move {
            let r = agent
                .call_as(60, "fs_delete_file", json!({"path": "late"}))
                .await;
            (r["error"]["code"] == -32005).then_some(r)
        }
    })
    .await;
    assert!(
        expired["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{expired}"
    );
    let decisions = admin.get("approvalrequests", "{.items[*].status.decision}");
    assert!(decisions.contains("Expired"), "{decisions}");
    assert_eq!(deletes(&attempts), 4, "nothing sent");

    // A sidecar that goes away and stays away (killed, not restarted):
    // the stream that closed marks its request away, and past the bound
    // (2 s here) the lease holder withdraws it as SidecarAway; a broken
    // stream alone never does (the sidecar resumes it).
    admin.apply(&asking_policy(""));
    let generation = admin.get("agentpolicy/files", "{.metadata.generation}");
    admin.wait(
        "agentpolicy/files",
        "{.status.observedGeneration}",
        &generation,
    );
    let mut operator = operator;
    operator.terminate();
    let operator = installed.restart(&["--approval-away-bound", "2s"]);
    operator.line("cluster state loaded").await;
    story.agent = agent_of(&sidecar).await;
    lists(&story.agent, "fs_delete_file").await;
    let stranded = story.call(65, json!({"path": "stranded"}));
    let stranded_request = pending_request(admin).await;
    drop(sidecar);
    let _ = answer(stranded).await;
    admin.wait(
        &format!("approvalrequest/{stranded_request}"),
        "{.status.decision}",
        "Withdrawn",
    );
    assert_eq!(
        admin.get(
            &format!("approvalrequest/{stranded_request}"),
            "{.status.reason}"
        ),
        "SidecarAway"
    );
    let sidecar = start_sidecar(&operator_ca, ports.grpc, &sidecar_token);
    story.agent = agent_of(&sidecar).await;
    lists(&story.agent, "fs_delete_file").await;
    assert_eq!(deletes(&attempts), 4);

    // A pod deleted while its call waits: the request is withdrawn.
    let doomed = story.call(70, json!({"path": "doomed"}));
    let doomed_request = pending_request(admin).await;
    admin.ok(&["delete", "pod", "agent-1", "-n", "agents"], None);
    admin.wait(
        &format!("approvalrequest/{doomed_request}"),
        "{.status.decision}",
        "Withdrawn",
    );
    assert_eq!(
        admin.get(
            &format!("approvalrequest/{doomed_request}"),
            "{.status.reason}"
        ),
        "PodGone"
    );
    let _ = answer(doomed).await;
    assert_eq!(deletes(&attempts), 4, "never sent");
    drop(sidecar);
}

/// The pending requests' names.
fn pending(kubectl: &Kubectl) -> Vec<String> {
    kubectl
        .get(
            "approvalrequests",
            "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
        )
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A merge PATCH of `name`'s status decision as the user of `kubeconfig`,
/// without reading it first; the server's refusal, or "" when accepted.
async fn patch_status_as(kubeconfig: &std::path::Path, name: &str, decision: &str) -> String {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<aip_api::ApprovalRequest> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "agents");
    let patch = json!({"status": {"decision": decision}});
    match api
        .patch_status(name, &Default::default(), &kube::api::Patch::Merge(patch))
        .await
    {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

/// A 2026-07-28 agent that declares the tasks extension: its held call is a
/// task at once; the ApprovalRequest is the same one a held call makes;
/// alice's approval (`kubectl patch --subresource=status`) runs the call
/// exactly once and the task completes with its result; a denial fails the
/// next task with the AIP code; another client cannot read the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_modern_agent_follows_its_approval_as_a_task() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("a_modern_agent_follows_its_approval_as_a_task") {
        return;
    }
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (fault_url, attempts) = start_fault_server(&dir, &shutdown).await;
    let (installed, _operator) = Installed::start(&cluster, &admin, &dir).await;
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    admin.apply(&secret("tok-A"));
    admin.apply(&connection(&fault_url));
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");
    admin.apply(&asking_policy(""));
    cluster.service_account("agents", "agent").await;
    admin.apply(RBAC);
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let sidecar_token = sidecar_token(&cluster, &dir, "agent", "agent-1", &uid).await;
    let sidecar = start_sidecar(&installed.ca, installed.ports.grpc, &sidecar_token);
    let agent = agent_of(&sidecar).await;
    lists(&agent, "fs_delete_file").await;
    let alice = cluster.kubectl(User::Alice, "agents");
    let addr = agent.addr;

    let call = |path: &'static str| async move {
        let (status, created) = modern(
            addr,
            "planner",
            true,
            "tools/call",
            json!({"name": "fs_delete_file", "arguments": {"path": path}}),
        )
        .await;
        assert_eq!(status, 200, "{created}");
        assert_eq!(created["result"]["resultType"], "task", "{created}");
        assert_eq!(created["result"]["status"], "working", "{created}");
        created["result"]["taskId"].as_str().unwrap().to_owned()
    };
    let get = |client: &'static str, task: String| async move {
        modern(addr, client, true, "tasks/get", json!({"taskId": task})).await
    };
    let ended = |task: String| {
        eventually("the task ends", move || {
            let task = task.clone();
            async move {
                let (_, got) = get("planner", task).await;
                (got["result"]["status"] != "working").then_some(got)
            }
        })
    };

    // Approved: the call runs once, and the task has its result.
    let task = call("approved").await;
    let name = pending_request(&admin).await;
    assert_eq!(deletes(&attempts), 0, "nothing sent while it waits");
    let (_, other) = get("someone-else", task.clone()).await;
    assert_eq!(error_code(&other), Some(-32602), "{other}");
    let (ok, said) = alice.decide(&name, "Approved", r#","reason":"ok""#);
    assert!(ok, "{said}");
    let done = ended(task.clone()).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "deleted",
        "{done}"
    );
    assert_eq!(deletes(&attempts), 1, "forwarded exactly once");
    assert_eq!(
        admin.get(&format!("approvalrequest/{name}"), "{.status.decidedBy}"),
        "alice"
    );

    // Denied: the task fails with -32004, and nothing is sent.
    let task = call("denied").await;
    let name = pending_request(&admin).await;
    let (ok, said) = alice.decide(&name, "Denied", r#","reason":"no""#);
    assert!(ok, "{said}");
    let done = ended(task).await;
    assert_eq!(done["result"]["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], -32004, "{done}");
    assert_eq!(deletes(&attempts), 1, "a denied call is never sent");
    drop(sidecar);
}

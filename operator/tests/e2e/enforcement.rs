//! The platform engineer's story, end to end, on a control plane of its own
//! (the genuine kube-apiserver): `helm install` installs the chart, and the
//! real aip-operator binary runs with the chart's arguments as the chart's
//! service account, under exactly the chart's RBAC, the API server calling
//! its webhooks through the chart's Service (which these flows prove
//! sufficient, and checks below prove minimal: no Secret it was not granted,
//! no write it does not need). kubectl applies a Secret, a ToolConnection
//! pointing at the fault server (unreadable to the operator until `kubectl
//! aip grant`) and an AgentPolicy; the operator streams the
//! pod's configuration to the real aip-sidecar binary in Kubernetes mode,
//! which enforces it on an agent's calls. Editing the policy changes
//! enforcement and the status shows the new hash synced 1/1; an invalid edit
//! is refused by the operator's webhook and, admitted while the webhook is
//! not registered, marked Accepted=False while the sidecar keeps the previous
//! policy; a pod selected by two policies refuses every call;
//! stopping the operator leaves the sidecar enforcing; rotating the Secret
//! makes the next call use the new credential, and the upstream's 401 hides
//! the connection's tools. A ToolConnection naming a Secret its author
//! cannot read is refused, and so is his `kubectl aip grant` of it (the API
//! server's RBAC escalation check); a sidecar with the pod's default token
//! (the wrong audience) gets nothing. Statuses are server-side applied by
//! the operator's field manager alone.

use std::path::Path;

use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use aip_kube_test::User;

use crate::common::Cluster;
use crate::common::agent::Agent;
use crate::common::kubectl::{Kubectl, tempdir};
use crate::support::*;

// kubectl blocks a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_to_sidecar_enforcement() {
    let dir = tempdir();
    // bob (group platform) is a platform engineer who may edit aip objects
    // but not read the Secret the connection uses.
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("kubectl_to_sidecar_enforcement") {
        return;
    }
    let kubectl = cluster.kubectl(User::Admin, "agents");

    // The upstream: a fault server that takes only tok-A.
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (fault_url, attempts) = start_fault_server(&dir, &shutdown).await;

    // The chart, installed with kubectl; the operator as its service
    // account, with the chart's arguments (a fixed port and certificate, so
    // that it can come back where the sidecar expects it).
    let (installed, mut operator) = Installed::start(&cluster, &kubectl, &dir).await;
    let grpc = installed.ports.grpc;
    let operator_ca = installed.ca.clone();

    // The platform engineer's objects. The operator may not read the
    // connection's Secret until it is granted, and says how.
    kubectl.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    kubectl.apply(&secret("tok-A"));
    kubectl.apply(&secret_named("unrelated", "not-for-the-operator"));
    kubectl.apply(&connection(&fault_url));
    kubectl.apply(&policy(&["fs_read_file"]));
    let ungranted = eventually("the ungranted Secret is reported", || {
        let kubectl = kubectl.clone();
        async move {
            let message = kubectl.get(
                "toolconnection/fs",
                "{.status.conditions[?(@.type==\"CredentialsResolved\")].message}",
            );
            message.contains("may not read").then_some(message)
        }
    })
    .await;
    assert!(
        ungranted.contains("the operator may not read Secret fs-token: grant it with `kubectl aip grant fs -n agents`"),
        "{ungranted}"
    );
    // bob may write RBAC in agents but not read the Secret: the API
    // server's escalation check refuses his grant (a Role may not give
    // more than its author holds), and nothing is written.
    kubectl.apply("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: rbac-writer, namespace: agents}\nrules:\n- {apiGroups: [rbac.authorization.k8s.io], resources: [roles, rolebindings], verbs: [get, create, patch, update]}\n- {apiGroups: [aip.io], resources: [toolconnections], verbs: [get]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bob-writes-rbac, namespace: agents}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\nroleRef: {kind: Role, name: rbac-writer, apiGroup: rbac.authorization.k8s.io}\n");
    let bob = cluster.kubectl(User::Bob, "agents");
    let (ok, said, err) = bob.aip(&["grant", "fs", "-n", "agents"]);
    assert!(!ok, "{said}");
    assert!(
        err.contains("error: Error from server (Forbidden): roles.rbac.authorization.k8s.io \"aip-credentials-fs\" is forbidden: user \"bob\" (groups=[\"platform\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], ResourceNames:[\"fs-token\"], Verbs:[\"get\" \"list\" \"watch\"]}"),
        "{err}"
    );
    let (exists, _, _) = kubectl.run(&["get", "role", "aip-credentials-fs", "-n", "agents"], None);
    assert!(!exists, "a refused grant writes nothing");
    let (ok, said, err) = kubectl.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{said}{err}");
    assert!(
        said.contains("aip-system/aip-operator may read Secret(s) fs-token in namespace agents"),
        "{said}"
    );
    least_privilege(&cluster).await;
    injection_through_the_chart(&kubectl).await;

    // The agent pod, and the token the kubelet would project for its sidecar.
    cluster.service_account("agents", "agent").await;
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let token_file = sidecar_token(&cluster, &dir, "agent", "agent-1", &uid).await;

    // bob may not aim a Secret he cannot read at a host of his choosing.
    kubectl.apply("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: aip-editor, namespace: agents}\nrules:\n- {apiGroups: [aip.io], resources: [agentpolicies, toolconnections], verbs: [get, list, create, update, patch]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bob-edits-aip, namespace: agents}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\nroleRef: {kind: Role, name: aip-editor, apiGroup: rbac.authorization.k8s.io}\n");
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some("apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {name: exfil, namespace: agents}\nspec:\n  url: https://bob.example.net/mcp\n  bearerToken: {valueFrom: {secretKeyRef: {name: fs-token, key: token}}}\n"),
    );
    assert!(!ok, "refused");
    assert!(
        err.contains("names Secret fs-token, which bob may not get in namespace agents"),
        "{err}"
    );

    // A sidecar presenting the pod's default token (the API server's
    // audience) gets nothing: it never leaves its empty, deny-all config.
    let default_token = cluster.token("agents", "agent", "agent-1", &uid, &[]).await;
    let default_token_file = dir.join("default-token");
    std::fs::write(&default_token_file, &default_token).unwrap();
    let impostor = start_sidecar(&operator_ca, grpc, &default_token_file);
    let line = impostor
        .line("configuration stream from the operator lost")
        .await;
    assert!(line.contains("audience"), "{line}");
    drop(impostor);

    let sidecar = start_sidecar(&operator_ca, grpc, &token_file);
    let mut agent = agent_of(&sidecar).await;

    // Enforced: the granted tool works, the other is refused.
    lists(&agent, "fs_read_file").await;
    let read = agent.call("fs_read_file", json!({"path": "a"})).await;
    assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
    let refused = agent.call("fs_delete_file", json!({"path": "a"})).await;
    assert_eq!(error_code(&refused), Some(-32001), "{refused}");
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/1");
    kubectl.wait("toolconnection/fs", "{.status.health.state}", "Healthy");
    assert_eq!(
        kubectl.get("toolconnection/fs", "{.status.tools[*].name}"),
        "delete_file read_file"
    );
    let listed = kubectl.ok(&["get", "aip", "-n", "agents"], None);
    assert!(
        listed.contains("agentpolicy.aip.io/files") && listed.contains("toolconnection.aip.io/fs"),
        "{listed}"
    );
    assert!(
        listed.contains("Healthy") && listed.contains("1/1"),
        "{listed}"
    );
    status_is_the_operators(&kubectl, "agentpolicy/files");
    status_is_the_operators(&kubectl, "toolconnection/fs");
    let first_hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
    assert!(first_hash.starts_with("sha256:"));
    a_second_replica_reports_its_sidecars(&cluster, &kubectl, &installed, &dir).await;

    // Another controller's condition: the list is keyed by type, so the
    // operator's next status write leaves it where it is.
    let reviewed = json!({"apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
        "status": {"conditions": [{"type": "example.com/Reviewed", "status": "True",
            "reason": "Reviewed", "message": "seen by the security team",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let policies: kube::Api<aip_api::AgentPolicy> =
        kube::Api::namespaced(cluster.admin.clone(), "agents");
    policies
        .patch_status(
            "files",
            &kube::api::PatchParams::apply("reviewer"),
            &kube::api::Patch::Apply(&reviewed),
        )
        .await
        .unwrap();

    // Editing the policy changes enforcement; the status follows.
    kubectl.apply(&policy(&["fs_read_file", "fs_delete_file"]));
    let deleted = succeeds(
        &agent,
        "the edited policy is enforced",
        "fs_delete_file",
        json!({"path": "a"}),
    )
    .await;
    assert_eq!(deleted["result"]["content"][0]["text"], "deleted");
    tool_pins_reach_the_sidecar(&kubectl, &agent, &fault_url, &attempts).await;
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/1");
    let second_hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
    assert_ne!(second_hash, first_hash);
    kubectl.wait("agentpolicy/files", "{.status.observedGeneration}", "2");
    let theirs = "{.status.conditions[?(@.type==\"example.com/Reviewed\")].message}";
    assert_eq!(
        kubectl.get("agentpolicy/files", theirs),
        "seen by the security team"
    );
    let types = kubectl.get("agentpolicy/files", "{.status.conditions[*].type}");
    let mut types: Vec<&str> = types.split_whitespace().collect();
    types.sort_unstable();
    assert_eq!(
        types,
        ["Accepted", "Conflict", "Ready", "example.com/Reviewed"]
    );

    // An invalid edit is refused at apply time by the operator's webhook...
    let invalid = format!(
        "{}  tool_rules: [{{tool: fs_read_file, rate_limit: lots}}]\n",
        policy(&["fs_read_file"])
    );
    let (ok, _, err) = kubectl.run(&["apply", "-f", "-"], Some(&invalid));
    assert!(!ok, "the webhook refuses it");
    assert!(
        err.contains("denied the request: AgentPolicy files is invalid: spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\""),
        "{err}"
    );
    // ...and, admitted while the webhook is not there, marked and not enforced.
    kubectl.ok(
        &["delete", "validatingwebhookconfiguration", "aip-operator"],
        None,
    );
    kubectl.apply(&invalid);
    kubectl.wait(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Accepted\")].status}",
        "False",
    );
    let message = kubectl.get(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Accepted\")].message}",
    );
    assert!(
        message.starts_with("spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\""),
        "{message}"
    );
    assert_eq!(
        kubectl.get("agentpolicy/files", "{.status.policyHash}"),
        second_hash
    );
    let still = agent.call("fs_delete_file", json!({"path": "b"})).await;
    assert!(
        still.get("result").is_some(),
        "the previous policy stays in force: {still}"
    );

    // A second policy selecting the same pod: neither applies, both say so,
    // and the pod gets an Event.
    kubectl.apply("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: wide, namespace: agents}\nspec:\n  allowed_tools: [fs_read_file]\n");
    kubectl.wait(
        "agentpolicy/wide",
        "{.status.conditions[?(@.type==\"Conflict\")].status}",
        "True",
    );
    let conflict = kubectl.get(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Conflict\")].message}",
    );
    assert!(conflict.contains("agent-1 (also wide)"), "{conflict}");
    eventually(
        "the pod caught between two policies refuses every call",
        || {
            let mut agent = clone_agent(&agent);
            async move {
                error_code(&agent.call("fs_read_file", json!({"path": "x"})).await).map(|_| ())
            }
        },
    )
    .await;
    let events = kubectl.ok(
        &[
            "get",
            "events.events.k8s.io",
            "-n",
            "agents",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.regarding.kind}/{.regarding.name}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(events.contains("PolicyConflict Pod/agent-1"), "{events}");
    kubectl.ok(&["delete", "agentpolicy", "wide", "-n", "agents"], None);
    kubectl.wait(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Conflict\")].status}",
        "False",
    );
    eventually("the pod is governed again", || {
        let mut agent = clone_agent(&agent);
        async move {
            agent
                .call("fs_read_file", json!({"path": "y"}))
                .await
                .get("result")
                .map(|_| ())
        }
    })
    .await;

    // Without the operator the sidecar keeps enforcing its last config.
    operator.terminate();
    let read = agent.call("fs_read_file", json!({"path": "c"})).await;
    assert!(read.get("result").is_some(), "{read}");
    assert_eq!(
        error_code(&agent.call("fs_other", json!({})).await),
        Some(-32001)
    );

    // Back, then a rotated Secret: the next call carries the new credential,
    // the upstream refuses it, and the connection's tools disappear.
    let operator = installed.restart(&[]);
    operator.line("cluster state loaded").await;
    kubectl.apply(&secret("tok-B"));
    // The old credential still works upstream, so a 401 proves the new one
    // was sent.
    eventually(
        "the rotated credential's 401 hides the connection's tools",
        || {
            let mut agent = clone_agent(&agent);
            async move {
                (!agent
                    .tool_names()
                    .await
                    .iter()
                    .any(|t| t.starts_with("fs_")))
                .then_some(())
            }
        },
    )
    .await;
    kubectl.wait(
        "toolconnection/fs",
        "{.status.health.state}",
        "NeedsCredentials",
    );
    assert_eq!(
        kubectl.get("toolconnection/fs", "{.status.health.httpStatus}"),
        "401"
    );
    let hidden = agent.call("fs_read_file", json!({"path": "e"})).await;
    assert_eq!(
        hidden["error"]["message"],
        "Unknown tool: fs_read_file (connection fs is NeedsCredentials: upstream_auth_failed)",
        "{hidden}"
    );

    // Rotating back restores the tools, and the upstream sees tok-A again.
    kubectl.apply(&secret("tok-A"));
    let read = succeeds(
        &agent,
        "the restored credential brings the tools back",
        "fs_read_file",
        json!({"path": "f"}),
    )
    .await;
    assert_eq!(read["result"]["content"][0]["text"], "contents");
    kubectl.wait("toolconnection/fs", "{.status.health.state}", "Healthy");
    let want = hex::encode(Sha256::digest(b"Bearer tok-A"));
    let log = std::fs::read_to_string(&attempts).unwrap();
    let last = log.lines().last().unwrap();
    assert!(last.contains(&want), "{last}");
    assert!(!log.contains("tok-A"), "the attempt log holds digests only");
    drop(sidecar);
}

/// A second replica (not the lease holder) serving a second pod's sidecar:
/// the holder counts that pod synced from the replica's sync report, and
/// stops counting it when the replica (no pod of its own here) withdraws
/// the report at exit. Leaves the namespace as it found it: one pod.
async fn a_second_replica_reports_its_sidecars(
    cluster: &Cluster,
    kubectl: &Kubectl,
    installed: &Installed,
    dir: &std::path::Path,
) {
    let ports = Ports {
        grpc: crate::common::local::free_port(),
        webhook: crate::common::local::free_port(),
    };
    let mut standby = start_chart_operator(
        &installed.kubeconfig,
        &installed.args,
        ports,
        &["--pod-name", "aip-operator-1"],
    );
    standby.line("cluster state loaded").await;
    let uid = cluster
        .pod("agents", "agent-2", "agent", json!({"app": "agent"}))
        .await;
    let second = dir.join("second");
    std::fs::create_dir_all(&second).unwrap();
    let token_file = sidecar_token(cluster, &second, "agent", "agent-2", &uid).await;
    let sidecar = start_sidecar(&installed.ca, ports.grpc, &token_file);
    let agent = agent_of(&sidecar).await;
    lists(&agent, "fs_read_file").await;
    standby.line("sidecar connected").await;
    kubectl.wait("agentpolicy/files", "{.status.synced}", "2/2");
    let reports = kubectl.ok(
        &[
            "get",
            "configmaps",
            "-n",
            "aip-system",
            "-l",
            "aip.io/sync-report=true",
            "-o",
            "jsonpath={range .items[*]}{.metadata.annotations.aip\\.io/replica}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(
        reports.lines().any(|r| r == "aip-operator-1"),
        "the standby's report: {reports}"
    );

    standby.terminate();
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/2");
    drop(sidecar);
    kubectl.ok(
        &["delete", "pod", "agent-2", "-n", "agents", "--wait=false"],
        None,
    );
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/1");
}

/// `object`'s status is written by server-side apply, by the operator's
/// field manager alone (the API server's managedFields say so), and its
/// spec by whoever applied it.
fn status_is_the_operators(kubectl: &Kubectl, object: &str) {
    let got: serde_json::Value = serde_json::from_str(&kubectl.ok(
        &[
            "get",
            object,
            "-n",
            "agents",
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    ))
    .unwrap();
    let managed = got["metadata"]["managedFields"].as_array().unwrap();
    let status: Vec<&serde_json::Value> = managed
        .iter()
        .filter(|m| m["subresource"] == "status")
        .collect();
    assert_eq!(
        status.len(),
        1,
        "one manager owns {object}'s status: {managed:?}"
    );
    assert_eq!(status[0]["manager"], "aip-operator", "{managed:?}");
    assert_eq!(status[0]["operation"], "Apply", "{managed:?}");
    let owned = status[0]["fieldsV1"]["f:status"].as_object().unwrap();
    assert!(
        owned.contains_key("f:conditions") && owned.contains_key("f:observedGeneration"),
        "{owned:?}"
    );
    let spec_owner = managed
        .iter()
        .find(|m| m["fieldsV1"]["f:spec"].is_object())
        .unwrap();
    assert_eq!(
        spec_owner["manager"], "kubectl-client-side-apply",
        "{managed:?}"
    );
    assert!(spec_owner["subresource"].is_null(), "{managed:?}");
}

/// What the chart's RBAC lets the operator do, asked of the API server: the
/// granted Secret and nothing else of Secrets; none of the writes it has no
/// use for.
async fn least_privilege(cluster: &Cluster) {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let may = |verb: &str, group: &str, resource: &str, ns: Option<&str>, name: Option<&str>| {
        let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {
            "user": "system:serviceaccount:aip-system:aip-operator",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:aip-system", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                   "namespace": ns, "name": name}}}))
        .unwrap();
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(cluster.admin.clone());
        async move {
            api.create(&Default::default(), &review)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        }
    };
    assert!(may("get", "", "secrets", Some("agents"), Some("fs-token")).await);
    assert!(may("watch", "", "secrets", Some("agents"), Some("fs-token")).await);
    assert!(
        may(
            "patch",
            "",
            "configmaps",
            Some("aip-system"),
            Some("aip-sync-aip-operator-0-0")
        )
        .await
    );
    let denied = [
        ("get", "", "secrets", Some("agents"), Some("unrelated")),
        ("list", "", "secrets", Some("agents"), None),
        ("list", "", "secrets", None, None),
        ("get", "", "secrets", Some("kube-system"), Some("fs-token")),
        ("create", "", "pods", Some("agents"), None),
        ("delete", "", "pods", Some("agents"), Some("agent-1")),
        ("update", "", "secrets", Some("agents"), Some("fs-token")),
        ("create", "", "secrets", Some("agents"), None),
        (
            "update",
            "aip.io",
            "agentpolicies",
            Some("agents"),
            Some("files"),
        ),
        (
            "delete",
            "aip.io",
            "toolconnections",
            Some("agents"),
            Some("fs"),
        ),
        (
            "create",
            "rbac.authorization.k8s.io",
            "roles",
            Some("agents"),
            None,
        ),
        (
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            None,
            None,
        ),
        (
            "patch",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            None,
            Some("someone-else"),
        ),
        (
            "patch",
            "apps",
            "deployments",
            Some("aip-system"),
            Some("aip-operator"),
        ),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            Some("aip-system"),
            Some("someone-else"),
        ),
        // Sync reports live in its own namespace only.
        ("patch", "", "configmaps", Some("agents"), None),
        ("list", "", "configmaps", None, None),
    ];
    for (verb, group, resource, ns, name) in denied {
        assert!(
            !may(verb, group, resource, ns, name).await,
            "the chart lets the operator {verb} {group}/{resource} {ns:?} {name:?}"
        );
    }
}

/// The chart's injection webhook, served by the operator under the chart's
/// RBAC: an opted-in namespace's pod comes back with its gateway (once), a
/// hostNetwork pod is refused with the reason.
async fn injection_through_the_chart(kubectl: &Kubectl) {
    kubectl.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {aip.io/inject: enabled}}\n");
    let pod = |name: &str, spec: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: team}}\nspec:\n{spec}  containers: [{{name: agent, image: agent}}]\n"
        )
    };
    kubectl.apply(&pod("worker", ""));
    let got: serde_json::Value = serde_json::from_str(
        &kubectl.ok(&["get", "pod", "worker", "-n", "team", "-o", "json"], None),
    )
    .unwrap();
    let spec = &got["spec"];
    let sidecar = &spec["initContainers"][0];
    assert_eq!(sidecar["name"], "aip-sidecar", "{got}");
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert!(sidecar["image"].as_str().unwrap().contains("aip-sidecar"));
    assert_eq!(sidecar["volumeMounts"][0]["name"], "aip-token");
    // (The API server's ServiceAccount admission mounts the pod's default
    // token into the agent, as in every pod; the sidecar's is not there.)
    let mounts = &spec["containers"][0]["volumeMounts"];
    assert!(
        mounts
            .as_array()
            .is_some_and(|m| m.iter().all(|m| m["name"] != "aip-token")),
        "the sidecar's token is the sidecar's only: {mounts}"
    );
    assert_eq!(
        spec["containers"][0]["env"][0]["value"],
        "http://127.0.0.1:15001/mcp"
    );
    // The gateway is pointed at the operator's Service and trusts its CA.
    let args = sidecar["args"].to_string();
    assert!(
        args.contains("https://aip-operator.aip-system.svc:8443"),
        "{args}"
    );
    assert!(
        sidecar["env"][0]["value"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    // Admitted again as it came back: still one gateway.
    let mut again = got.clone();
    again["metadata"] = json!({"name": "worker-2", "namespace": "team", "annotations": got["metadata"]["annotations"]});
    kubectl.apply(&again.to_string());
    let twice = kubectl.ok(
        &[
            "get",
            "pod",
            "worker-2",
            "-n",
            "team",
            "-o",
            "jsonpath={.spec.initContainers[*].name}",
        ],
        None,
    );
    assert_eq!(twice, "aip-sidecar");
    // A pod a policy governs that opted out runs ungoverned: the policy
    // names it and the pod gets an Event.
    kubectl.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: stray, namespace: team, labels: {app: worker, aip.io/inject: disabled}}\nspec:\n  containers: [{name: agent, image: agent}]\n---\napiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: workers, namespace: team}\nspec:\n  podSelector: {matchLabels: {app: worker}}\n  allowed_tools: []\n");
    kubectl.ok(
        &[
            "wait",
            "-n",
            "team",
            "agentpolicy/workers",
            "--for=jsonpath={.status.podsWithoutSidecar[0]}=stray",
            "--timeout=30s",
        ],
        None,
    );
    let reason = kubectl.ok(
        &[
            "get",
            "agentpolicy/workers",
            "-n",
            "team",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}",
        ],
        None,
    );
    assert_eq!(reason, "PodsWithoutSidecar");
    eventually("the stray pod gets a NoSidecar Event", || {
        let kubectl = kubectl.clone();
        async move {
            let events = kubectl.ok(
                &["get", "events.events.k8s.io", "-n", "team", "-o",
                  "jsonpath={range .items[*]}{.reason} {.regarding.kind}/{.regarding.name}{\"\\n\"}{end}"],
                None,
            );
            events.contains("NoSidecar Pod/stray").then_some(())
        }
    })
    .await;
    let (ok, _, err) = kubectl.run(
        &["apply", "-f", "-"],
        Some(&pod("host", "  hostNetwork: true\n")),
    );
    assert!(!ok);
    assert!(
        err.contains("denied the request: pod host sets hostNetwork"),
        "{err}"
    );
}

/// Pins in the ToolConnection travel to the sidecar: `read_file` pinned as
/// the operator's status shows it is served; `delete_file`, pinned to
/// another definition, is withheld and its calls never reach the server;
/// the API server itself refuses a malformed pin. The pins are then taken
/// away again.
async fn tool_pins_reach_the_sidecar(kubectl: &Kubectl, agent: &Agent, url: &str, attempts: &Path) {
    let read = kubectl.get(
        "toolconnection/fs",
        "{.status.tools[?(@.name==\"read_file\")].schemaHash}",
    );
    assert!(read.starts_with("sha256:"), "{read}");
    let stale = format!("sha256:{}", "0".repeat(64));
    let pinned = format!(
        "{}  toolPins:\n    read_file: {{schemaHash: '{read}'}}\n    delete_file: {{schemaHash: '{stale}'}}\n",
        connection(url)
    );
    kubectl.apply(&pinned);
    let refused = eventually("the pins are enforced", || {
        let mut agent = clone_agent(agent);
        async move {
            let r = agent.call("fs_delete_file", json!({"path": "a"})).await;
            (error_code(&r) == Some(-32013)).then_some(r)
        }
    })
    .await;
    let reason = refused["error"]["data"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains(&stale), "{refused}");
    // (Calls made before the pins arrived reached it; from now on none does.)
    let before = deletes(attempts);
    let again = clone_agent(agent)
        .call("fs_delete_file", json!({"path": "a"}))
        .await;
    assert_eq!(error_code(&again), Some(-32013), "{again}");
    assert_eq!(
        deletes(attempts),
        before,
        "a withheld tool's call reached the server"
    );
    // The operator's own probe sees the same drift: a condition, an Event.
    let drifted = "{.status.conditions[?(@.type==\"ToolsDrifted\")]}";
    let condition = eventually("the ToolsDrifted condition", || {
        let kubectl = kubectl.clone();
        async move {
            let c = kubectl.get("toolconnection/fs", drifted);
            c.contains("\"status\":\"True\"").then_some(c)
        }
    })
    .await;
    assert!(
        condition.contains(&format!("delete_file: schema hash {stale} is now sha256:")),
        "{condition}"
    );
    assert!(!condition.contains("read_file"), "{condition}");
    let note =
        "ToolsDrifted ToolConnection/fs: withheld from agents until pinned again: delete_file";
    eventually("the ToolsDrifted Event", || {
        let kubectl = kubectl.clone();
        async move { events(&kubectl).contains(note).then_some(()) }
    })
    .await;
    lists(agent, "fs_read_file").await;
    let read = clone_agent(agent)
        .call("fs_read_file", json!({"path": "a"}))
        .await;
    assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");

    let malformed = pinned.replace(&stale, "sha256:ABC");
    let (ok, _, err) = kubectl.run(&["apply", "-f", "-"], Some(&malformed));
    assert!(
        !ok && err.contains("spec.toolPins.delete_file.schemaHash"),
        "{err}"
    );

    kubectl.apply(&connection(url));
    succeeds(
        agent,
        "the pins are taken away",
        "fs_delete_file",
        json!({"path": "a"}),
    )
    .await;
    kubectl.wait(
        "toolconnection/fs",
        "{.status.conditions[?(@.type==\"ToolsDrifted\")].reason}",
        "NotPinned",
    );
}

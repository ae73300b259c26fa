//! The chart for real, on a control plane of its own: `helm install`
//! (CRDs from the chart's crds/, the operator's RBAC, its webhooks reached
//! by the API server through the chart's Service), the roles it gives
//! people through the built-in aggregated `view`, `edit` and `admin` (read
//! every aip kind; decide nothing unless aip-approver is bound, or
//! aggregated into `admin` on purpose), `helm upgrade` with a changed value
//! (`rbac.approverAggregatesToAdmin=true`: namespace admins may decide, and
//! the webhooks keep their caBundle), and `helm uninstall`, which removes
//! the chart's objects and keeps the CRDs, everything people made with them
//! and the operator's own TLS Secret.

use aip_kube_test::User;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use kube::runtime::wait::await_condition;
use serde_json::Value;

use crate::common::Cluster;
use crate::common::kubectl::{Kubectl, tempdir};
use crate::support::*;

/// People and the built-in roles they hold: victor views everything; in
/// namespace agents bob edits and carol administers.
const PEOPLE: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: viewers-view}
subjects: [{kind: Group, name: viewers, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: view, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-edits, namespace: agents}
subjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: edit, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carol-administers, namespace: agents}
subjects: [{kind: User, name: carol, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: admin, apiGroup: rbac.authorization.k8s.io}
";

/// `kubectl auth can-i VERB RESOURCE [--subresource=S] -n agents` as the
/// user of `kubectl` (a SelfSubjectAccessReview with their own identity).
fn can(kubectl: &Kubectl, verb: &str, resource: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (resource, None),
    };
    let mut args = vec!["auth", "can-i", verb, resource, "-n", "agents"];
    let flag;
    if let Some(s) = subresource {
        flag = format!("--subresource={s}");
        args.push(&flag);
    }
    let (yes, out, err) = kubectl.run(&args, None);
    assert!(
        out.trim() == "yes" || out.trim() == "no",
        "kubectl {args:?}: {out}{err}"
    );
    yes
}

/// Waits until the aggregated ClusterRole `name` grants (or no longer
/// grants) `verb` on aip.io's `resource`: the controller manager fills
/// aggregated roles a moment after their parts change.
async fn aggregated(cluster: &Cluster, name: &str, verb: &str, resource: &str, grants: bool) {
    let roles: Api<ClusterRole> = Api::all(cluster.admin.clone());
    let (verb, resource) = (verb.to_owned(), resource.to_owned());
    let cond = move |role: Option<&ClusterRole>| {
        let rules = role.and_then(|r| r.rules.clone()).unwrap_or_default();
        let has = rules.iter().any(|rule| {
            rule.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g == "aip.io"))
                && rule
                    .resources
                    .as_ref()
                    .is_some_and(|r| r.contains(&resource))
                && rule.verbs.contains(&verb)
        });
        has == grants
    };
    tokio::time::timeout(PATIENCE, await_condition(roles, name, cond))
        .await
        .unwrap_or_else(|_| panic!("ClusterRole {name} never came to grant={grants}"))
        .unwrap();
}

fn release_status(helm: &Helm) -> (String, i64) {
    let status: Value = serde_json::from_str(&helm.ok(&[
        "status",
        "aip",
        "--namespace",
        "aip-system",
        "-o",
        "json",
    ]))
    .unwrap();
    (
        status["info"]["status"].as_str().unwrap().to_owned(),
        status["version"].as_i64().unwrap(),
    )
}

// kubectl and helm block a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_installs_upgrades_and_uninstalls_the_chart() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("helm_installs_upgrades_and_uninstalls_the_chart") {
        return;
    }
    let admin = cluster.kubectl(User::Admin, "agents");
    let (installed, operator) = Installed::start(&cluster, &admin, &dir).await;
    let helm = &installed.helm;
    assert_eq!(release_status(helm), ("deployed".to_owned(), 1));

    // Installed from the chart: the CRDs (crds/), the operator's identity,
    // and a Service that takes the API server to this host.
    for crd in ["agentpolicies", "toolconnections", "approvalrequests"] {
        admin.ok(
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.aip.io"),
                "--timeout=30s",
            ],
            None,
        );
    }
    let service = admin.ok(
        &[
            "get",
            "service",
            "aip-operator",
            "-n",
            "aip-system",
            "-o",
            "jsonpath={.spec.type} {.spec.externalName}",
        ],
        None,
    );
    assert_eq!(service, "ExternalName localhost");

    // People's objects, admitted by the operator's webhook.
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    admin.apply(&connection("https://mcp.example.com/mcp"));
    admin.apply(&policy(&["fs_read_file"]));
    let refused_policy = format!(
        "{}  tool_rules: [{{tool: fs_read_file, rate_limit: lots}}]\n",
        policy(&["fs_read_file"])
    );
    let (ok, _, err) = admin.run(&["apply", "-f", "-"], Some(&refused_policy));
    assert!(!ok && err.contains("invalid rate_limit \"lots\""), "{err}");

    // What the built-in roles give once the chart's roles are aggregated
    // into them: everyone reads, nobody decides.
    admin.apply(PEOPLE);
    for role in ["view", "edit", "admin"] {
        aggregated(&cluster, role, "list", "agentpolicies", true).await;
    }
    aggregated(&cluster, "admin", "patch", "approvalrequests/status", false).await;
    aggregated(&cluster, "admin", "patch", "toolconnections/status", false).await;
    let victor = cluster.kubectl(User::Victor, "agents");
    let bob = cluster.kubectl(User::Bob, "agents");
    let carol = cluster.kubectl(User::Carol, "agents");
    for (who, person) in [("victor", &victor), ("bob", &bob), ("carol", &carol)] {
        for resource in [
            "agentpolicies.aip.io",
            "toolconnections.aip.io",
            "approvalrequests.aip.io",
        ] {
            assert!(can(person, "list", resource), "{who} may list {resource}");
            assert!(can(person, "watch", resource), "{who} may watch {resource}");
        }
        assert!(
            can(person, "get", "agentpolicies.aip.io/status"),
            "{who} may read a policy's status"
        );
        assert!(
            !can(person, "patch", "approvalrequests.aip.io/status"),
            "{who} may not decide"
        );
        let listed = person.ok(&["get", "aip", "-n", "agents"], None);
        assert!(
            listed.contains("agentpolicy.aip.io/files")
                && listed.contains("toolconnection.aip.io/fs"),
            "{who}: {listed}"
        );
    }
    assert!(!can(&victor, "get", "secrets"), "view reads no Secret");

    // An upgrade with a changed value: admin now includes aip-approver.
    let said = helm.ok(&[
        "upgrade",
        "aip",
        CHART,
        "--namespace",
        "aip-system",
        "--reuse-values",
        "--set",
        "rbac.approverAggregatesToAdmin=true",
    ]);
    assert!(said.contains("has been upgraded"), "{said}");
    assert_eq!(release_status(helm), ("deployed".to_owned(), 2));
    let label = admin.ok(
        &[
            "get",
            "clusterrole",
            "aip-approver",
            "-o",
            "jsonpath={.metadata.labels.rbac\\.authorization\\.k8s\\.io/aggregate-to-admin}",
        ],
        None,
    );
    assert_eq!(label, "true");
    aggregated(&cluster, "admin", "patch", "approvalrequests/status", true).await;
    aggregated(&cluster, "admin", "patch", "toolconnections/status", true).await;
    assert!(
        can(&carol, "patch", "approvalrequests.aip.io/status"),
        "a namespace admin decides"
    );
    assert!(
        !can(&bob, "patch", "approvalrequests.aip.io/status"),
        "edit still decides nothing"
    );
    assert!(
        !can(&victor, "patch", "approvalrequests.aip.io/status"),
        "view still decides nothing"
    );
    // The upgrade left the operator's caBundle in place: the webhooks
    // still answer at once.
    let (ok, _, err) = admin.run(&["apply", "-f", "-"], Some(&refused_policy));
    assert!(!ok && err.contains("invalid rate_limit \"lots\""), "{err}");

    // Uninstalled: the chart's objects go; the CRDs and people's objects stay.
    let said = helm.ok(&["uninstall", "aip", "--namespace", "aip-system"]);
    assert!(said.contains("release \"aip\" uninstalled"), "{said}");
    drop(operator);
    for gone in [
        "clusterrole/aip-viewer",
        "clusterrole/aip-approver",
        "clusterrole/aip-operator",
        "clusterrolebinding/aip-operator",
        "validatingwebhookconfiguration/aip-operator",
        "mutatingwebhookconfiguration/aip-operator",
    ] {
        admin.ok(&["wait", "--for=delete", gone, "--timeout=30s"], None);
    }
    let (found, _, _) = admin.run(
        &["get", "service", "aip-operator", "-n", "aip-system"],
        None,
    );
    assert!(!found, "the Service went with the release");
    for kept in [
        "crd/agentpolicies.aip.io",
        "crd/toolconnections.aip.io",
        "crd/approvalrequests.aip.io",
    ] {
        admin.ok(&["get", kept], None);
    }
    // The operator made its TLS Secret, not Helm: it stays (a reinstall
    // serves the same CA).
    admin.ok(
        &["get", "secret", "aip-operator-tls", "-n", "aip-system"],
        None,
    );
    assert_eq!(
        admin.get("agentpolicy/files", "{.spec.allowed_tools[0]}"),
        "fs_read_file"
    );
    assert_eq!(
        admin.get("toolconnection/fs", "{.spec.url}"),
        "https://mcp.example.com/mcp"
    );
    // With the webhooks gone, nothing holds the API up, and the built-in
    // roles no longer mention aip.
    admin.apply(&policy(&["fs_read_file", "fs_list"]));
    aggregated(&cluster, "view", "list", "agentpolicies", false).await;
}

//! The validating webhook through the real kubectl and the fake API server,
//! with token-file users: an invalid AgentPolicy is refused at apply time
//! with aip-policy's field paths; a ToolConnection naming a Secret its author
//! cannot read is refused, one its author can read is admitted, and a
//! reference to another namespace is refused with the reason. Approval
//! decisions are guarded and stamped. Opted-in pods come back with their
//! gateway (once), others are untouched, and a hostNetwork pod is refused.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use aip_operator::metrics::Metrics;
use aip_operator::webhooks::inject::Injection;
use aip_operator::webhooks::{self, Webhooks};
use common::Cluster;
use common::kubectl::{Kubectl, tempdir, webhook_configuration};
use tokio_util::sync::CancellationToken;

const USERS: &str = "alice-token,alice,u-alice,\"platform\"\nbob-token,bob,u-bob,\"platform\"\n";

/// Everyone in `platform` edits aip objects in `agents`; only alice may read
/// the Secret `gh-token`.
const RBAC: &str = "apiVersion: v1
kind: Namespace
metadata: {name: agents}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: aip-editor, namespace: agents}
rules:
- {apiGroups: [aip.io], resources: [agentpolicies, toolconnections], verbs: [get, list, watch, create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: platform-edits-aip, namespace: agents}
subjects: [{kind: Group, name: platform, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: aip-editor, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: gh-token-reader, namespace: agents}
rules:
- {apiGroups: [''], resources: [secrets], resourceNames: [gh-token], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads-gh-token, namespace: agents}
subjects: [{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: gh-token-reader, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: v1
kind: Secret
metadata: {name: gh-token, namespace: agents}
stringData: {token: secret-value-1}
";

fn connection(secret_ref: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: gh, namespace: agents}}\nspec:\n  url: https://mcp.example.com/mcp\n  bearerToken: {{valueFrom: {{secretKeyRef: {secret_ref}}}}}\n"
    )
}

// kubectl blocks a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_apply_is_refused_with_the_reason() {
    let dir = tempdir();
    let cluster = Cluster::with_users(USERS).await;
    let admin = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, aip_fake_apiserver::ADMIN_TOKEN),
    };
    let alice = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, "alice-token"),
    };
    let bob = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, "bob-token"),
    };

    let (addr, cert_pem, _stop) = start_webhooks(&cluster).await;

    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/aip.io.yaml");
    admin.ok(&["apply", "-f", crds], None);
    admin.apply(RBAC);
    admin.apply(&webhook_configuration(
        "Validating",
        "validate",
        &format!("https://{addr}/validate"),
        &cert_pem,
        "agentpolicies, toolconnections",
    ));

    // An invalid policy: every problem, each with its path.
    let (ok, _, err) = alice.run(
        &["apply", "-f", "-"],
        Some("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p, namespace: agents}\nspec:\n  allowed_tools: [read_file]\n  tool_rules:\n  - {tool: x, rate_limit: lots, allow_args: {path: '('}}\n"),
    );
    assert!(!ok);
    assert!(
        err.contains("denied the request: AgentPolicy p is invalid: spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\""),
        "{err}"
    );
    assert!(err.contains("spec.tool_rules[0].allow_args.path"), "{err}");
    let (ok, out, _) = alice.run(&["get", "agentpolicy", "p", "-n", "agents"], None);
    assert!(!ok, "nothing was stored: {out}");
    alice.apply("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p, namespace: agents}\nspec:\n  allowed_tools: [read_file]\n");

    // bob cannot read gh-token, so he cannot point a connection at it.
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some(&connection("{name: gh-token, key: token}")),
    );
    assert!(!ok);
    assert!(
        err.contains("ToolConnection gh is refused: spec.bearerToken.valueFrom.secretKeyRef names Secret gh-token, which bob may not get in namespace agents"),
        "{err}"
    );
    assert!(!err.contains("secret-value-1"));

    // Nor can anyone reach into another namespace.
    let (ok, _, err) = alice.run(
        &["apply", "-f", "-"],
        Some(&connection(
            "{name: gh-token, key: token, namespace: kube-system}",
        )),
    );
    assert!(!ok);
    assert!(
        err.contains("spec.bearerToken.valueFrom.secretKeyRef.namespace: Secrets are read only from the ToolConnection's own namespace (agents), not kube-system"),
        "{err}"
    );

    // alice can, so her connection is admitted; bob may not even re-point it.
    alice.apply(&connection("{name: gh-token, key: token}"));
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some(
            &connection("{name: gh-token, key: token}")
                .replace("mcp.example.com", "bob.example.net"),
        ),
    );
    assert!(
        !ok,
        "an update by someone who cannot read the Secret is refused"
    );
    assert!(err.contains("which bob may not get"), "{err}");
}

const APPROVERS: &str = "alice-token,alice,u-alice,\"approvers\"\ncarol-token,carol,u-carol,\"\"\n";

/// alice, the pod's own service account and another service account of the
/// namespace may all patch approvalrequests/status as far as RBAC goes; the
/// webhook decides who really may.
const APPROVER_RBAC: &str = "apiVersion: v1
kind: Namespace
metadata: {name: agents}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: runner, namespace: agents}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: helper, namespace: agents}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: approver, namespace: agents}
rules:
- {apiGroups: [aip.io], resources: [approvalrequests], verbs: [get, list, watch]}
- {apiGroups: [aip.io], resources: [approvalrequests/status], verbs: [get, patch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: approvers, namespace: agents}
subjects:
- {kind: Group, name: approvers, apiGroup: rbac.authorization.k8s.io}
- {kind: ServiceAccount, name: runner, namespace: agents}
- {kind: ServiceAccount, name: helper, namespace: agents}
roleRef: {kind: Role, name: approver, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {name: p, namespace: agents}
spec:
  tool_rules: [{tool: fs_write, action: ask}]
";

fn request(name: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: ApprovalRequest\nmetadata: {{name: {name}, namespace: agents}}\nspec:\n  policy: p\n  pod: agent-1\n  podUid: u1\n  serviceAccount: runner\n  connection: fs\n  tool: fs_write\n  arguments: '{{}}'\n  argumentsHash: sha256:00\n  expiresAt: '2099-01-01T00:00:00Z'\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_right_people_decide_and_a_decision_is_final() {
    let dir = tempdir();
    let cluster = Cluster::with_users(APPROVERS).await;
    let admin = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, aip_fake_apiserver::ADMIN_TOKEN),
    };
    let (addr, cert_pem, _stop) = start_webhooks(&cluster).await;
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/aip.io.yaml");
    admin.ok(&["apply", "-f", crds], None);
    admin.apply(APPROVER_RBAC);
    let resources = "approvalrequests, approvalrequests/status";
    for (kind, name, path) in [
        ("Mutating", "stamp", "mutate"),
        ("Validating", "guard", "validate"),
    ] {
        let url = format!("https://{addr}/{path}");
        admin.apply(&webhook_configuration(
            kind, name, &url, &cert_pem, resources,
        ));
    }
    let alice = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, "alice-token"),
    };
    let carol = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, "carol-token"),
    };
    let sa = |name: &'static str| {
        let cluster = &cluster;
        let dir = &dir;
        async move {
            let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
                kube::Api::namespaced(cluster.admin.clone(), "agents");
            let request: k8s_openapi::api::authentication::v1::TokenRequest =
                serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 3600}}))
                    .unwrap();
            let token = accounts
                .create_token_request(name, &Default::default(), &request)
                .await
                .unwrap()
                .status
                .unwrap()
                .token
                .unwrap();
            Kubectl {
                kubeconfig: cluster.kubeconfig(dir, &token),
            }
        }
    };
    let runner = sa("runner").await;
    let helper = sa("helper").await;

    // Only the operator creates requests.
    let (ok, _, err) = alice.run(&["apply", "-f", "-"], Some(&request("forged")));
    assert!(!ok);
    admin.apply(&request("r1"));
    admin.apply(&request("r2"));

    let (ok, out) = runner.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains("system:serviceaccount:agents:runner is the asking pod's own service account"),
        "{out}"
    );
    let (ok, out) = helper.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(out.contains("it may decide only if AgentPolicy p lists helper in spec.approval.allowedServiceAccounts"), "{out}");
    let (ok, out) = admin.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains("the operator (admin) may only set Expired or Withdrawn, not Approved"),
        "{out}"
    );
    let (ok, out) = carol.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains("Forbidden") || out.contains("forbidden"),
        "{out}"
    );

    let (ok, out) = alice.decide("r1", "Approved", "");
    assert!(ok, "{out}");
    assert_eq!(
        admin.get("approvalrequest/r1", "{.status.decidedBy}"),
        "alice"
    );
    assert!(
        !admin
            .get("approvalrequest/r1", "{.status.decidedAt}")
            .is_empty()
    );
    let (ok, out) = alice.decide("r1", "Denied", "");
    assert!(!ok);
    assert!(
        out.contains("was already decided (Approved by alice); a decision is final"),
        "{out}"
    );

    // The operator may withdraw; the spec never changes.
    let (ok, out) = admin.decide("r2", "Withdrawn", "");
    assert!(ok, "{out}");
    let (ok, _, err2) = admin.run(
        &["apply", "-f", "-"],
        Some(&request("r2").replace("fs_write", "fs_delete")),
    );
    assert!(!ok);
    assert!(
        err2.contains("the spec of an ApprovalRequest cannot change"),
        "{err2}"
    );
    // RBAC stops alice before the webhook would (it refuses creates by anyone
    // but the operator too).
    assert!(
        err.contains("cannot create resource \"approvalrequests\""),
        "{err}"
    );
}

/// How the chart registers injection: pods of namespaces labelled
/// `aip.io/inject: enabled` (unless the pod says disabled), and pods
/// labelled so anywhere else.
fn injection_webhooks(url: &str, ca_pem: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let hook = |name: &str, namespaces: &str, objects: &str| {
        format!(
            "  - name: {name}
    clientConfig: {{url: '{url}', caBundle: {ca}}}
    rules: [{{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [pods], scope: Namespaced}}]
    namespaceSelector: {namespaces}
    objectSelector: {objects}
    sideEffects: None
    admissionReviewVersions: [v1]
    failurePolicy: Fail
    reinvocationPolicy: IfNeeded
"
        )
    };
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: aip-inject}}\nwebhooks:\n{}{}",
        hook(
            "namespaces.inject.aip.io",
            "{matchLabels: {aip.io/inject: enabled}}",
            "{matchExpressions: [{key: aip.io/inject, operator: NotIn, values: [disabled]}]}"
        ),
        hook(
            "pods.inject.aip.io",
            "{matchExpressions: [{key: aip.io/inject, operator: NotIn, values: [enabled]}]}",
            "{matchLabels: {aip.io/inject: enabled}}"
        ),
    )
}

fn agent_pod(namespace: &str, name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}{extra}}}\nspec:\n  containers: [{{name: agent, image: agent}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opted_in_pods_come_back_with_their_gateway() {
    let dir = tempdir();
    let cluster = Cluster::start().await;
    let admin = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, aip_fake_apiserver::ADMIN_TOKEN),
    };
    let (addr, cert_pem, _stop) = start_webhooks(&cluster).await;
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents, labels: {aip.io/inject: enabled}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n");
    admin.apply(&injection_webhooks(
        &format!("https://{addr}/inject"),
        &cert_pem,
    ));
    let get = |ns: &str, pod: &str| -> serde_json::Value {
        let out = admin.ok(&["get", "pod", pod, "-n", ns, "-o", "json"], None);
        serde_json::from_str(&out).unwrap()
    };
    let sidecars = |pod: &serde_json::Value| {
        pod["spec"]["initContainers"].as_array().map_or(0, |c| {
            c.iter().filter(|c| c["name"] == "aip-sidecar").count()
        })
    };

    admin.apply(&agent_pod("agents", "agent-1", ""));
    let pod = get("agents", "agent-1");
    assert_eq!(sidecars(&pod), 1, "{pod}");
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(sidecar["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(sidecar["volumeMounts"][0]["name"], "aip-token");
    let agent = &pod["spec"]["containers"][0];
    assert!(
        agent["volumeMounts"]
            .as_array()
            .is_none_or(|m| m.iter().all(|m| m["name"] != "aip-token")),
        "{agent}"
    );
    assert_eq!(agent["env"][0]["name"], "AIP_MCP_URL");
    assert_eq!(agent["env"][0]["value"], "http://127.0.0.1:15001/mcp");
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "aip-token")
        .unwrap();
    assert_eq!(
        volume["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "aip.io/sidecar"
    );
    assert_eq!(pod["metadata"]["annotations"]["aip.io/sidecar"], "injected");

    // The injected pod admitted again (say, recreated from its own YAML)
    // still has one gateway.
    let mut again = pod.clone();
    again["metadata"] = serde_json::json!({"name": "agent-2", "namespace": "agents", "annotations": pod["metadata"]["annotations"]});
    admin.apply(&again.to_string());
    assert_eq!(sidecars(&get("agents", "agent-2")), 1);

    // Not opted in: untouched; a pod's own label opts it in anywhere.
    admin.apply(&agent_pod("other", "plain", ""));
    assert_eq!(sidecars(&get("other", "plain")), 0);
    admin.apply(&agent_pod(
        "other",
        "labelled",
        ", labels: {aip.io/inject: enabled}",
    ));
    assert_eq!(sidecars(&get("other", "labelled")), 1);
    admin.apply(&agent_pod(
        "agents",
        "opted-out",
        ", labels: {aip.io/inject: disabled}",
    ));
    assert_eq!(sidecars(&get("agents", "opted-out")), 0);

    // Sharing the node's network is refused, and kubectl says why.
    let (ok, _, err) = admin.run(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: host, namespace: agents}\nspec:\n  hostNetwork: true\n  containers: [{name: agent, image: agent}]\n"),
    );
    assert!(!ok);
    assert!(
        err.contains("denied the request: pod host sets hostNetwork"),
        "{err}"
    );
}

/// The operator's webhook server in this process, with a certificate for
/// 127.0.0.1, acting as if the operator were the bootstrap administrator;
/// its address and certificate, and a guard that stops it.
async fn start_webhooks(
    cluster: &Cluster,
) -> (std::net::SocketAddr, String, tokio_util::sync::DropGuard) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let tls = webhooks::tls_config(&cert.pem(), &key.serialize_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let hooks = Arc::new(Webhooks {
        client: cluster.admin.clone(),
        metrics: Arc::new(Metrics::new()),
        operator: "admin".to_owned(),
        injection: Some(Injection::new(
            "aip-sidecar:test",
            "https://aip-operator.aip-system.svc:8443",
            &cert.pem(),
        )),
    });
    tokio::spawn(webhooks::serve(hooks, listener, tls, shutdown.clone()));
    (addr, cert.pem(), shutdown.drop_guard())
}

/// Two replicas starting at once make one certificate between them, and
/// its CA lands in every webhook's caBundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_makes_one_certificate_and_fills_the_ca_bundles() {
    use aip_operator::certs;
    let dir = tempdir();
    let cluster = Cluster::start().await;
    let admin = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, aip_fake_apiserver::ADMIN_TOKEN),
    };
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: aip-system}\n");
    let unset = |kind: &str, name: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}WebhookConfiguration\nmetadata: {{name: {name}}}\nwebhooks:\n{}",
            ["a", "b"]
                .map(|w| format!("  - name: {w}.{name}.aip.io\n    clientConfig: {{url: 'https://127.0.0.1:1/x'}}\n    rules: [{{operations: [CREATE], apiGroups: [aip.io], apiVersions: [v1alpha1], resources: [toolconnections]}}]\n    sideEffects: None\n    admissionReviewVersions: [v1]\n    failurePolicy: Ignore\n"))
                .join("")
        )
    };
    admin.apply(&unset("Mutating", "aip-mutate"));
    admin.apply(&unset("Validating", "aip-validate"));

    let names = ["aip-operator.aip-system.svc".to_owned()];
    let (one, two) = tokio::join!(
        certs::ensure(&cluster.admin, "aip-system", "aip-tls", &names),
        certs::ensure(&cluster.admin, "aip-system", "aip-tls", &names),
    );
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_eq!(one.tls.cert_pem, two.tls.cert_pem, "one certificate");
    assert_eq!(one.ca_pem, two.ca_pem);
    let again = certs::ensure(&cluster.admin, "aip-system", "aip-tls", &names)
        .await
        .unwrap();
    assert_eq!(again.tls.cert_pem, one.tls.cert_pem, "kept across restarts");
    assert_eq!(
        admin.ok(
            &[
                "get",
                "secret",
                "aip-tls",
                "-n",
                "aip-system",
                "-o",
                "jsonpath={.type}"
            ],
            None
        ),
        "kubernetes.io/tls"
    );

    certs::patch_ca_bundles(
        &cluster.admin,
        &one.ca_pem,
        &["aip-mutate".to_owned()],
        &["aip-validate".to_owned()],
    )
    .await
    .unwrap();
    use base64::Engine;
    for object in [
        "mutatingwebhookconfiguration/aip-mutate",
        "validatingwebhookconfiguration/aip-validate",
    ] {
        let bundles = admin.ok(
            &[
                "get",
                object,
                "-o",
                "jsonpath={.webhooks[*].clientConfig.caBundle}",
            ],
            None,
        );
        let bundles: Vec<&str> = bundles.split_whitespace().collect();
        assert_eq!(bundles.len(), 2, "{object}");
        for b in bundles {
            let pem = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
            assert_eq!(String::from_utf8(pem).unwrap(), one.ca_pem, "{object}");
        }
    }
}

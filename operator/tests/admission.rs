//! The operator's webhooks called by the genuine kube-apiserver (by URL,
//! trusting a caBundle), through the real kubectl, as the control plane's
//! static-token users: an invalid AgentPolicy is refused at apply time with
//! aip-policy's field paths; a ToolConnection naming a Secret its author
//! cannot read is refused, one its author can read is admitted, and a
//! reference to another namespace is refused with the reason. Approval
//! decisions are guarded and stamped. Opted-in pods come back with their
//! gateway (once), others are untouched, a strategic-merge patch of an
//! injected pod keeps its gateway, and a hostNetwork pod is refused. Each
//! test has its own namespaces on the binary's control plane, and its
//! webhook configurations match only those.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use aip_kube_test::User;
use aip_operator::metrics::Metrics;
use aip_operator::webhooks::inject::Injection;
use aip_operator::webhooks::{self, Webhooks};
use common::Cluster;
use common::kubectl::{tempdir, webhook_configuration};
use tokio_util::sync::CancellationToken;

/// alice and everyone in `platform` (bob) edit aip objects in the
/// namespace; only alice may read the Secret `gh-token`.
const RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: aip-editor, namespace: agents}
rules:
- {apiGroups: [aip.io], resources: [agentpolicies, toolconnections], verbs: [get, list, watch, create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: platform-edits-aip, namespace: agents}
subjects:
- {kind: Group, name: platform, apiGroup: rbac.authorization.k8s.io}
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
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

fn connection(ns: &str, secret_ref: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: gh, namespace: {ns}}}\nspec:\n  url: https://mcp.example.com/mcp\n  bearerToken: {{valueFrom: {{secretKeyRef: {secret_ref}}}}}\n"
    )
}

/// `yaml` with every `namespace: agents` in namespace `ns`.
fn in_ns(yaml: &str, ns: &str) -> String {
    yaml.replace("namespace: agents", &format!("namespace: {ns}"))
}

// kubectl blocks a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_apply_is_refused_with_the_reason() {
    let cluster = Cluster::shared().await;
    if !cluster.calls_back_here("kubectl_apply_is_refused_with_the_reason") {
        return;
    }
    common::install_crds(&cluster.admin).await;
    let ns = cluster.fresh_namespace("validate").await;
    let admin = cluster.kubectl(User::Admin, &ns);
    let alice = cluster.kubectl(User::Alice, &ns);
    let bob = cluster.kubectl(User::Bob, &ns);

    let hooks = start_webhooks(&cluster).await;
    admin.apply(&in_ns(RBAC, &ns));
    let configuration = format!("{ns}-validate");
    admin.apply(&webhook_configuration(
        "Validating",
        &configuration,
        &format!("https://{}/validate", hooks.addr),
        &hooks.cert_pem,
        "agentpolicies, toolconnections",
        &[&ns],
    ));

    // An invalid policy: every problem, each with its path.
    let (ok, _, err) = alice.run(
        &["apply", "-f", "-"],
        Some(&format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: p, namespace: {ns}}}\nspec:\n  allowed_tools: [read_file]\n  tool_rules:\n  - {{tool: x, rate_limit: lots, allow_args: {{path: '('}}}}\n")),
    );
    assert!(!ok);
    assert!(
        err.contains(&format!("admission webhook \"{configuration}.aip.io\" denied the request: AgentPolicy p is invalid: spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\"")),
        "{err}"
    );
    assert!(err.contains("spec.tool_rules[0].allow_args.path"), "{err}");
    let (ok, out, _) = alice.run(&["get", "agentpolicy", "p", "-n", &ns], None);
    assert!(!ok, "nothing was stored: {out}");
    alice.apply(&format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: p, namespace: {ns}}}\nspec:\n  allowed_tools: [read_file]\n"));

    // bob cannot read gh-token, so he cannot point a connection at it.
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some(&connection(&ns, "{name: gh-token, key: token}")),
    );
    assert!(!ok);
    assert!(
        err.contains(&format!("ToolConnection gh is refused: spec.bearerToken.valueFrom.secretKeyRef names Secret gh-token, which bob may not get in namespace {ns}")),
        "{err}"
    );
    assert!(!err.contains("secret-value-1"));

    // Nor can anyone reach into another namespace.
    let (ok, _, err) = alice.run(
        &["apply", "-f", "-"],
        Some(&connection(
            &ns,
            "{name: gh-token, key: token, namespace: kube-system}",
        )),
    );
    assert!(!ok);
    assert!(
        err.contains(&format!("spec.bearerToken.valueFrom.secretKeyRef.namespace: Secrets are read only from the ToolConnection's own namespace ({ns}), not kube-system")),
        "{err}"
    );

    // alice can, so her connection is admitted; bob may not even re-point it.
    alice.apply(&connection(&ns, "{name: gh-token, key: token}"));
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some(
            &connection(&ns, "{name: gh-token, key: token}")
                .replace("mcp.example.com", "bob.example.net"),
        ),
    );
    assert!(
        !ok,
        "an update by someone who cannot read the Secret is refused"
    );
    assert!(err.contains("which bob may not get"), "{err}");
    admin.ok(
        &["delete", "validatingwebhookconfiguration", &configuration],
        None,
    );
}

/// alice (group approvers), the pod's own service account and another
/// service account of the namespace may all patch approvalrequests/status
/// as far as RBAC goes; the webhook decides who really may.
const APPROVER_RBAC: &str = "apiVersion: v1
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

fn request(ns: &str, name: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: ApprovalRequest\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  policy: p\n  pod: agent-1\n  podUid: u1\n  serviceAccount: runner\n  connection: fs\n  tool: fs_write\n  arguments: '{{}}'\n  argumentsHash: sha256:00\n  expiresAt: '2099-01-01T00:00:00Z'\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_right_people_decide_and_a_decision_is_final() {
    let dir = tempdir();
    let cluster = Cluster::shared().await;
    if !cluster.calls_back_here("only_the_right_people_decide_and_a_decision_is_final") {
        return;
    }
    common::install_crds(&cluster.admin).await;
    let ns = cluster.fresh_namespace("decide").await;
    let admin = cluster.kubectl(User::Admin, &ns);
    let hooks = start_webhooks(&cluster).await;
    admin.apply(&in_ns(APPROVER_RBAC, &ns));
    let resources = "approvalrequests, approvalrequests/status";
    let mut configurations = Vec::new();
    for (kind, name, path) in [
        ("Mutating", "stamp", "mutate"),
        ("Validating", "guard", "validate"),
    ] {
        let url = format!("https://{}/{path}", hooks.addr);
        let name = format!("{ns}-{name}");
        admin.apply(&webhook_configuration(
            kind,
            &name,
            &url,
            &hooks.cert_pem,
            resources,
            &[&ns],
        ));
        configurations.push((kind, name));
    }
    let alice = cluster.kubectl(User::Alice, &ns);
    let carol = cluster.kubectl(User::Carol, &ns);
    let sa = |name: &'static str| {
        let (cluster, dir, ns) = (&cluster, &dir, &ns);
        async move {
            let token = cluster.account_token(ns, name).await;
            common::kubectl::Kubectl {
                kubeconfig: cluster.kubeconfig(dir, &token),
                namespace: ns.clone(),
            }
        }
    };
    let runner = sa("runner").await;
    let helper = sa("helper").await;

    // Only the operator creates requests.
    let (ok, _, err) = alice.run(&["apply", "-f", "-"], Some(&request(&ns, "forged")));
    assert!(!ok);
    admin.apply(&request(&ns, "r1"));
    admin.apply(&request(&ns, "r2"));

    let (ok, out) = runner.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains(&format!(
            "system:serviceaccount:{ns}:runner is the asking pod's own service account"
        )),
        "{out}"
    );
    let (ok, out) = helper.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(out.contains("it may decide only if AgentPolicy p lists helper in spec.approval.allowedServiceAccounts"), "{out}");
    let (ok, out) = admin.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains(&format!(
            "the operator ({}) may only set Expired or Withdrawn, not Approved",
            hooks.operator
        )),
        "{out}"
    );
    let (ok, out) = carol.decide("r1", "Approved", "");
    assert!(!ok);
    assert!(
        out.contains(&format!("User \"carol\" cannot get resource \"approvalrequests/status\" in API group \"aip.io\" in the namespace \"{ns}\"")),
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

    // The operator may withdraw; the spec never changes. The CRD's CEL
    // rule refuses a changed spec before any webhook is asked (the
    // webhook's own refusal, "the spec of an ApprovalRequest cannot
    // change", is the second line of defence).
    let (ok, out) = admin.decide("r2", "Withdrawn", "");
    assert!(ok, "{out}");
    let (ok, _, err2) = admin.run(
        &["apply", "-f", "-"],
        Some(&request(&ns, "r2").replace("fs_write", "fs_delete")),
    );
    assert!(!ok);
    assert!(
        err2.contains(
            "The ApprovalRequest \"r2\" is invalid: spec: Invalid value: spec is immutable"
        ),
        "{err2}"
    );
    // RBAC stops alice before the webhook would (it refuses creates by anyone
    // but the operator too).
    assert!(
        err.contains("cannot create resource \"approvalrequests\""),
        "{err}"
    );
    for (kind, name) in configurations {
        let kind = format!("{}webhookconfiguration", kind.to_lowercase());
        admin.ok(&["delete", &kind, &name], None);
    }
}

/// How the chart registers injection: pods of namespaces labelled
/// `aip.io/inject: enabled` (unless the pod says disabled), and pods
/// labelled so anywhere else; here only in the test's `namespaces`.
fn injection_webhooks(name: &str, url: &str, ca_pem: &str, namespaces: &[&str]) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let only = format!(
        "{{key: kubernetes.io/metadata.name, operator: In, values: {}}}",
        serde_json::json!(namespaces)
    );
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
    reinvocationPolicy: Never
"
        )
    };
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: {name}}}\nwebhooks:\n{}{}",
        hook(
            "namespaces.inject.aip.io",
            &format!("{{matchLabels: {{aip.io/inject: enabled}}, matchExpressions: [{only}]}}"),
            "{matchExpressions: [{key: aip.io/inject, operator: NotIn, values: [disabled]}]}"
        ),
        hook(
            "pods.inject.aip.io",
            &format!(
                "{{matchExpressions: [{{key: aip.io/inject, operator: NotIn, values: [enabled]}}, {only}]}}"
            ),
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
    let cluster = Cluster::shared().await;
    if !cluster.calls_back_here("opted_in_pods_come_back_with_their_gateway") {
        return;
    }
    let agents = cluster.fresh_namespace("inject").await;
    let other = cluster.fresh_namespace("plain").await;
    let admin = cluster.kubectl(User::Admin, &agents);
    let hooks = start_webhooks(&cluster).await;
    admin.ok(
        &["label", "namespace", &agents, "aip.io/inject=enabled"],
        None,
    );
    let configuration = format!("{agents}-inject");
    admin.apply(&injection_webhooks(
        &configuration,
        &format!("https://{}/inject", hooks.addr),
        &hooks.cert_pem,
        &[&agents, &other],
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

    admin.apply(&agent_pod(&agents, "agent-1", ""));
    let pod = get(&agents, "agent-1");
    assert_eq!(sidecars(&pod), 1, "{pod}");
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["startupProbe"]["httpGet"]["path"], "/readyz");
    // The admin routes stay on the pod's loopback; the kubelet's probes
    // (and scrapers) get the listener on the pod's IP that serves only
    // health and metrics, as the API server stored it.
    let args: Vec<&str> = sidecar["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let value_of = |flag: &str| {
        let at = args.iter().position(|a| *a == flag)?;
        args.get(at + 1).copied()
    };
    assert_eq!(value_of("--admin"), Some("127.0.0.1:15021"), "{args:?}");
    assert_eq!(value_of("--metrics-listen"), Some("0.0.0.0:15020"));
    assert_eq!(sidecar["startupProbe"]["httpGet"]["port"], 15020);
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["port"], 15020);
    assert_eq!(
        sidecar["ports"],
        serde_json::json!([{"name": "aip-metrics", "containerPort": 15020, "protocol": "TCP"}])
    );
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
    again["metadata"] = serde_json::json!({"name": "agent-2", "namespace": agents, "annotations": pod["metadata"]["annotations"]});
    admin.apply(&again.to_string());
    assert_eq!(sidecars(&get(&agents, "agent-2")), 1);

    // A strategic-merge patch (what `kubectl patch` sends by default)
    // merges containers by name: the agent's new image leaves the gateway
    // and the agent's AIP_MCP_URL where they were.
    admin.ok(
        &[
            "patch",
            "pod",
            "agent-1",
            "-n",
            &agents,
            "-p",
            r#"{"metadata":{"labels":{"team":"research"}},"spec":{"containers":[{"name":"agent","image":"agent:v2"}]}}"#,
        ],
        None,
    );
    let patched = get(&agents, "agent-1");
    assert_eq!(sidecars(&patched), 1, "{patched}");
    assert_eq!(patched["spec"]["containers"][0]["image"], "agent:v2");
    assert_eq!(
        patched["spec"]["containers"][0]["env"],
        pod["spec"]["containers"][0]["env"]
    );
    assert_eq!(
        patched["spec"]["initContainers"],
        pod["spec"]["initContainers"]
    );
    assert_eq!(patched["metadata"]["labels"]["team"], "research");

    // Not opted in: untouched; a pod's own label opts it in anywhere.
    admin.apply(&agent_pod(&other, "plain", ""));
    assert_eq!(sidecars(&get(&other, "plain")), 0);
    admin.apply(&agent_pod(
        &other,
        "labelled",
        ", labels: {aip.io/inject: enabled}",
    ));
    assert_eq!(sidecars(&get(&other, "labelled")), 1);
    admin.apply(&agent_pod(
        &agents,
        "opted-out",
        ", labels: {aip.io/inject: disabled}",
    ));
    assert_eq!(sidecars(&get(&agents, "opted-out")), 0);

    // Sharing the node's network is refused, and kubectl says why.
    let (ok, _, err) = admin.run(
        &["apply", "-f", "-"],
        Some(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: host, namespace: {agents}}}\nspec:\n  hostNetwork: true\n  containers: [{{name: agent, image: agent}}]\n")),
    );
    assert!(!ok);
    assert!(
        err.contains("admission webhook \"namespaces.inject.aip.io\" denied the request: pod host sets hostNetwork"),
        "{err}"
    );
    admin.ok(
        &["delete", "mutatingwebhookconfiguration", &configuration],
        None,
    );
}

/// The injection webhooks' failurePolicy is Fail, so while no operator
/// answers, the API server refuses pods that would be governed (rather
/// than run them without a gateway) and says which webhook it could not
/// call; pods nobody opted in are created as ever. What the quickstart
/// says about an operator that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_operator_answering_governed_pods_are_refused_and_others_are_not() {
    let cluster = Cluster::shared().await;
    let agents = cluster.fresh_namespace("down").await;
    let other = cluster.fresh_namespace("down-plain").await;
    let admin = cluster.kubectl(User::Admin, &agents);
    admin.ok(
        &["label", "namespace", &agents, "aip.io/inject=enabled"],
        None,
    );
    // Nothing listens on port 1: every call is refused at once.
    let configuration = format!("{agents}-inject");
    admin.apply(&injection_webhooks(
        &configuration,
        "https://127.0.0.1:1/inject",
        &rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .cert
            .pem(),
        &[&agents, &other],
    ));
    for (ns, extra, hook) in [
        (&agents, "", "namespaces.inject.aip.io"),
        (
            &other,
            ", labels: {aip.io/inject: enabled}",
            "pods.inject.aip.io",
        ),
    ] {
        let (ok, _, err) = admin.run(&["apply", "-f", "-"], Some(&agent_pod(ns, "agent", extra)));
        assert!(!ok, "a governed pod was created without its gateway");
        assert!(
            err.contains(&format!("failed calling webhook \"{hook}\"")),
            "{err}"
        );
        let (found, _, _) = admin.run(&["get", "pod", "agent", "-n", ns], None);
        assert!(!found, "{ns}/agent exists");
    }
    admin.apply(&agent_pod(&other, "plain", ""));
    admin.ok(
        &["delete", "mutatingwebhookconfiguration", &configuration],
        None,
    );
}

/// The operator's webhook server, in this process.
struct Hooks {
    addr: std::net::SocketAddr,
    cert_pem: String,
    /// The identity it takes for the operator's: the administrator's.
    operator: String,
    _stop: tokio_util::sync::DropGuard,
}

/// The operator's webhook server in this process, with a certificate for
/// 127.0.0.1, acting as if the operator were the administrator.
async fn start_webhooks(cluster: &Cluster) -> Hooks {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let tls = webhooks::tls_config(&cert.pem(), &key.serialize_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let operator = cluster.admin_name().await;
    let hooks = Arc::new(Webhooks {
        index: None,
        client: cluster.admin.clone(),
        metrics: Arc::new(Metrics::new()),
        operator: operator.clone(),
        injection: Some(Injection::new(
            "aip-sidecar:test",
            "https://aip-operator.aip-system.svc:8443",
            &cert.pem(),
        )),
    });
    tokio::spawn(webhooks::serve(hooks, listener, tls, shutdown.clone()));
    Hooks {
        addr,
        cert_pem: cert.pem(),
        operator,
        _stop: shutdown.drop_guard(),
    }
}

/// Two replicas starting at once make one certificate between them, and
/// its CA lands in every webhook's caBundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_makes_one_certificate_and_fills_the_ca_bundles() {
    use aip_operator::certs;
    let cluster = Cluster::shared().await;
    let ns = cluster.fresh_namespace("certs").await;
    let admin = cluster.kubectl(User::Admin, &ns);
    let (mutating, validating) = (format!("{ns}-mutate"), format!("{ns}-validate"));
    let unset = |kind: &str, name: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}WebhookConfiguration\nmetadata: {{name: {name}}}\nwebhooks:\n{}",
            ["a", "b"]
                .map(|w| format!("  - name: {w}.{name}.aip.io\n    clientConfig: {{url: 'https://127.0.0.1:1/x'}}\n    rules: [{{operations: [CREATE], apiGroups: [aip.io], apiVersions: [v1alpha1], resources: [toolconnections]}}]\n    namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n    sideEffects: None\n    admissionReviewVersions: [v1]\n    failurePolicy: Ignore\n"))
                .join("")
        )
    };
    admin.apply(&unset("Mutating", &mutating));
    admin.apply(&unset("Validating", &validating));

    let names = [format!("aip-operator.{ns}.svc")];
    let (one, two) = tokio::join!(
        certs::ensure(&cluster.admin, &ns, "aip-tls", &names),
        certs::ensure(&cluster.admin, &ns, "aip-tls", &names),
    );
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_eq!(one.tls.cert_pem, two.tls.cert_pem, "one certificate");
    assert_eq!(one.ca_pem, two.ca_pem);
    let again = certs::ensure(&cluster.admin, &ns, "aip-tls", &names)
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
                &ns,
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
        std::slice::from_ref(&mutating),
        std::slice::from_ref(&validating),
    )
    .await
    .unwrap();
    use base64::Engine;
    for object in [
        format!("mutatingwebhookconfiguration/{mutating}"),
        format!("validatingwebhookconfiguration/{validating}"),
    ] {
        let bundles = admin.ok(
            &[
                "get",
                &object,
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
        admin.ok(&["delete", &object], None);
    }
}

/// The webhook listener is bounded like the sidecar's: reviews declaring
/// the largest size reserve room in a memory budget before their bodies are
/// read, so past the budget a review waits and is then answered 503 with
/// Retry-After (its connection closed); a body that never arrives is given
/// up after its deadline, which frees the room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reviews_past_the_memory_budget_wait_then_get_503_and_stalled_bodies_time_out() {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::shared().await;
    let hooks = start_webhooks(&cluster).await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(hooks.cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    // Headers declaring 3 MiB, and no body: each holds 12 MiB of the 64.
    let stalled = || {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(hooks.addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            tls.write_all(b"POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 3145728\r\n\r\n{")
                .await
                .unwrap();
            tls
        }
    };
    let answer = |mut tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>| async move {
        let mut text = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut text)).await;
        String::from_utf8_lossy(&text).into_owned()
    };
    let started = std::time::Instant::now();
    let mut holders = Vec::new();
    for _ in 0..5 {
        holders.push(stalled().await);
    }
    let refused = answer(stalled().await).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "it waited for room first"
    );
    let mut timed_out = Vec::new();
    for holder in holders {
        timed_out.push(answer(holder).await);
    }
    for text in &timed_out {
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
    // The room is back: a real review is decided.
    let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","userInfo":{"username":"x"},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}}}"#;
    let mut tls = stalled_free(&connector, hooks.addr).await;
    tls.write_all(format!("POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).as_bytes())
        .await
        .unwrap();
    let decided = answer(tls).await;
    assert!(decided.starts_with("HTTP/1.1 200"), "{decided}");
}

async fn stalled_free(
    connector: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

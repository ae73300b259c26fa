//! The CRDs as the genuine kube-apiserver takes them (aip-kube-test; any
//! cluster with `AIP_TEST_KUBECONFIG`): each is a structural schema,
//! accepted without a warning; each CEL rule (`x-kubernetes-validations`)
//! refuses what it forbids with its own message, one test per rule; the
//! OpenAPI validations refuse with the API server's wording, defaults are
//! filled and unknown fields refused or pruned; `kubectl explain` shows
//! every documented field and `kubectl get` the printer columns.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aip_kube_test::{User, fresh_namespace, shared};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};

const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/aip.io.yaml");

/// kubectl on PATH (target/bin, `make kubectl`) as the administrator.
fn kubectl(args: &[&str]) -> (bool, String) {
    let kubeconfig: PathBuf = SHARED_KUBECONFIG.get().cloned().unwrap();
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl on PATH (make kubectl puts one in target/bin)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

static SHARED_KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
/// What `kubectl apply --server-side -f crds/aip.io.yaml` said, the first
/// time a test of this binary asked for the CRDs.
static INSTALLED: OnceLock<String> = OnceLock::new();

/// The CRDs on the test binary's control plane, each Established; what
/// installing them said.
async fn crds() -> &'static str {
    let plane = shared().await;
    SHARED_KUBECONFIG.get_or_init(|| plane.kubeconfig_file(User::Admin));
    let said = tokio::task::spawn_blocking(|| {
        INSTALLED
            .get_or_init(|| {
                let (ok, said) = kubectl(&[
                    "apply",
                    "--server-side",
                    "--field-manager=aip-api-tests",
                    "-f",
                    CRDS,
                ]);
                assert!(ok, "the API server refused the CRDs:\n{said}");
                said
            })
            .as_str()
    })
    .await
    .unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(plane.client(User::Admin).await);
    for crd in aip_api::crds() {
        let name = crd.metadata.name.unwrap();
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .unwrap_or_else(|_| panic!("{name} never became Established"))
            .unwrap();
    }
    said
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("aip.io", "v1alpha1", kind))
}

/// `kind` in namespace `ns`, as the administrator.
async fn api(kind: &str, ns: &str) -> Api<DynamicObject> {
    let client = shared().await.client(User::Admin).await;
    Api::namespaced_with(client, ns, &resource(kind))
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "aip.io/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// The API server's refusal: its Status message.
fn refusal(result: Result<DynamicObject, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        other => panic!("expected a 422 refusal, got {other:?}"),
    }
}

fn approval_request(name: &str) -> DynamicObject {
    object(
        "ApprovalRequest",
        name,
        json!({"policy": "p", "pod": "agent-1", "podUid": "u1", "serviceAccount": "runner",
               "connection": "fs", "tool": "fs_write", "arguments": "{}",
               "argumentsHash": "sha256:00", "expiresAt": "2099-01-01T00:00:00Z"}),
    )
}

#[tokio::test]
async fn every_crd_is_a_structural_schema_accepted_without_a_warning() {
    let said = crds().await;
    assert!(
        !said.contains("Warning"),
        "the API server warned about the CRDs:\n{said}"
    );
    let api: Api<CustomResourceDefinition> = Api::all(shared().await.client(User::Admin).await);
    for crd in aip_api::crds() {
        let name = crd.metadata.name.unwrap();
        assert!(said.contains(&name), "{said}");
        let stored = api.get(&name).await.unwrap();
        let conditions = stored.status.unwrap().conditions.unwrap_or_default();
        let status = |kind: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == kind)
                .map(|c| (c.status.clone(), c.message.clone()))
        };
        assert_eq!(
            status("NonStructuralSchema"),
            None,
            "{name} is not structural"
        );
        assert_eq!(status("Established").unwrap().0, "True", "{name}");
        assert_eq!(status("NamesAccepted").unwrap().0, "True", "{name}");
    }
}

/// The rules this suite tests, each by one test below. A rule added to
/// api/src/*.rs without a test here fails this one.
#[test]
fn every_cel_rule_has_its_test() {
    let mut rules = Vec::new();
    for crd in aip_api::crds() {
        let kind = crd.spec.names.kind.clone();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        collect_rules(&kind, "", &schema["openAPIV3Schema"], &mut rules);
    }
    assert_eq!(
        rules,
        [
            "ToolConnection .spec: !has(self.tls) || self.url.startsWith('https://') (tls applies to https:// URLs only)",
            "ToolConnection .spec: !has(self.toolTrust) || self.toolTrust != 'Listed' || !has(self.toolPins) || size(self.toolPins) == 0 (toolTrust Listed serves every tool as listed, so toolPins would be ignored: remove one of them)",
            "ToolConnection .spec: !has(self.toolTrust) || self.toolTrust != 'FirstUse' || !has(self.toolPins) || size(self.toolPins) == 0 (toolTrust FirstUse pins what the server first lists and keeps the pins in status, so toolPins would compete with them: remove one of them)",
            "ToolConnection .spec: !has(self.auth) || !has(self.bearerToken) (auth puts its access token in the Authorization header, which bearerToken sets too: remove one of them)",
            "ToolConnection .spec.auth: [has(self.clientCredentials), has(self.jwtBearer), has(self.tokenExchange)].filter(x, x).size() == 1 (give exactly one of clientCredentials, jwtBearer and tokenExchange)",
            "ToolConnection .spec.auth: !has(self.clientCredentials) || [has(self.clientCredentials.clientSecret), has(self.clientCredentials.privateKey), has(self.clientCredentials.serviceAccountToken)].filter(x, x).size() == 1 (clientCredentials: give exactly one of clientSecret, privateKey and serviceAccountToken)",
            "ToolConnection .spec.auth: !has(self.clientCredentials) || (!has(self.clientCredentials.audience) && !has(self.clientCredentials.subjectIssuer)) (clientCredentials: audience and subjectIssuer apply to tokenExchange only)",
            "ToolConnection .spec.auth: !has(self.jwtBearer) || (has(self.jwtBearer.serviceAccountToken) && !(has(self.jwtBearer.clientSecret) && has(self.jwtBearer.privateKey))) (jwtBearer: serviceAccountToken is the grant; give at most one of clientSecret and privateKey (neither: a public client))",
            "ToolConnection .spec.auth: !has(self.jwtBearer) || (!has(self.jwtBearer.audience) && !has(self.jwtBearer.subjectIssuer)) (jwtBearer: audience and subjectIssuer apply to tokenExchange only)",
            "ToolConnection .spec.auth: !has(self.tokenExchange) || (has(self.tokenExchange.serviceAccountToken) && !(has(self.tokenExchange.clientSecret) && has(self.tokenExchange.privateKey))) (tokenExchange: serviceAccountToken is the subject token; give at most one of clientSecret and privateKey (neither: a public client))",
            "ToolConnection .spec.auth.clientCredentials: !has(self.issuer) || !has(self.tokenEndpoint) (give issuer (its token endpoint is discovered) or tokenEndpoint, not both (neither: both are found from the server's own metadata, RFC 9728))",
            "ToolConnection .spec.auth.clientCredentials: !has(self.clientAuthMethod) || has(self.clientSecret) (clientAuthMethod applies to clientSecret only)",
            "ToolConnection .spec.auth.jwtBearer: !has(self.issuer) || !has(self.tokenEndpoint) (give issuer (its token endpoint is discovered) or tokenEndpoint, not both (neither: both are found from the server's own metadata, RFC 9728))",
            "ToolConnection .spec.auth.jwtBearer: !has(self.clientAuthMethod) || has(self.clientSecret) (clientAuthMethod applies to clientSecret only)",
            "ToolConnection .spec.auth.tokenExchange: !has(self.issuer) || !has(self.tokenEndpoint) (give issuer (its token endpoint is discovered) or tokenEndpoint, not both (neither: both are found from the server's own metadata, RFC 9728))",
            "ToolConnection .spec.auth.tokenExchange: !has(self.clientAuthMethod) || has(self.clientSecret) (clientAuthMethod applies to clientSecret only)",
            "ApprovalRequest .spec: self == oldSelf (spec is immutable)",
            "EgressLock .spec.allow[]: isCIDR(self.cidr) && cidr(self.cidr) == cidr(self.cidr).masked() (cidr must be an address range such as 203.0.113.0/24 or 2001:db8::/32, with no bits set past its prefix)",
            "EgressLock .spec.allow[]: !has(self.endPort) || (has(self.port) && self.endPort >= self.port) (endPort needs port, and must not be below it)",
        ]
    );
}

fn collect_rules(kind: &str, path: &str, schema: &Value, out: &mut Vec<String>) {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push(format!(
            "{kind} {path}: {} ({})",
            rule["rule"].as_str().unwrap(),
            rule["message"].as_str().unwrap_or("")
        ));
    }
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        collect_rules(kind, &format!("{path}.{name}"), property, out);
    }
    if schema["items"].is_object() {
        collect_rules(kind, &format!("{path}[]"), &schema["items"], out);
    }
}

#[tokio::test]
async fn a_tls_block_on_an_http_url_is_refused_by_its_cel_rule() {
    crds().await;
    let ns = fresh_namespace("cel-tls").await;
    let api = api("ToolConnection", &ns).await;
    let tls = json!({"serverName": "mcp.internal"});
    let refused = api
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "plain",
                json!({"url": "http://mcp.example.com/mcp", "tls": tls}),
            ),
        )
        .await;
    assert_eq!(
        refusal(refused),
        "ToolConnection.aip.io \"plain\" is invalid: spec: Invalid value: tls applies to https:// URLs only"
    );
    // The rule holds for an https:// URL with tls, and for http:// without.
    for (name, spec) in [
        (
            "secure",
            json!({"url": "https://mcp.example.com/mcp", "tls": tls}),
        ),
        ("plain", json!({"url": "http://mcp.example.com/mcp"})),
    ] {
        api.create(
            &PostParams::default(),
            &object("ToolConnection", name, spec),
        )
        .await
        .unwrap();
    }
    // An update is held to it too.
    let patch = json!({"spec": {"url": "http://mcp.example.com/mcp"}});
    let refused = api
        .patch("secure", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert!(refusal(refused).ends_with("spec: Invalid value: tls applies to https:// URLs only"));
}

#[tokio::test]
async fn an_egress_lock_refuses_what_is_not_a_range_and_ports_out_of_order_by_its_cel_rules() {
    crds().await;
    let ns = fresh_namespace("cel-egress").await;
    let api = api("EgressLock", &ns).await;
    let lock = |allow: Value| object("EgressLock", "default", json!({"allow": [allow]}));
    for (allow, said) in [
        (
            json!({"cidr": "api.example.com"}),
            "spec.allow[0].cidr: Invalid value: cidr must be an address range",
        ),
        (
            json!({"cidr": "203.0.113.7/24"}),
            "spec.allow[0].cidr: Invalid value: cidr must be an address range",
        ),
        (
            json!({"cidr": "203.0.113.0/24", "port": 443, "endPort": 80}),
            "spec.allow[0].endPort: Invalid value: endPort needs port, and must not be below it",
        ),
        (
            json!({"cidr": "2001:db8::/32", "endPort": 80}),
            "spec.allow[0].endPort: Invalid value: endPort needs port",
        ),
    ] {
        let refused = refusal(
            api.create(&PostParams::default(), &lock(allow.clone()))
                .await,
        );
        assert!(refused.contains(said), "{allow}: {refused}");
    }
    for allow in [
        json!({"cidr": "203.0.113.0/24", "port": 443}),
        json!({"cidr": "2001:db8::1/128", "protocol": "UDP", "port": 4000, "endPort": 4010}),
    ] {
        let name = format!("ok-{}", allow["port"]);
        let mut ok = lock(allow);
        ok.metadata.name = Some(name.clone());
        let made = api.create(&PostParams::default(), &ok).await.unwrap();
        // The protocol is defaulted when not given.
        assert!(
            made.data["spec"]["allow"][0]["protocol"].is_string(),
            "{:?}",
            made.data
        );
        api.delete(&name, &Default::default()).await.unwrap();
    }
}

#[tokio::test]
async fn tool_pins_beside_trust_listed_or_first_use_are_refused_by_their_cel_rules() {
    crds().await;
    let ns = fresh_namespace("cel-pins").await;
    let api = api("ToolConnection", &ns).await;
    let pins = json!({"read": {"schemaHash": format!("sha256:{}", "a".repeat(64))}});
    let url = "https://mcp.example.com/mcp";
    let refused = api
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "listed",
                json!({"url": url, "toolTrust": "Listed", "toolPins": pins}),
            ),
        )
        .await;
    assert_eq!(
        refusal(refused),
        "ToolConnection.aip.io \"listed\" is invalid: spec: Invalid value: toolTrust Listed serves every tool as listed, so toolPins would be ignored: remove one of them"
    );
    let refused = api
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "first-use",
                json!({"url": url, "toolTrust": "FirstUse", "toolPins": pins}),
            ),
        )
        .await;
    assert_eq!(
        refusal(refused),
        "ToolConnection.aip.io \"first-use\" is invalid: spec: Invalid value: toolTrust FirstUse pins what the server first lists and keeps the pins in status, so toolPins would compete with them: remove one of them"
    );
    // Pinned with pins, Listed and FirstUse without, and pins alone are
    // accepted; a hash spelled otherwise is refused by its pattern.
    for (name, spec) in [
        ("first-use", json!({"url": url, "toolTrust": "FirstUse"})),
        (
            "pinned",
            json!({"url": url, "toolTrust": "Pinned", "toolPins": pins}),
        ),
        ("listed", json!({"url": url, "toolTrust": "Listed"})),
        ("pins", json!({"url": url, "toolPins": pins})),
    ] {
        api.create(
            &PostParams::default(),
            &object("ToolConnection", name, spec),
        )
        .await
        .unwrap();
    }
    let upper = json!({"read": {"schemaHash": format!("sha256:{}", "A".repeat(64))}});
    let refused = api
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "upper",
                json!({"url": url, "toolPins": upper}),
            ),
        )
        .await;
    assert!(refusal(refused).contains("spec.toolPins.read.schemaHash"));
}

#[tokio::test]
async fn auth_is_refused_beside_a_bearer_token_and_without_one_way_to_authenticate() {
    crds().await;
    let ns = fresh_namespace("cel-auth").await;
    let api = api("ToolConnection", &ns).await;
    let url = "https://mcp.example.com/mcp";
    let secret = json!({"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});
    let cc = |extra: Value| {
        let mut cc = json!({"issuer": "https://as.example/realms/r", "clientId": "gateway"});
        for (k, v) in extra.as_object().unwrap() {
            cc[k] = v.clone();
        }
        cc
    };
    let refused = |name: &'static str, spec: Value| {
        let api = api.clone();
        async move {
            refusal(
                api.create(
                    &PostParams::default(),
                    &object("ToolConnection", name, spec),
                )
                .await,
            )
        }
    };
    let said = refused(
        "both",
        json!({"url": url, "bearerToken": secret, "auth": {"clientCredentials": cc(json!({"clientSecret": secret}))}}),
    )
    .await;
    assert!(said.ends_with("spec: Invalid value: auth puts its access token in the Authorization header, which bearerToken sets too: remove one of them"), "{said}");
    let said = refused(
        "neither",
        json!({"url": url, "auth": {"clientCredentials": cc(json!({}))}}),
    )
    .await;
    assert!(said.contains("spec.auth: Invalid value: clientCredentials: give exactly one of clientSecret, privateKey and serviceAccountToken"), "{said}");
    let pod = json!({"audience": "https://as.example/realms/r"});
    for (name, auth, message) in [
        (
            "no-grant",
            json!({}),
            "spec.auth: Invalid value: give exactly one of clientCredentials, jwtBearer and tokenExchange",
        ),
        (
            "two-grants",
            json!({"clientCredentials": cc(json!({"clientSecret": secret})), "jwtBearer": cc(json!({"serviceAccountToken": pod.clone()}))}),
            "spec.auth: Invalid value: give exactly one of clientCredentials, jwtBearer and tokenExchange",
        ),
        (
            "cc-audience",
            json!({"clientCredentials": cc(json!({"clientSecret": secret, "audience": "mcp"}))}),
            "clientCredentials: audience and subjectIssuer apply to tokenExchange only",
        ),
        (
            "jwt-no-token",
            json!({"jwtBearer": cc(json!({"clientSecret": secret}))}),
            "jwtBearer: serviceAccountToken is the grant; give at most one of clientSecret and privateKey (neither: a public client)",
        ),
        (
            "jwt-two-auths",
            json!({"jwtBearer": cc(json!({"serviceAccountToken": pod.clone(), "clientSecret": secret, "privateKey": secret}))}),
            "jwtBearer: serviceAccountToken is the grant; give at most one of clientSecret and privateKey",
        ),
        (
            "jwt-issuer",
            json!({"jwtBearer": cc(json!({"serviceAccountToken": pod.clone(), "subjectIssuer": "kubernetes"}))}),
            "jwtBearer: audience and subjectIssuer apply to tokenExchange only",
        ),
        (
            "exchange-no-token",
            json!({"tokenExchange": cc(json!({"audience": "mcp"}))}),
            "tokenExchange: serviceAccountToken is the subject token; give at most one of clientSecret and privateKey",
        ),
    ] {
        let said = refused(name, json!({"url": url, "auth": auth})).await;
        assert!(said.contains(message), "{name}: {said}");
    }
    let said = refused(
        "two-servers",
        json!({"url": url, "auth": {"clientCredentials": cc(json!({"clientSecret": secret, "tokenEndpoint": "https://as.example/token"}))}}),
    )
    .await;
    assert!(
        said.contains("give issuer (its token endpoint is discovered) or tokenEndpoint, not both"),
        "{said}"
    );
    let said = refused(
        "method",
        json!({"url": url, "auth": {"clientCredentials": cc(json!({"privateKey": secret, "clientAuthMethod": "client_secret_post"}))}}),
    )
    .await;
    assert!(
        said.contains("clientAuthMethod applies to clientSecret only"),
        "{said}"
    );
    for (name, extra) in [
        (
            "secret",
            json!({"clientSecret": secret, "clientAuthMethod": "client_secret_post"}),
        ),
        ("key", json!({"privateKey": secret, "keyId": "k1"})),
        (
            "pod",
            json!({"serviceAccountToken": {"audience": "https://as.example/realms/r"}}),
        ),
    ] {
        api.create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                name,
                json!({"url": url, "auth": {"clientCredentials": cc(extra)}}),
            ),
        )
        .await
        .unwrap();
    }
    for (name, auth) in [
        (
            "jwt-public",
            json!({"jwtBearer": cc(json!({"serviceAccountToken": pod.clone()}))}),
        ),
        (
            "jwt-secret",
            json!({"jwtBearer": cc(json!({"serviceAccountToken": pod.clone(), "clientSecret": secret}))}),
        ),
        (
            "exchange",
            json!({"tokenExchange": cc(json!({"serviceAccountToken": pod.clone(), "privateKey": secret, "audience": "mcp", "subjectIssuer": "kubernetes"}))}),
        ),
    ] {
        api.create(
            &PostParams::default(),
            &object("ToolConnection", name, json!({"url": url, "auth": auth})),
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn an_approval_requests_spec_is_immutable_by_its_cel_rule() {
    crds().await;
    let ns = fresh_namespace("cel-immutable").await;
    let api = api("ApprovalRequest", &ns).await;
    api.create(&PostParams::default(), &approval_request("r1"))
        .await
        .unwrap();
    let patch = json!({"spec": {"tool": "fs_delete"}});
    let refused = api
        .patch("r1", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert_eq!(
        refusal(refused),
        "ApprovalRequest.aip.io \"r1\" is invalid: spec: Invalid value: spec is immutable"
    );
    // Metadata and status still change (the operator marks and decides).
    let marked = json!({"metadata": {"annotations": {"aip.io/recorded-decision": "Approved"}}});
    api.patch("r1", &PatchParams::default(), &Patch::Merge(&marked))
        .await
        .unwrap();
    let decided = json!({"status": {"decision": "Approved"}});
    let after = api
        .patch_status("r1", &PatchParams::default(), &Patch::Merge(&decided))
        .await
        .unwrap();
    assert_eq!(after.data["status"]["decision"], "Approved");
    assert_eq!(after.data["spec"]["tool"], "fs_write");
}

#[tokio::test]
async fn the_schemas_refuse_with_the_api_servers_own_words() {
    crds().await;
    let ns = fresh_namespace("schema").await;
    let policies = api("AgentPolicy", &ns).await;
    let refused = policies
        .create(
            &PostParams::default(),
            &object(
                "AgentPolicy",
                "p",
                json!({"mode": "loud", "approval": {"timeoutSeconds": 0},
                       "tool_rules": [{"tool": "x", "action": "maybe"}, {"action": "ask"}]}),
            ),
        )
        .await;
    let message = refusal(refused);
    for cause in [
        "spec.mode: Unsupported value: \"loud\": supported values: \"enforce\", \"monitor\"",
        "spec.approval.timeoutSeconds: Invalid value: 0: spec.approval.timeoutSeconds in body should be greater than or equal to 1",
        "spec.tool_rules[0].action: Unsupported value: \"maybe\": supported values: \"allow\", \"block\", \"ask\"",
        "spec.tool_rules[1].tool: Required value",
    ] {
        assert!(message.contains(cause), "{cause} missing from:\n{message}");
    }
    let connections = api("ToolConnection", &ns).await;
    let refused = connections
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "t",
                json!({"url": "ftp://x/mcp", "timeoutSeconds": 61, "toolPrefix": "a b",
                       "headers": [{"name": "bad header", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            ),
        )
        .await;
    let message = refusal(refused);
    for cause in [
        r#"spec.url: Invalid value: "ftp://x/mcp": spec.url in body should match '^https?://[^\s]+$'"#,
        "spec.timeoutSeconds: Invalid value: 61: spec.timeoutSeconds in body should be less than or equal to 60",
        r#"spec.toolPrefix: Invalid value: "a b": spec.toolPrefix in body should match '^[A-Za-z0-9_.-]*$'"#,
        "spec.headers[0].name: Invalid value: \"bad header\"",
    ] {
        assert!(message.contains(cause), "{cause} missing from:\n{message}");
    }
    // Without a URL there is nothing to connect to.
    let refused = connections
        .create(
            &PostParams::default(),
            &object("ToolConnection", "t", json!({})),
        )
        .await;
    assert!(
        refusal(refused).contains("spec.url: Required value"),
        "a ToolConnection needs a URL"
    );
}

#[tokio::test]
async fn defaults_are_filled_and_unknown_fields_refused_or_pruned() {
    crds().await;
    let ns = fresh_namespace("defaults").await;
    let connections = api("ToolConnection", &ns).await;
    // kubectl asks for strict field validation: an unknown field is an error.
    let manifest = format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: t, namespace: {ns}}}\nspec:\n  url: https://mcp.example.com/mcp\n  colour: red\n  clientCapabilities: {{sampling: true}}\n"
    );
    let tmp = tempfile::Builder::new()
        .prefix("aip-api-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let file = tmp.path().join(format!("{ns}.yaml"));
    std::fs::write(&file, &manifest).unwrap();
    let path = file.to_str().unwrap().to_owned();
    let (ok, said) = tokio::task::spawn_blocking(move || kubectl(&["apply", "-f", &path]))
        .await
        .unwrap();
    assert!(!ok, "{said}");
    assert!(
        said.contains("strict decoding error: unknown field \"spec.colour\""),
        "{said}"
    );
    // Without it (kube-rs's default) the field is pruned, the defaults filled.
    let created = connections
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "t",
                json!({"url": "https://mcp.example.com/mcp", "colour": "red",
                       "clientCapabilities": {"sampling": true}}),
            ),
        )
        .await
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        created.data["spec"],
        json!({"url": "https://mcp.example.com/mcp",
               "clientCapabilities": {"sampling": true, "elicitation": false, "roots": false}})
    );
    // An optional enum is left out, never null: the API server checks
    // `enum` for null too. (kubectl drops a `mode: ~` before sending it.)
    let policies = api("AgentPolicy", &ns).await;
    let refused = policies
        .create(
            &PostParams::default(),
            &object(
                "AgentPolicy",
                "p",
                json!({"mode": null, "allowed_tools": ["a"]}),
            ),
        )
        .await;
    assert_eq!(
        refusal(refused),
        "AgentPolicy.aip.io \"p\" is invalid: spec.mode: Unsupported value: null: supported values: \"enforce\", \"monitor\""
    );
    policies
        .create(
            &PostParams::default(),
            &object("AgentPolicy", "p", json!({"allowed_tools": ["a"]})),
        )
        .await
        .unwrap();
    // A status written without a decision reads Pending; counts read 0.
    let requests = api("ApprovalRequest", &ns).await;
    requests
        .create(&PostParams::default(), &approval_request("r1"))
        .await
        .unwrap();
    let empty = json!({"status": {"reason": "none yet"}});
    let status = requests
        .patch_status("r1", &PatchParams::default(), &Patch::Merge(&empty))
        .await
        .unwrap();
    assert_eq!(status.data["status"]["decision"], "Pending");
    let status = policies
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"mode": "enforce"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"]["governedPods"], 0);
    assert_eq!(status.data["status"]["syncedPods"], 0);
}

/// `kubectl explain KIND.FIELD` for every field of each kind's spec and
/// status shows its name and the first line of its doc comment (the API
/// server publishes a CRD's OpenAPI a moment after it is Established:
/// asked again until then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_shows_every_documented_field() {
    crds().await;
    for crd in aip_api::crds() {
        let kind = crd.spec.names.singular.clone().unwrap();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let root = &schema["openAPIV3Schema"];
        // kubectl wraps descriptions at 80 columns: compare words.
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let top = explained(&kind).await;
        assert!(
            words(&top).contains(&words(root["description"].as_str().unwrap())),
            "{top}"
        );
        for part in ["spec", "status"] {
            let explained = explained(&format!("{kind}.{part}")).await;
            let fields = root["properties"][part]["properties"].as_object().unwrap();
            for (name, field) in fields {
                let first = field["description"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{kind}.{part}.{name} has no description"))
                    .lines()
                    .next()
                    .unwrap();
                assert!(
                    explained.contains(&format!("  {name}\t")),
                    "{kind}.{part}.{name} missing:\n{explained}"
                );
                assert!(
                    words(&explained).contains(&words(first)),
                    "{kind}.{part}.{name}'s description {first:?} missing:\n{explained}"
                );
            }
        }
    }
}

/// `kubectl explain WHAT`, once the API server's OpenAPI has it.
async fn explained(what: &str) -> String {
    let what = what.to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let args = what.clone();
        let (ok, said) = tokio::task::spawn_blocking(move || kubectl(&["explain", &args]))
            .await
            .unwrap();
        if ok {
            return said;
        }
        assert!(Instant::now() < deadline, "kubectl explain {what}: {said}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_the_printer_columns() {
    crds().await;
    let ns = fresh_namespace("columns").await;
    api("ToolConnection", &ns)
        .await
        .create(
            &PostParams::default(),
            &object(
                "ToolConnection",
                "fs",
                json!({"url": "https://mcp.example.com/mcp"}),
            ),
        )
        .await
        .unwrap();
    let status = json!({"status": {"health": {"state": "Healthy"}, "toolCount": 2}});
    api("ToolConnection", &ns)
        .await
        .patch_status("fs", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    api("AgentPolicy", &ns)
        .await
        .create(
            &PostParams::default(),
            &object("AgentPolicy", "files", json!({"allowed_tools": ["a"]})),
        )
        .await
        .unwrap();
    let status = json!({"status": {"mode": "enforce", "synced": "1/1",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Valid", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api("AgentPolicy", &ns)
        .await
        .patch_status("files", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    api("ApprovalRequest", &ns)
        .await
        .create(&PostParams::default(), &approval_request("r1"))
        .await
        .unwrap();
    let (ok, listed) = tokio::task::spawn_blocking(move || kubectl(&["get", "aip", "-n", &ns]))
        .await
        .unwrap();
    assert!(ok, "{listed}");
    let rows: Vec<Vec<&str>> = listed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |first: &str| {
        rows.iter()
            .find(|r| r.first() == Some(&first))
            .unwrap_or_else(|| panic!("no {first} in:\n{listed}"))
            .clone()
    };
    assert_eq!(
        row("NAME")[..5],
        ["NAME", "MODE", "ACCEPTED", "SYNCED", "AGE"]
    );
    assert_eq!(
        row("agentpolicy.aip.io/files")[..4],
        ["agentpolicy.aip.io/files", "enforce", "True", "1/1"]
    );
    assert_eq!(
        row("toolconnection.aip.io/fs")[..4],
        [
            "toolconnection.aip.io/fs",
            "https://mcp.example.com/mcp",
            "Healthy",
            "2"
        ]
    );
    assert_eq!(
        row("approvalrequest.aip.io/r1")[..3],
        ["approvalrequest.aip.io/r1", "fs_write", "agent-1"]
    );
}

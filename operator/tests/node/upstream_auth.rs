//! Workload identity in a real pod: the agent pod's injected gateway gets
//! its access tokens from Keycloak with the JWT authorization grant (RFC
//! 7523 §2.1), the grant being the pod's own ServiceAccount token as the
//! kubelet projects it into the sidecar (the injector asks for the
//! audience; nothing else writes it). The tool server, a pod behind a
//! Service, accepts only Keycloak's tokens. No secret of the pod's
//! identity exists anywhere: Keycloak trusts the cluster's ServiceAccount
//! issuer. Keycloak listens on the node's address, where the node's pods
//! reach it.

use aip_kube_test::keycloak;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::*;

const SECRET: &str = "node-gw-s3cret-48";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_access_tokens_as_its_own_service_account() {
    let cluster = cluster().await;
    let story = Story::new(&cluster, "identity").await;
    let ns = story.namespace.clone();
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();

    // The cluster's ServiceAccount issuer and its keys (served again on the
    // node's loopback for Keycloak, which runs beside this test).
    let get = |path: &str| {
        hyper::Request::get(path.to_owned())
            .body(Vec::new())
            .unwrap()
    };
    let discovery: Value = serde_json::from_str(
        &cluster
            .admin
            .request_text(get("/.well-known/openid-configuration"))
            .await
            .unwrap(),
    )
    .unwrap();
    let issuer = discovery["issuer"].as_str().unwrap().to_owned();
    let keys = cluster
        .admin
        .request_text(get("/openid/v1/jwks"))
        .await
        .unwrap();
    let jwks = keycloak::serve_json(keys, shutdown.clone()).await.unwrap();

    // Keycloak: the cluster an identity provider for the JWT grant, the
    // gateway a client allowed to use it, the pod's service account a user.
    let realm = ns.as_str();
    let audience = kc.issuer(realm);
    let url = format!("http://files.{ns}.svc.cluster.local:8080/mcp");
    let kadmin = kc.admin().unwrap();
    kadmin.realm(realm).unwrap();
    kadmin
        .jwt_grant_provider(realm, "cluster", &issuer, &jwks, true)
        .unwrap();
    kadmin
        .jwt_grant_gateway(realm, &url, "cluster", SECRET)
        .unwrap();
    let sub = format!("system:serviceaccount:{ns}:default");
    kadmin.linked_user(realm, "cluster", "agent", &sub).unwrap();

    // The tool server takes Keycloak's tokens only (for the server's
    // client id: the grant issues no refresh token, which Keycloak 26.7's
    // resource indicators need, so no `resource` is sent).
    let script = upstream_script("unused").replacen(
        &upstream_script("unused")
            .lines()
            .find(|l| l.contains("requireBearer"))
            .unwrap()
            .to_owned(),
        &format!(
            "  requireJwt: {{issuer: '{audience}', audience: files-mcp, jwksUrl: '{audience}/protocol/openid-connect/certs'}}"
        ),
        1,
    );
    story.admin.apply(&format!(
        "{}---
apiVersion: v1
kind: Secret
metadata: {{name: gateway-client, namespace: {ns}}}
stringData: {{secret: {SECRET}}}
---
apiVersion: aip.io/v1alpha1
kind: ToolConnection
metadata: {{name: fs, namespace: {ns}}}
spec:
  url: {url}
  toolPrefix: fs_
  healthCheck: {{intervalSeconds: 5}}
  auth:
    jwtBearer:
      issuer: {audience}
      clientId: gateway
      clientSecret: {{valueFrom: {{secretKeyRef: {{name: gateway-client, key: secret}}}}}}
      serviceAccountToken: {{audience: '{audience}', expirationSeconds: 600}}
      sendResource: false
",
        story.files_server(&script)
    ));
    let (ok, out, err) = story.admin.aip(&["grant", "fs", "-n", &ns]);
    assert!(ok, "{out}{err}");
    wait_for(
        &story.admin,
        "deployment/files",
        "condition=Available",
        POD_PATIENCE,
    );
    story.policy(&["fs_read_file"], "");
    story.agent_pod("agent-1");

    // The kubelet projected the token with Keycloak's audience into the
    // sidecar's volume, which the agent container does not mount.
    let pod = story.pod_json("agent-1");
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "aip-token")
        .cloned()
        .unwrap();
    assert!(
        volume
            .to_string()
            .contains(&format!("\"audience\":\"{audience}\"")),
        "{volume}"
    );
    let agent_mounts = pod["spec"]["containers"][0]["volumeMounts"].to_string();
    assert!(!agent_mounts.contains("aip-token"), "{agent_mounts}");

    // The call goes through with a token Keycloak issued for the pod.
    let (_forward, mut agent) = story.agent_session("agent-1", "fs_read_file").await;
    let read = agent.call("fs_read_file", json!({"path": "/q3"})).await;
    assert_eq!(
        read["result"]["content"][0]["text"], "Q3: revenue up 12%",
        "{read}"
    );
    assert_eq!(story.upstream_calls("read_file").len(), 1);
    // The operator (in its pod, with no such token) shows what the
    // sidecar reported.
    // (The sidecar reports every 30 s.)
    let reason = "{.status.conditions[?(@.type==\"Authenticated\")].reason}";
    eventually(
        "the operator shows the sidecar's report",
        POD_PATIENCE,
        || {
            let said = story.admin.get("toolconnection/fs", reason);
            async move { (said == "JwtBearer").then_some(()) }
        },
    )
    .await;

    // No secret, projected token or access token (a JWT: `eyJ`) in the
    // sidecar's log, the operator's, the status or the Events.
    let said = [
        logs(&story.admin, "pod/agent-1", "aip-sidecar"),
        operator_logs(&story.admin),
        story.admin.ok(
            &["get", "toolconnection", "fs", "-n", &ns, "-o", "yaml"],
            None,
        ),
        story.admin.ok(&["get", "events", "-n", &ns], None),
    ]
    .join("\n");
    for secret in [SECRET, "eyJ"] {
        assert!(!said.contains(secret), "{secret} was shown:\n{said}");
    }
}

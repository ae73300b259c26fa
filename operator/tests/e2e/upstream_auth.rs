//! Upstream identity in the cluster (docs/upstream-auth.md): a
//! ToolConnection whose gateway gets its own access tokens from Keycloak
//! with a client secret kept in a Secret. The upstream (the fault server)
//! accepts only a token Keycloak signed for its URL; the operator's probe
//! and the sidecar each get one; a wrong secret makes the connection need
//! credentials with Keycloak's error in its status, and neither secret
//! appears in the status, Events or either process's output.

use std::sync::Arc;

use aip_fault_server::core::Core;
use aip_kube_test::User;
use aip_kube_test::keycloak::{self, Keycloak};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::Cluster;
use crate::common::kubectl::tempdir;
use crate::support::{
    Installed, agent_of, agent_pod_with_sidecar, clone_agent, error_code, events, eventually,
    policy, sidecar_token, start_sidecar,
};

const SECRET: &str = "gw-cluster-s3cret-77";
/// How long a status the sidecars' reports write (every 30 s) may take.
const REPORTED: std::time::Duration = std::time::Duration::from_secs(90);
const WRONG: &str = "gw-wrong-s3cret-11";

/// The upstream `files` (read_file): only tokens of `realm` for its URL.
async fn upstream(kc: &Keycloak, realm: &str, shutdown: &CancellationToken) -> (String, Arc<Core>) {
    upstream_for(kc, realm, None, shutdown).await
}

/// The upstream `files`: only tokens of `realm` for `audience` (None: its
/// URL).
async fn upstream_for(
    kc: &Keycloak,
    realm: &str,
    audience: Option<&str>,
    shutdown: &CancellationToken,
) -> (String, Arc<Core>) {
    let issuer = kc.issuer(realm);
    let jwks = format!("{issuer}/protocol/openid-connect/certs");
    aip_fault_server::http::jwt_protected(&issuer, &jwks, audience, "read_file", shutdown)
        .await
        .unwrap()
}

/// Waits until the agent's read_file call gets the upstream's answer.
async fn reads_through(agent: &crate::common::agent::Agent, what: &str) {
    eventually(what, || {
        let mut agent = clone_agent(agent);
        async move {
            let r = agent.call("fs_read_file", json!({"path": "a"})).await;
            (r["result"]["content"][0]["text"] == "contents").then_some(())
        }
    })
    .await;
}

fn reads(core: &Core) -> usize {
    core.log
        .lines()
        .iter()
        .filter(|l| l.contains("\"tool\":\"read_file\""))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_gets_its_tokens_from_keycloak_with_a_secret_from_a_secret() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster
        .calls_back_here("a_connection_gets_its_tokens_from_keycloak_with_a_secret_from_a_secret")
    {
        return;
    }
    let kc = keycloak::shared().await;
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cluster", &shutdown).await;
    let (key_url, key_core) = upstream(kc, "cluster-key", &shutdown).await;

    // Keycloak: the upstream a resource, the gateway a client whose tokens
    // name it; in a second realm, a client that signs its own assertions.
    let kadmin = kc.admin().unwrap();
    kadmin.realm("cluster").unwrap();
    kadmin
        .gateway_for("cluster", &url, &json!({"secret": SECRET}))
        .unwrap();
    let (pem, jwk) = keycloak::ec_key("gw-1");
    kadmin.realm("cluster-key").unwrap();
    kadmin
        .gateway_for(
            "cluster-key",
            &key_url,
            &json!({"clientAuthenticatorType": "client-jwt", "attributes": {
                "use.jwks.string": "true", "jwks.string": json!({"keys": [jwk]}).to_string(),
                "token.endpoint.auth.signing.alg": "ES256"}}),
        )
        .unwrap();

    let (installed, operator) = Installed::start(&cluster, &admin, &dir).await;
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    let secret = |value: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: gateway-client, namespace: agents}}\nstringData: {{secret: {value}}}\n"
        )
    };
    admin.apply(&secret(SECRET));
    admin.apply(&format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: fs, namespace: agents}}\nspec:\n  url: {url}\n  toolPrefix: fs_\n  healthCheck: {{intervalSeconds: 2}}\n  auth:\n    clientCredentials:\n      issuer: {}\n      clientId: gateway\n      clientSecret: {{valueFrom: {{secretKeyRef: {{name: gateway-client, key: secret}}}}}}\n",
        kc.issuer("cluster")
    ));
    let indented = pem.trim_end().replace('\n', "\n    ");
    admin.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: gateway-key, namespace: agents}}\nstringData:\n  tls.key: |\n    {indented}\n---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: fk, namespace: agents}}\nspec:\n  url: {key_url}\n  toolPrefix: fk_\n  auth:\n    clientCredentials:\n      issuer: {}\n      clientId: gateway\n      privateKey: {{valueFrom: {{secretKeyRef: {{name: gateway-key, key: tls.key}}}}}}\n      keyId: gw-1\n",
        kc.issuer("cluster-key")
    ));
    for (name, secret) in [("fs", "gateway-client"), ("fk", "gateway-key")] {
        let (ok, out, err) = admin.aip(&["grant", name, "-n", "agents"]);
        assert!(ok, "{out}{err}");
        assert!(out.contains(secret), "{out}");
    }
    admin.apply(
        &policy(&["fs_read_file", "fk_read_file"])
            .replace("toolConnections: [fs]", "toolConnections: [fs, fk]"),
    );
    // The operator's own probe gets a token and lists the tools.
    admin.wait("toolconnection/fs", "{.status.health.state}", "Healthy");
    admin.wait("toolconnection/fk", "{.status.health.state}", "Healthy");
    let authenticated = "{.status.conditions[?(@.type==\"Authenticated\")].reason}";
    admin.wait("toolconnection/fs", authenticated, "ClientCredentials");

    let (sidecar, agent) = agent_pod_with_sidecar(&cluster, &dir, &installed).await;
    reads_through(&agent, "a call through a token from Keycloak").await;
    eventually("a call through a token for the gateway's own key", || {
        let mut agent = clone_agent(&agent);
        async move {
            let r = agent.call("fk_read_file", json!({"path": "a"})).await;
            (r["result"]["content"][0]["text"] == "contents").then_some(())
        }
    })
    .await;
    assert!(reads(&key_core) >= 1);

    // A wrong secret: no token, so the connection needs credentials, with
    // Keycloak's error, and nothing more reaches the upstream.
    admin.apply(&secret(WRONG));
    admin.wait(
        "toolconnection/fs",
        "{.status.health.state}",
        "NeedsCredentials",
    );
    let reason = admin.get("toolconnection/fs", "{.status.health.reason}");
    assert!(
        reason.starts_with(
            "upstream_token_unavailable: the token endpoint refused: unauthorized_client"
        ),
        "{reason}"
    );
    admin.wait("toolconnection/fs", authenticated, "UnauthorizedClient");
    let before = reads(&core);
    let refused = eventually("the sidecar has no token either", || {
        let mut agent = clone_agent(&agent);
        async move {
            let r = agent.call("fs_read_file", json!({"path": "b"})).await;
            error_code(&r).map(|_| r)
        }
    })
    .await;
    assert!(!refused.to_string().contains(WRONG), "{refused}");
    assert_eq!(
        reads(&core),
        before,
        "a call without a token reached the upstream"
    );

    // Neither secret, nor the key, nor any access token (a JWT: `eyJ`) is
    // anywhere a person or a log collector looks.
    let status = admin.ok(
        &["get", "toolconnections", "-n", "agents", "-o", "yaml"],
        None,
    );
    let said = format!(
        "{status}\n{}\n{}\n{}",
        events(&admin),
        operator.all_output(),
        sidecar.all_output()
    );
    let key_lines = pem.lines().filter(|l| !l.starts_with("-----"));
    for secret in [SECRET, WRONG, "eyJ"].into_iter().chain(key_lines) {
        assert!(!said.contains(secret), "{secret} was shown:\n{said}");
    }
}

/// The API server's ServiceAccount token keys, served again on loopback
/// over plain HTTP for Keycloak to fetch (the API server's own endpoint
/// is TLS with a CA of the test's making): their URL.
async fn api_server_keys(cluster: &Cluster, shutdown: &CancellationToken) -> String {
    let request = hyper::Request::get("/openid/v1/jwks")
        .body(Vec::new())
        .unwrap();
    let jwks = cluster.admin.request_text(request).await.unwrap();
    keycloak::serve_json(jwks, shutdown.clone()).await.unwrap()
}

/// A JWT's claims, unverified (to read the issuer the API server names).
fn claims(jwt: &str) -> serde_json::Value {
    use base64::Engine;
    let payload = jwt.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_authenticates_upstream_as_its_own_service_account() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("a_pod_authenticates_upstream_as_its_own_service_account") {
        return;
    }
    let kc = keycloak::shared().await;
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let realm = "workloads";
    let (url, core) = upstream(kc, realm, &shutdown).await;
    let audience = kc.issuer(realm);

    let (installed, _operator) = Installed::start(&cluster, &admin, &dir).await;
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    cluster.service_account("agents", "agent").await;
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    // The token the kubelet would project for the connection.
    let projected = cluster
        .token("agents", "agent", "agent-1", &uid, &[&audience])
        .await;
    let issuer = claims(&projected)["iss"].as_str().unwrap().to_owned();

    // Keycloak trusts the API server as an identity provider and knows the
    // agent's service account as the client `gateway`: no secret at all.
    let jwks = api_server_keys(&cluster, &shutdown).await;
    let kadmin = kc.admin().unwrap();
    kadmin.realm(realm).unwrap();
    kadmin
        .post(
            &format!("/{realm}/identity-provider/instances"),
            &json!({"alias": "cluster", "providerId": "oidc", "enabled": true, "config": {
                "issuer": issuer, "jwksUrl": jwks, "useJwksUrl": "true",
                "validateSignature": "true", "supportsClientAssertions": "true",
                "supportsClientAssertionReuse": "true",
                "clientId": "unused", "clientSecret": "unused", "clientAuthMethod": "client_secret_post",
                "authorizationUrl": format!("{jwks}/authorize"), "tokenUrl": format!("{jwks}/token")}}),
        )
        .unwrap();
    kadmin
        .gateway_for(
            realm,
            &url,
            &json!({"clientAuthenticatorType": "federated-jwt", "attributes": {
                "jwt.credential.issuer": "cluster",
                "jwt.credential.sub": "system:serviceaccount:agents:agent"}}),
        )
        .unwrap();

    admin.apply(&format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: fs, namespace: agents}}\nspec:\n  url: {url}\n  toolPrefix: fs_\n  auth:\n    clientCredentials:\n      issuer: {audience}\n      clientId: gateway\n      serviceAccountToken: {{audience: '{audience}', expirationSeconds: 600}}\n"
    ));
    admin.apply(&policy(&["fs_read_file"]));

    // The injector projects that token into the sidecar of a new pod.
    admin.ok(
        &[
            "label",
            "namespace",
            "agents",
            "aip.io/inject=enabled",
            "--overwrite",
        ],
        None,
    );
    let path = aip_api::tool_connection::ServiceAccountTokenSpec {
        audience: audience.clone(),
        expiration_seconds: None,
    }
    .path();
    let injected = eventually("the injector projects the upstream token", || {
        let admin = admin.clone();
        async move {
            let (ok, out, _) = admin.run(
                &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
                Some("apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: agents, labels: {app: agent}}\nspec:\n  serviceAccountName: agent\n  containers: [{name: agent, image: pause}]\n"),
            );
            (ok && out.contains("upstream/")).then_some(out)
        }
    })
    .await;
    let pod: serde_json::Value = serde_json::from_str(&injected).unwrap();
    let sources = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "aip-token")
        .map(|v| v["projected"]["sources"].clone())
        .unwrap();
    assert!(
        sources.as_array().unwrap().iter().any(|s| {
            s["serviceAccountToken"]["audience"] == audience.as_str()
                && s["serviceAccountToken"]["path"] == path.as_str()
                && s["serviceAccountToken"]["expirationSeconds"] == 600
        }),
        "{sources}"
    );
    let agent_mounts = pod["spec"]["containers"][0]["volumeMounts"].to_string();
    assert!(
        !agent_mounts.contains("aip-token"),
        "only the sidecar mounts it: {agent_mounts}"
    );

    // The sidecar (started here as the kubelet would) finds the token where
    // the injector puts it, and the call goes through with Keycloak's token.
    let token = sidecar_token(&cluster, &dir, "agent", "agent-1", &uid).await;
    let upstream_token = token.parent().unwrap().join(&path);
    std::fs::create_dir_all(upstream_token.parent().unwrap()).unwrap();
    std::fs::write(&upstream_token, &projected).unwrap();
    let sidecar = start_sidecar(&installed.ca, installed.ports.grpc, &token);
    let agent = agent_of(&sidecar).await;
    reads_through(&agent, "a call as the pod's own service account").await;
    assert!(reads(&core) >= 1);
    // The operator has no such token: it does not probe the connection;
    // the sidecar's report is its status.
    admin.wait_within(
        "toolconnection/fs",
        "{.status.health.state}",
        "Healthy",
        REPORTED,
    );
    admin.wait_within(
        "toolconnection/fs",
        "{.status.conditions[?(@.type==\"Authenticated\")].reason}",
        "ClientCredentials",
        REPORTED,
    );
    assert!(!sidecar.all_output().contains(&projected));
}

/// One agent pod, two connections that trade its ServiceAccount token
/// (projected by audience, as the injector asks the kubelet) for access
/// tokens: `fs` by the JWT authorization grant (RFC 7523 §2.1), `ex` by
/// token exchange (RFC 8693), each in a Keycloak realm that trusts the
/// API server's issuer. A disabled workload user gates `fs` alone, named
/// in its condition, and comes back without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_trades_its_service_account_token_for_access_tokens() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("a_pod_trades_its_service_account_token_for_access_tokens") {
        return;
    }
    let kc = keycloak::shared().await;
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (fs_url, fs_core) = upstream_for(kc, "pods-grant", Some("files-mcp"), &shutdown).await;
    let (ex_url, ex_core) = upstream_for(kc, "pods-exchange", Some("files-mcp"), &shutdown).await;
    let (grant_audience, exchange_audience) = (kc.issuer("pods-grant"), kc.issuer("pods-exchange"));

    let (installed, operator) = Installed::start(&cluster, &admin, &dir).await;
    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    cluster.service_account("agents", "agent").await;
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let grant_token = cluster
        .token("agents", "agent", "agent-1", &uid, &[&grant_audience])
        .await;
    let exchange_token = cluster
        .token("agents", "agent", "agent-1", &uid, &[&exchange_audience])
        .await;
    let issuer = claims(&grant_token)["iss"].as_str().unwrap().to_owned();
    let sub = "system:serviceaccount:agents:agent";
    let jwks = api_server_keys(&cluster, &shutdown).await;

    // Keycloak: realm pods-grant takes the API server's tokens as a JWT
    // authorization grant for the workload user they are linked to (tokens
    // of 10 s, asked for again every 8); realm pods-exchange exchanges them.
    let kadmin = kc.admin().unwrap();
    kadmin.realm("pods-grant").unwrap();
    kadmin
        .put("/pods-grant", &json!({"accessTokenLifespan": 10}))
        .unwrap();
    kadmin
        .jwt_grant_provider("pods-grant", "cluster", &issuer, &jwks, true)
        .unwrap();
    kadmin
        .jwt_grant_gateway("pods-grant", &fs_url, "cluster", SECRET)
        .unwrap();
    let user = kadmin
        .linked_user("pods-grant", "cluster", "agents-agent", sub)
        .unwrap();
    kadmin.realm("pods-exchange").unwrap();
    kadmin
        .post(
            "/pods-exchange/identity-provider/instances",
            &json!({"alias": "cluster", "providerId": "oidc", "enabled": true, "config": {
                "issuer": issuer, "jwksUrl": jwks, "useJwksUrl": "true", "validateSignature": "true",
                "disableUserInfo": "true", "disableTypeClaimCheck": "true", "syncMode": "IMPORT",
                "clientId": "unused", "clientSecret": "unused",
                "authorizationUrl": format!("{jwks}/authorize"), "tokenUrl": format!("{jwks}/token")}}),
        )
        .unwrap();
    let exchanger = kadmin
        .gateway_for("pods-exchange", &ex_url, &json!({"secret": SECRET}))
        .unwrap();
    kadmin
        .allow_token_exchange("pods-exchange", "cluster", &exchanger)
        .unwrap();

    admin.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: gateway-client, namespace: agents}}\nstringData: {{secret: {SECRET}}}\n"
    ));
    let connection = |name: &str, url: &str, grant: &str, audience: &str, extra: &str| {
        format!(
            "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: {name}, namespace: agents}}\nspec:\n  url: {url}\n  toolPrefix: {name}_\n  healthCheck: {{intervalSeconds: 2}}\n  auth:\n    {grant}:\n      issuer: {audience}\n      clientId: gateway\n      clientSecret: {{valueFrom: {{secretKeyRef: {{name: gateway-client, key: secret}}}}}}\n      serviceAccountToken: {{audience: '{audience}', expirationSeconds: 600}}\n      sendResource: false\n{extra}"
        )
    };
    admin.apply(&connection("fs", &fs_url, "jwtBearer", &grant_audience, ""));
    admin.apply(&connection(
        "ex",
        &ex_url,
        "tokenExchange",
        &exchange_audience,
        "      subjectIssuer: cluster\n",
    ));
    // The operator reads the Secret only where it is let.
    for name in ["fs", "ex"] {
        let (ok, out, err) = admin.aip(&["grant", name, "-n", "agents"]);
        assert!(ok && out.contains("gateway-client"), "{out}{err}");
    }
    admin.apply(
        &policy(&["fs_read_file", "ex_read_file"])
            .replace("toolConnections: [fs]", "toolConnections: [fs, ex]"),
    );
    admin.ok(
        &[
            "label",
            "namespace",
            "agents",
            "aip.io/inject=enabled",
            "--overwrite",
        ],
        None,
    );

    // The kubelet's part: each audience's token where the injector asks
    // for it, beside the sidecar's own.
    let token = sidecar_token(&cluster, &dir, "agent", "agent-1", &uid).await;
    for (audience, jwt) in [
        (&grant_audience, &grant_token),
        (&exchange_audience, &exchange_token),
    ] {
        let path = aip_api::tool_connection::ServiceAccountTokenSpec {
            audience: audience.clone(),
            expiration_seconds: None,
        }
        .path();
        let file = token.parent().unwrap().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, jwt).unwrap();
    }
    let sidecar = start_sidecar(&installed.ca, installed.ports.grpc, &token);
    let agent = agent_of(&sidecar).await;
    let read = |tool: &'static str| {
        let agent = clone_agent(&agent);
        async move {
            let mut agent = agent;
            agent.call(tool, json!({"path": "a"})).await
        }
    };
    let through = |r: &serde_json::Value| r["result"]["content"][0]["text"] == "contents";
    eventually("fs reads with a token for the pod's grant", || async {
        through(&read("fs_read_file").await).then_some(())
    })
    .await;
    eventually(
        "ex reads with a token for the pod's exchanged token",
        || async { through(&read("ex_read_file").await).then_some(()) },
    )
    .await;
    let reason = |name: &str| {
        (
            format!("toolconnection/{name}"),
            "{.status.conditions[?(@.type==\"Authenticated\")].reason}",
        )
    };
    let (fs, authenticated) = reason("fs");
    admin.wait_within(&fs, authenticated, "JwtBearer", REPORTED);
    let (ex, _) = reason("ex");
    admin.wait_within(&ex, authenticated, "TokenExchange", REPORTED);

    // The workload user disabled: the next token request is refused, the
    // token in hand runs out, and fs alone is gated, named by Keycloak's
    // code in its condition; nothing more reaches its upstream.
    // (An admin token is good for a minute.)
    let kadmin = kc.admin().unwrap();
    kadmin
        .put(
            &format!("/pods-grant/users/{user}"),
            &json!({"enabled": false}),
        )
        .unwrap();
    // (Calls once a second: each call before the token runs out reaches
    // the upstream, whose script has 100 answers.)
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let refused = loop {
        let r = read("fs_read_file").await;
        if error_code(&r).is_some() {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fs is never refused"
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    assert!(
        refused.to_string().contains("User is not enabled"),
        "the agent is told why: {refused}"
    );
    let before = reads(&fs_core);
    assert!(error_code(&read("fs_read_file").await).is_some());
    assert_eq!(
        reads(&fs_core),
        before,
        "a call without a token went upstream"
    );
    assert!(
        through(&read("ex_read_file").await),
        "its sibling still works"
    );
    admin.wait_within(&fs, authenticated, "InvalidGrant", REPORTED);
    let message = admin.get(
        &fs,
        "{.status.conditions[?(@.type==\"Authenticated\")].message}",
    );
    assert!(message.contains("jwtBearer from issuer"), "{message}");
    assert!(message.contains("User is not enabled"), "{message}");

    // Enabled again: the next token request succeeds, with no restart.
    let kadmin = kc.admin().unwrap();
    kadmin
        .put(
            &format!("/pods-grant/users/{user}"),
            &json!({"enabled": true}),
        )
        .unwrap();
    eventually("fs reads again", || async {
        through(&read("fs_read_file").await).then_some(())
    })
    .await;
    admin.wait_within(&fs, authenticated, "JwtBearer", REPORTED);
    assert!(reads(&ex_core) >= 2);

    // No secret, projected token or access token (a JWT: `eyJ`) is where
    // a person or a log collector looks.
    let status = admin.ok(
        &["get", "toolconnections", "-n", "agents", "-o", "yaml"],
        None,
    );
    let said = format!(
        "{status}\n{}\n{}\n{}",
        events(&admin),
        operator.all_output(),
        sidecar.all_output()
    );
    for secret in [SECRET, grant_token.as_str(), exchange_token.as_str(), "eyJ"] {
        assert!(!said.contains(secret), "{secret} was shown:\n{said}");
    }
}

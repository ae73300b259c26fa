//! Upstream identity against a real authorization server
//! (docs/upstream-auth.md): Keycloak, started by the test binary
//! (aip_kube_test::keycloak), issues the gateway access tokens with the
//! client credentials grant; the upstream (the fault server) accepts only
//! a token Keycloak signed for its own URL (RFC 8707 `resource`, checked
//! against Keycloak's JWKS). Each test has a realm of its own.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use aip_fault_server::core::Core;
use aip_kube_test::keycloak::{self, Keycloak, ec_key};
use aip_sidecar::upstream::health::HealthState;
use common::{Setup, Stack, scratch};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "gw-s3cret-Zq81";

/// An upstream that demands a token of `realm` for its own URL; its URL
/// and the server (for its attempt log).
async fn upstream(
    kc: &Keycloak,
    realm: &str,
    shutdown: &CancellationToken,
) -> (String, std::sync::Arc<Core>) {
    upstream_for(kc, realm, None, shutdown).await
}

/// An upstream that demands a token of `realm` for `audience` (None: its
/// own URL); its URL and the server.
async fn upstream_for(
    kc: &Keycloak,
    realm: &str,
    audience: Option<&str>,
    shutdown: &CancellationToken,
) -> (String, std::sync::Arc<Core>) {
    let issuer = kc.issuer(realm);
    let jwks = format!("{issuer}/protocol/openid-connect/certs");
    aip_fault_server::http::jwt_protected(&issuer, &jwks, audience, "read", shutdown)
        .await
        .unwrap()
}

/// Realm `realm`, the upstream at `url` its resource, and the gateway's
/// client (`client`: how it authenticates).
fn realm(kc: &Keycloak, realm: &str, url: &str, client: Value) {
    let admin = kc.admin().unwrap();
    admin.realm(realm).unwrap();
    admin.gateway_for(realm, url, &client).unwrap();
}

/// The gateway in front of `url`, its connection getting tokens with
/// `client` (the lines under `clientCredentials`, each indented six
/// spaces); waits for the connection to be `expect`.
async fn auth_stack(url: &str, client: &str, expect: HealthState) -> Stack {
    Stack::start(Setup {
        policy: "  allowed_tools: [up_read]",
        url: Some(url.to_owned()),
        connection: &format!("  auth:\n    clientCredentials:\n{client}"),
        expect,
        ..Setup::default()
    })
    .await
}

/// One read_file call through `s` gets the upstream's answer, and the
/// upstream has seen exactly that one call.
async fn reads_once(s: &Stack, core: &Core) -> String {
    let session = s.session().await;
    let read = s.call(&session, json!(1), "up_read", json!({})).await;
    assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
    assert_eq!(calls(core), 1);
    session
}

/// The gateway in front of `url`, with client `gateway` of `realm` and
/// `secret` (from a file), sent as `method` (basic when None); waits for
/// the connection to be `expect`.
async fn secret_stack(
    kc: &Keycloak,
    realm: &str,
    url: &str,
    secret: &str,
    method: Option<&str>,
    expect: HealthState,
) -> (Stack, tempfile::TempDir) {
    let dir = scratch("aip-oauth-");
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret).unwrap();
    let method = method
        .map(|m| format!("      clientAuthMethod: {m}\n"))
        .unwrap_or_default();
    // realm "" leaves the authorization server to be found from the
    // upstream's own metadata (RFC 9728).
    let issuer = if realm.is_empty() {
        String::new()
    } else {
        format!("      issuer: {}\n", kc.issuer(realm))
    };
    let client = format!(
        "{issuer}      clientId: gateway\n      clientSecret: {{valueFrom: {{file: {}}}}}\n{method}",
        secret_file.display()
    );
    let s = auth_stack(url, &client, expect).await;
    (s, dir)
}

/// Who called the upstream: the distinct Authorization headers (hashed)
/// of its attempts.
fn tokens_seen(core: &Core) -> BTreeSet<String> {
    core.log
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|a| a["auth_sha256"].as_str().map(str::to_owned))
        .collect()
}

/// Reads through `s` (every call must get the upstream's answer) until
/// the upstream has seen a second token, within 30 s (else fails saying
/// `what`); the next call id.
async fn reads_until_a_second_token(s: &Stack, core: &Core, session: &str, what: &str) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut id = 2;
    while tokens_seen(core).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "{what}");
        let read = s.call(session, json!(id), "up_read", json!({})).await;
        assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
        id += 1;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    id
}

fn calls(core: &Core) -> usize {
    core.log
        .lines()
        .iter()
        .filter(|l| l.contains("\"tool\":\"read\""))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_client_gets_one_token_for_many_calls_and_the_upstream_accepts_it() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-secret", &shutdown).await;
    realm(kc, "cc-secret", &url, json!({"secret": SECRET}));
    let (s, _dir) = secret_stack(kc, "cc-secret", &url, SECRET, None, HealthState::Healthy).await;
    let session = s.session().await;
    for id in 0..20 {
        let read = s.call(&session, json!(id), "up_read", json!({})).await;
        assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
    }
    assert_eq!(calls(&core), 20);
    // One token served the health checks, the session and every call.
    assert_eq!(tokens_seen(&core).len(), 1, "{:?}", core.log.lines());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_server_is_found_from_the_upstreams_own_metadata() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-discovered", &shutdown).await;
    realm(kc, "cc-discovered", &url, json!({"secret": SECRET}));
    // No issuer, no token endpoint: the upstream's RFC 9728 metadata names
    // Keycloak's realm, whose metadata names the token endpoint.
    let (s, _dir) = secret_stack(kc, "", &url, SECRET, None, HealthState::Healthy).await;
    reads_once(&s, &core).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_needs_credentials_with_the_servers_error_and_reaches_nothing() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-wrong", &shutdown).await;
    realm(kc, "cc-wrong", &url, json!({"secret": SECRET}));
    let dir = scratch("aip-oauth-");
    let secret_file = dir.path().join("secret");
    let wrong = "not-the-s3cret-9931";
    std::fs::write(&secret_file, wrong).unwrap();
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [up_read]",
        url: Some(url.clone()),
        connection: &format!(
            "  auth:\n    clientCredentials:\n      issuer: {}\n      clientId: gateway\n      clientSecret: {{valueFrom: {{file: {}}}}}\n      clientAuthMethod: client_secret_post\n",
            kc.issuer("cc-wrong"),
            secret_file.display()
        ),
        expect: HealthState::NeedsCredentials,
        ..Setup::default()
    })
    .await;
    let health = s.gateway.connections()[0].health();
    let reason = health.reason.unwrap_or_default();
    assert!(
        // Keycloak's words for a wrong secret.
        reason
            == "upstream_token_unavailable: the token endpoint refused: unauthorized_client (Invalid client or Invalid client credentials)",
        "{reason}"
    );
    assert!(!reason.contains(wrong), "{reason}");
    let session = s.session().await;
    let refused = s.call(&session, json!(1), "up_read", json!({})).await;
    assert!(refused.get("error").is_some(), "{refused}");
    assert!(!refused.to_string().contains(wrong), "{refused}");
    assert_eq!(calls(&core), 0, "nothing reached the upstream");
    assert!(tokens_seen(&core).is_empty());
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    assert!(!audit.contains(wrong), "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_client_signs_its_own_assertions() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-key", &shutdown).await;
    let (pem, jwk) = ec_key("gw-1");
    realm(
        kc,
        "cc-key",
        &url,
        json!({"clientAuthenticatorType": "client-jwt", "attributes": {
            "use.jwks.string": "true", "jwks.string": json!({"keys": [jwk]}).to_string(),
            "token.endpoint.auth.signing.alg": "ES256"}}),
    );
    let dir = scratch("aip-oauth-");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&key_file, &pem).unwrap();
    let client = format!(
        "      issuer: {}\n      clientId: gateway\n      privateKey: {{valueFrom: {{file: {}}}}}\n      keyId: gw-1\n",
        kc.issuer("cc-key"),
        key_file.display()
    );
    let s = auth_stack(&url, &client, HealthState::Healthy).await;
    reads_once(&s, &core).await;
}

/// A JWT issuer of the test's own (as the Kubernetes API server issues
/// ServiceAccount tokens): its keys served on loopback; their URL.
async fn issuer_serving(jwks: Value, shutdown: &CancellationToken) -> String {
    keycloak::serve_json(jwks.to_string(), shutdown.clone())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federated_assertion_file_is_the_client_credential_and_is_reread() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-federated", &shutdown).await;
    let (pem, jwk) = ec_key("sa-1");
    let issuer = issuer_serving(json!({"keys": [jwk]}), &shutdown).await;
    let jwks_url = format!("{issuer}/jwks");
    let sub = "system:serviceaccount:agents:agent";
    realm(
        kc,
        "cc-federated",
        &url,
        json!({"clientAuthenticatorType": "federated-jwt", "attributes": {
            "jwt.credential.issuer": "workloads", "jwt.credential.sub": sub}}),
    );
    let admin = kc.admin().unwrap();
    admin
        .post(
            "/cc-federated/identity-provider/instances",
            &json!({"alias": "workloads", "providerId": "oidc", "enabled": true, "config": {
                "issuer": issuer, "jwksUrl": jwks_url, "useJwksUrl": "true",
                "validateSignature": "true", "supportsClientAssertions": "true",
                "clientId": "unused", "clientSecret": "unused", "clientAuthMethod": "client_secret_post",
                "authorizationUrl": format!("{issuer}/authorize"), "tokenUrl": format!("{issuer}/token")}}),
        )
        .unwrap();
    // Tokens of 10 s: the gateway asks again after 8.
    admin
        .put("/cc-federated", &json!({"accessTokenLifespan": 10}))
        .unwrap();
    let dir = scratch("aip-oauth-");
    let token_file = dir.path().join("token");
    let audience = kc.issuer("cc-federated");
    std::fs::write(
        &token_file,
        assertion_aged(&pem, &issuer, sub, &audience, 0, 120),
    )
    .unwrap();
    let client = format!(
        "      issuer: {audience}\n      clientId: gateway\n      assertionFile: {}\n",
        token_file.display()
    );
    let s = auth_stack(&url, &client, HealthState::Healthy).await;
    let session = reads_once(&s, &core).await;
    // The issuer rotates the assertion in place, as the kubelet does. An
    // assertion is good once here (no reuse): the next token request
    // succeeds only with the file read again.
    std::fs::write(
        &token_file,
        assertion_aged(&pem, &issuer, sub, &audience, 0, 120),
    )
    .unwrap();
    reads_until_a_second_token(&s, &core, &session, "no second token").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_sessions_share_one_token_request_per_expiry() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-load", &shutdown).await;
    realm(kc, "cc-load", &url, json!({"secret": SECRET}));
    // Tokens of 10 s: the gateway asks again after 8, while the sessions
    // below are calling.
    kc.admin()
        .unwrap()
        .put("/cc-load", &json!({"accessTokenLifespan": 10}))
        .unwrap();
    let (s, _dir) = secret_stack(kc, "cc-load", &url, SECRET, None, HealthState::Healthy).await;
    let s = std::sync::Arc::new(s);
    let started = std::time::Instant::now();
    let mut sessions = Vec::new();
    for _ in 0..32 {
        sessions.push(s.session().await);
    }
    // Every session calls until the first token's refresh is well past.
    let mut callers = tokio::task::JoinSet::new();
    for (n, session) in sessions.into_iter().enumerate() {
        let s = s.clone();
        callers.spawn(async move {
            let mut id = 0u64;
            while started.elapsed() < std::time::Duration::from_secs(12) {
                let read = s.call(&session, json!(id), "up_read", json!({})).await;
                // (Past its 50 scripted answers the upstream answers with a
                // tool error: still an answer the token got through to.)
                assert!(read.get("result").is_some(), "session {n}: {read}");
                id += 1;
            }
            id
        });
    }
    let mut total = 0;
    while let Some(made) = callers.join_next().await {
        total += made.unwrap();
    }
    assert!(total >= 64, "{total} calls");
    // The first token and its one refresh: one request per expiry.
    assert_eq!(tokens_seen(&core).len(), 2, "{total} calls");
}

/// A careless upstream: it accepts any bearer token and echoes the
/// request's Authorization header in every tool result (a debug echo, a
/// reflected request), raw and base64-encoded.
async fn echoing_upstream(shutdown: &CancellationToken) -> String {
    use base64::Engine;
    use http_body_util::{BodyExt, Full};
    let addr = keycloak::serve_loopback(
        |req: hyper::Request<hyper::body::Incoming>| async move {
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let result = match message["method"].as_str() {
                Some("initialize") => json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}}, "serverInfo": {"name": "echo", "version": "1"}}),
                Some("tools/list") => {
                    json!({"tools": [{"name": "read", "inputSchema": {"type": "object"}}]})
                }
                Some(_) => json!({"content": [{"type": "text", "text": format!(
                    "debug: you sent {auth} ({})",
                    base64::engine::general_purpose::STANDARD.encode(auth.trim_start_matches("Bearer "))
                )}]}),
                None => Value::Null,
            };
            if message.get("id").is_some() {
                let mut r = hyper::Response::new(Full::new(bytes::Bytes::from(
                    json!({"jsonrpc": "2.0", "id": message["id"], "result": result}).to_string(),
                )));
                r.headers_mut()
                    .insert("content-type", "application/json".parse().unwrap());
                r
            } else {
                let mut r = hyper::Response::new(Full::new(bytes::Bytes::new()));
                *r.status_mut() = hyper::StatusCode::ACCEPTED;
                r
            }
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    format!("http://{addr}/mcp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_echoes_its_access_token_never_hands_it_to_the_agent() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let url = echoing_upstream(&shutdown).await;
    realm(kc, "cc-echo", &url, json!({"secret": SECRET}));
    let (s, _dir) = secret_stack(kc, "cc-echo", &url, SECRET, None, HealthState::Healthy).await;
    let session = s.session().await;
    let read = s.call(&session, json!(1), "up_read", json!({})).await;
    let text = read["result"]["content"][0]["text"].as_str().unwrap();
    // The token itself is a JWT: three base64url parts, the first {"alg"...
    assert!(
        !text.contains("eyJ"),
        "the agent was handed the token: {text}"
    );
    assert!(
        text.starts_with("debug: you sent Bearer [REDACTED:credential] ([REDACTED:credential])"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_token_endpoint_needs_credentials_and_says_so() {
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    // An upstream that would take a token, and a token endpoint where
    // nothing listens (a port bound and released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = echoing_upstream(&shutdown).await;
    let dir = scratch("aip-oauth-");
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let client = format!(
        "      tokenEndpoint: http://127.0.0.1:{port}/token\n      clientId: gateway\n      clientSecret: {{valueFrom: {{file: {}}}}}\n",
        secret_file.display()
    );
    let s = auth_stack(&url, &client, HealthState::NeedsCredentials).await;
    let reason = s.gateway.connections()[0]
        .health()
        .reason
        .unwrap_or_default();
    assert!(
        reason.starts_with("upstream_token_unavailable: the token endpoint cannot be reached: "),
        "{reason}"
    );
    assert!(!reason.contains(SECRET), "{reason}");
    let session = s.session().await;
    let refused = s.call(&session, json!(1), "up_read", json!({})).await;
    assert!(refused.get("error").is_some(), "{refused}");
}

/// An assertion of the test's issuer about `sub`, for `audience`, issued
/// `age` seconds ago and good for `life` seconds from its issue (a life
/// shorter than its age: expired).
fn assertion_aged(
    pem: &str,
    issuer: &str,
    sub: &str,
    audience: &str,
    age: u64,
    life: u64,
) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("sa-1".to_owned());
    let iat = now - age;
    let claims = json!({"iss": issuer, "sub": sub, "aud": audience, "iat": iat, "nbf": iat,
                        "exp": iat + life, "jti": format!("{:032x}", rand::random::<u128>())});
    let key = jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// Keycloak trusts the test's issuer for the JWT authorization grant
/// (RFC 7523 §2.1) in `realm`: the identity provider `workloads`, the
/// gateway's client allowed to use it, and the user the workload `sub` is
/// linked to; an assertion may serve many requests if `reuse`. The
/// issuer's URL, its key's PEM and the user's id.
async fn jwt_grant_realm(
    kc: &Keycloak,
    realm: &str,
    url: &str,
    sub: &str,
    reuse: bool,
    shutdown: &CancellationToken,
) -> (String, String, String) {
    let (pem, jwk) = ec_key("sa-1");
    let issuer = issuer_serving(json!({"keys": [jwk]}), shutdown).await;
    let admin = kc.admin().unwrap();
    admin.realm(realm).unwrap();
    admin
        .jwt_grant_provider(
            realm,
            "workloads",
            &issuer,
            &format!("{issuer}/jwks"),
            reuse,
        )
        .unwrap();
    admin
        .jwt_grant_gateway(realm, url, "workloads", SECRET)
        .unwrap();
    let user = admin.linked_user(realm, "workloads", "agent", sub).unwrap();
    (issuer, pem, user)
}

/// The lines of a jwtBearer grant with the assertion in `file`, the
/// gateway authenticating with its secret from `secret_file`. No
/// `resource`: Keycloak 26.7's resource indicators fail a grant without a
/// refresh token, which this grant never has; the token's audience is
/// the server's client id, from the audience mapper.
fn jwt_bearer(issuer: &str, file: &std::path::Path, secret_file: &std::path::Path) -> String {
    format!(
        "  auth:\n    jwtBearer:\n      issuer: {issuer}\n      clientId: gateway\n      clientSecret: {{valueFrom: {{file: {}}}}}\n      assertionFile: {}\n      sendResource: false\n",
        secret_file.display(),
        file.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workloads_own_jwt_is_the_grant_and_is_reread_when_rotated() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream_for(kc, "jwt-grant", Some("files-mcp"), &shutdown).await;
    let sub = "system:serviceaccount:agents:agent";
    let (issuer, pem, _) = jwt_grant_realm(kc, "jwt-grant", &url, sub, false, &shutdown).await;
    // Tokens of 10 s: the gateway asks again after 8.
    kc.admin()
        .unwrap()
        .put("/jwt-grant", &json!({"accessTokenLifespan": 10}))
        .unwrap();
    let dir = scratch("aip-oauth-");
    let (file, secret_file) = (dir.path().join("token"), dir.path().join("secret"));
    std::fs::write(&secret_file, SECRET).unwrap();
    let audience = kc.issuer("jwt-grant");
    let first = assertion_aged(&pem, &issuer, sub, &audience, 0, 600);
    std::fs::write(&file, &first).unwrap();
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [up_read]",
        url: Some(url.clone()),
        connection: &jwt_bearer(&audience, &file, &secret_file),
        ..Setup::default()
    })
    .await;
    let session = reads_once(&s, &core).await;
    // The kubelet rotates the token in place. An assertion is good once in
    // this realm (no reuse): a second token comes only from the file read
    // again.
    std::fs::write(&file, assertion_aged(&pem, &issuer, sub, &audience, 0, 600)).unwrap();
    reads_until_a_second_token(&s, &core, &session, "no second token").await;
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    assert!(!audit.contains(&first), "the assertion is never audited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_jwt_grant_names_the_servers_error_and_reaches_nothing() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let realm_name = "jwt-refused";
    let (url, core) = upstream_for(kc, realm_name, Some("files-mcp"), &shutdown).await;
    let sub = "system:serviceaccount:agents:agent";
    let (issuer, pem, user) = jwt_grant_realm(kc, realm_name, &url, sub, true, &shutdown).await;
    let admin = kc.admin().unwrap();
    let audience = kc.issuer(realm_name);
    let dir = scratch("aip-oauth-");
    let (file, secret_file) = (dir.path().join("token"), dir.path().join("secret"));
    std::fs::write(&secret_file, SECRET).unwrap();
    let gateway = admin
        .get(&format!("/{realm_name}/clients?clientId=gateway"))
        .unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Each case: what is changed at Keycloak (and restored after), the
    // assertion, and Keycloak's words.
    type Change<'a> = Option<(&'a str, Value, Value)>;
    let user_path = format!("/{realm_name}/users/{user}");
    let client_path = format!("/{realm_name}/clients/{gateway}");
    let cases: Vec<(&str, Change, String, &str)> = vec![
        (
            "a wrong audience",
            None,
            assertion_aged(&pem, &issuer, sub, "https://elsewhere.example", 0, 600),
            "invalid_grant (Invalid token audience)",
        ),
        (
            "an expired assertion",
            None,
            assertion_aged(&pem, &issuer, sub, &audience, 700, 600),
            "invalid_grant (Token is not active)",
        ),
        (
            "a disabled user",
            Some((
                &user_path,
                json!({"enabled": false}),
                json!({"enabled": true}),
            )),
            assertion_aged(&pem, &issuer, sub, &audience, 0, 600),
            "invalid_grant (User is not enabled)",
        ),
        (
            "a revoked client",
            Some((
                &client_path,
                json!({"clientId": "gateway", "enabled": false}),
                json!({"clientId": "gateway", "enabled": true}),
            )),
            assertion_aged(&pem, &issuer, sub, &audience, 0, 600),
            "invalid_client (Invalid client or Invalid client credentials)",
        ),
    ];
    for (case, change, jwt, said) in cases {
        if let Some((path, apply, _)) = &change {
            admin.put(path, apply).unwrap();
        }
        std::fs::write(&file, &jwt).unwrap();
        let s = Stack::start(Setup {
            policy: "  allowed_tools: [up_read]",
            url: Some(url.clone()),
            connection: &jwt_bearer(&audience, &file, &secret_file),
            expect: HealthState::NeedsCredentials,
            ..Setup::default()
        })
        .await;
        let reason = s.gateway.connections()[0]
            .health()
            .reason
            .unwrap_or_default();
        assert_eq!(
            reason,
            format!("upstream_token_unavailable: the token endpoint refused: {said}"),
            "{case}"
        );
        let session = s.session().await;
        let refused = s.call(&session, json!(1), "up_read", json!({})).await;
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(said), "{case}: {refused}");
        assert!(!refused.to_string().contains(&jwt), "{case}");
        let audit = std::fs::read_to_string(&s.audit).unwrap();
        assert!(!audit.contains(&jwt), "{case}: {audit}");
        assert!(!audit.contains(SECRET), "{case}");
        assert_eq!(calls(&core), 0, "{case}: nothing reached the upstream");
        if let Some((path, _, restore)) = &change {
            admin.put(path, restore).unwrap();
        }
    }
    assert!(tokens_seen(&core).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workloads_own_jwt_is_exchanged_for_an_access_token() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let realm_name = "token-exchange";
    let (url, core) = upstream_for(kc, realm_name, Some("files-mcp"), &shutdown).await;
    let sub = "system:serviceaccount:agents:agent";
    let (pem, jwk) = ec_key("sa-1");
    let issuer = issuer_serving(json!({"keys": [jwk]}), &shutdown).await;
    let admin = kc.admin().unwrap();
    admin.realm(realm_name).unwrap();
    // The workloads' issuer as an OpenID provider whose tokens may be
    // exchanged (a ServiceAccount token has no `typ` and no userinfo).
    admin
        .post(
            &format!("/{realm_name}/identity-provider/instances"),
            &json!({"alias": "workloads", "providerId": "oidc", "enabled": true, "config": {
                "issuer": issuer, "jwksUrl": format!("{issuer}/jwks"), "useJwksUrl": "true",
                "validateSignature": "true", "disableUserInfo": "true", "disableTypeClaimCheck": "true",
                "syncMode": "IMPORT", "clientId": "unused", "clientSecret": "unused",
                "authorizationUrl": format!("{issuer}/authorize"), "tokenUrl": format!("{issuer}/token")}}),
        )
        .unwrap();
    let gateway = admin
        .gateway_for(realm_name, &url, &json!({"secret": SECRET}))
        .unwrap();
    admin
        .allow_token_exchange(realm_name, "workloads", &gateway)
        .unwrap();
    let dir = scratch("aip-oauth-");
    let (file, secret_file) = (dir.path().join("token"), dir.path().join("secret"));
    std::fs::write(&secret_file, SECRET).unwrap();
    let jwt = assertion_aged(&pem, &issuer, sub, "gateway", 0, 600);
    std::fs::write(&file, &jwt).unwrap();
    let connection = format!(
        "  auth:\n    tokenExchange:\n      issuer: {}\n      clientId: gateway\n      clientSecret: {{valueFrom: {{file: {}}}}}\n      subjectTokenFile: {}\n      subjectIssuer: workloads\n      sendResource: false\n",
        kc.issuer(realm_name),
        secret_file.display(),
        file.display()
    );
    let stack = |expect| {
        Stack::start(Setup {
            policy: "  allowed_tools: [up_read]",
            url: Some(url.clone()),
            connection: &connection,
            expect,
            ..Setup::default()
        })
    };
    let s = stack(HealthState::Healthy).await;
    reads_once(&s, &core).await;
    drop(s);
    // The exchange made the workload a user of the realm; disabled, it is
    // refused a token, and nothing more reaches the upstream.
    let users = admin
        .get(&format!("/{realm_name}/users?briefRepresentation=true"))
        .unwrap();
    let user = users.as_array().unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    admin
        .put(
            &format!("/{realm_name}/users/{user}"),
            &json!({"enabled": false}),
        )
        .unwrap();
    let s = stack(HealthState::NeedsCredentials).await;
    let reason = s.gateway.connections()[0]
        .health()
        .reason
        .unwrap_or_default();
    assert!(
        reason.starts_with("upstream_token_unavailable: the token endpoint refused: invalid_token"),
        "{reason}"
    );
    assert!(!reason.contains(&jwt));
    let session = s.session().await;
    let refused = s.call(&session, json!(1), "up_read", json!({})).await;
    assert!(refused.get("error").is_some(), "{refused}");
    assert_eq!(calls(&core), 1, "only the first call reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_at_the_authorization_server_needs_no_restart() {
    let kc = keycloak::shared().await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (url, core) = upstream(kc, "cc-rotation", &shutdown).await;
    realm(kc, "cc-rotation", &url, json!({"secret": SECRET}));
    let admin = kc.admin().unwrap();
    // Tokens of 10 s: the gateway asks again after 8.
    admin
        .put("/cc-rotation", &json!({"accessTokenLifespan": 10}))
        .unwrap();
    let (s, _dir) = secret_stack(kc, "cc-rotation", &url, SECRET, None, HealthState::Healthy).await;
    let session = reads_once(&s, &core).await;
    // A new signing key, and the old one gone: every token from now on is
    // signed by a key the upstream has not seen (it fetches the JWKS again).
    let realm_id = admin.get("/cc-rotation").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let keys = admin
        .get("/cc-rotation/components?type=org.keycloak.keys.KeyProvider")
        .unwrap();
    let old: Vec<String> = keys
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["providerId"] == "rsa-generated")
        .map(|k| k["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!old.is_empty(), "{keys}");
    admin
        .post(
            "/cc-rotation/components",
            &json!({"name": "rotated", "providerId": "rsa-generated",
                "providerType": "org.keycloak.keys.KeyProvider", "parentId": realm_id,
                "config": {"priority": ["200"], "active": ["true"], "enabled": ["true"],
                    "algorithm": ["RS256"], "keySize": ["2048"]}}),
        )
        .unwrap();
    for id in &old {
        admin
            .delete(&format!("/cc-rotation/components/{id}"))
            .unwrap();
    }
    // Calls go on through the refresh, which brings a token of the new key.
    let id = reads_until_a_second_token(&s, &core, &session, "no token of the new key").await;
    let read = s.call(&session, json!(id), "up_read", json!({})).await;
    assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
}

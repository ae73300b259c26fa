//! Keycloak, the authorization server of the upstream-identity tests
//! (docs/upstream-auth.md): `scripts/ensure-keycloak.sh` puts the pinned
//! `keycloak-quarkus-dist` in `target/keycloak` once; each test binary
//! starts its own copy in dev mode (an in-memory database) on free
//! loopback ports, under the same watchdog as the control plane, so it
//! stops when the test process does. Tests configure realms and clients
//! through the admin REST API ([`Admin`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::OnceCell;

use crate::Error;
use crate::process::Supervised;

/// How long a start may take on the loaded 2-core machine (the first start
/// of a copy also runs Quarkus's build step).
const READY_WITHIN: Duration = Duration::from_secs(240);
/// The features the tests turn on: RFC 8707 resource indicators
/// (experimental), and token exchange V1 with the fine-grained admin
/// permissions V1 it is configured by (deprecated previews; 26.7's
/// standard token exchange takes only Keycloak's own tokens, so an
/// external subject token needs V1). Federated client authentication and
/// the JWT authorization grant are on by default in 26.7.
pub const FEATURES: &str = "resource-indicators,token-exchange,admin-fine-grained-authz:v1";

pub struct Keycloak {
    url: String,
    admin_password: String,
    started_in: Duration,
    process: std::sync::Mutex<Supervised>,
}

static SHARED: OnceCell<Result<Keycloak, Error>> = OnceCell::const_new();

/// The test binary's Keycloak, started on first use and shared by its
/// tests (each in realms of its own).
///
/// # Panics
///
/// If it cannot be started; every later call panics with the same error.
pub async fn shared() -> &'static Keycloak {
    let started = SHARED
        .get_or_init(|| async {
            let started = tokio::task::spawn_blocking(Keycloak::start)
                .await
                .unwrap_or_else(|e| Err(Error::Setup(format!("the start panicked: {e}"))));
            if let Ok(k) = &started {
                // Straight to the process's stderr, past the test harness's
                // capture: `make test` shows how long each start took.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "aip-kube-test: keycloak {} ready in {:.1} s",
                    k.url,
                    k.started_in.as_secs_f64()
                );
            }
            started
        })
        .await;
    match started {
        Ok(k) => k,
        Err(e) => panic!("Keycloak is not available: {e}"),
    }
}

impl Keycloak {
    fn start() -> Result<Keycloak, Error> {
        let root = crate::local::workspace_root();
        let ensure = root.join("scripts/ensure-keycloak.sh");
        let out = Command::new(&ensure)
            .output()
            .map_err(Error::io("cannot run", &ensure))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "{} failed: {}",
                ensure.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let cache = root.join("target/keycloak");
        let java_home = std::fs::read_to_string(cache.join("java-home"))
            .map_err(Error::io("cannot read", cache.join("java-home")))?;
        let home = std::fs::read_dir(&cache)
            .map_err(Error::io("cannot read", &cache))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.join("bin/kc.sh").exists())
            .ok_or_else(|| Error::Setup(format!("no Keycloak in {}", cache.display())))?;
        let dir = crate::local::fresh_dir()?;
        // A copy of its own: Keycloak writes its build and data under its
        // home, and test binaries run side by side.
        let copy = dir.join("keycloak");
        let status = Command::new("cp")
            .arg("-a")
            .arg(&home)
            .arg(&copy)
            .status()
            .map_err(Error::io("cannot copy", &home))?;
        if !status.success() {
            return Err(Error::Setup(format!(
                "cannot copy {} to {}",
                home.display(),
                copy.display()
            )));
        }
        let (port, management) = two_free_ports()?;
        // On the test node, its address: the node's pods reach it there
        // (an interface of the node's own network namespace); else loopback.
        let host = if std::env::var_os(crate::node::ENV).is_some() {
            crate::node::NODE_ADDRESS
        } else {
            "127.0.0.1"
        };
        let url = format!("http://{host}:{port}");
        let admin_password = format!("{:032x}", rand::random::<u128>());
        let args: Vec<String> = vec![
            format!("JAVA_HOME={}", java_home.trim()),
            "KC_BOOTSTRAP_ADMIN_USERNAME=admin".to_owned(),
            format!("KC_BOOTSTRAP_ADMIN_PASSWORD={admin_password}"),
            copy.join("bin/kc.sh").display().to_string(),
            "start-dev".to_owned(),
            "--db=dev-mem".to_owned(),
            format!("--http-host={host}"),
            format!("--http-port={port}"),
            format!("--http-management-port={management}"),
            "--health-enabled=true".to_owned(),
            format!("--hostname={url}"),
            format!("--features={FEATURES}"),
        ];
        let started = Instant::now();
        let mut process = Supervised::spawn(
            "keycloak",
            Path::new("/usr/bin/env"),
            &args,
            &dir,
            Some(&dir),
        )?;
        let ready = format!("http://{host}:{management}/health/ready");
        let mut last;
        loop {
            if let Some(status) = process.exit_status() {
                return Err(process.exited_error(status));
            }
            match ureq::get(&ready).call() {
                Ok(_) => break,
                Err(e) => last = e.to_string(),
            }
            if started.elapsed() > READY_WITHIN {
                return Err(Error::NotReady {
                    process: "keycloak",
                    waited: READY_WITHIN,
                    last,
                    log: process.log.clone(),
                    tail: process.tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(Keycloak {
            url,
            admin_password,
            started_in: started.elapsed(),
            process: std::sync::Mutex::new(process),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The issuer of realm `realm`'s tokens.
    pub fn issuer(&self, realm: &str) -> String {
        format!("{}/realms/{realm}", self.url)
    }

    /// How long it took to be ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The log file of the process.
    pub fn log(&self) -> PathBuf {
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .log
            .clone()
    }

    /// The admin REST API, as the bootstrap administrator (a token of its
    /// own, good for a minute).
    pub fn admin(&self) -> Result<Admin, String> {
        let token: Value = ureq::post(format!(
            "{}/realms/master/protocol/openid-connect/token",
            self.url
        ))
        .send_form([
            ("grant_type", "password"),
            ("client_id", "admin-cli"),
            ("username", "admin"),
            ("password", self.admin_password.as_str()),
        ])
        .map_err(|e| format!("admin token: {e}"))?
        .body_mut()
        .read_json()
        .map_err(|e| format!("admin token: {e}"))?;
        let token = token["access_token"]
            .as_str()
            .ok_or("admin token: no access_token")?
            .to_owned();
        Ok(Admin {
            base: format!("{}/admin/realms", self.url),
            token,
        })
    }
}

/// Keycloak's admin REST API (`/admin/realms/...`).
pub struct Admin {
    base: String,
    token: String,
}

impl Admin {
    /// POST `body` to `path` (under /admin/realms); the id the answer's
    /// Location names, if any.
    pub fn post(&self, path: &str, body: &Value) -> Result<Option<String>, String> {
        let url = format!("{}{path}", self.base);
        let response = ureq::post(&url)
            .header("authorization", &format!("Bearer {}", self.token))
            .send_json(body)
            .map_err(|e| format!("POST {url}: {e}"))?;
        Ok(response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .and_then(|l| l.rsplit('/').next())
            .map(str::to_owned))
    }

    /// PUT `body` to `path`.
    pub fn put(&self, path: &str, body: &Value) -> Result<(), String> {
        let url = format!("{}{path}", self.base);
        ureq::put(&url)
            .header("authorization", &format!("Bearer {}", self.token))
            .send_json(body)
            .map_err(|e| format!("PUT {url}: {e}"))?;
        Ok(())
    }

    /// GET `path` as JSON.
    pub fn get(&self, path: &str) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        ureq::get(&url)
            .header("authorization", &format!("Bearer {}", self.token))
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?
            .body_mut()
            .read_json()
            .map_err(|e| format!("GET {url}: {e}"))
    }

    /// DELETE `path`.
    pub fn delete(&self, path: &str) -> Result<(), String> {
        let url = format!("{}{path}", self.base);
        ureq::delete(&url)
            .header("authorization", &format!("Bearer {}", self.token))
            .call()
            .map_err(|e| format!("DELETE {url}: {e}"))?;
        Ok(())
    }

    /// Lets the client with internal id `client` exchange tokens of the
    /// identity provider `idp` in `realm` (token exchange V1: the
    /// provider's `token-exchange` permission, given a client policy
    /// naming that client).
    pub fn allow_token_exchange(&self, realm: &str, idp: &str, client: &str) -> Result<(), String> {
        let permissions =
            format!("/{realm}/identity-provider/instances/{idp}/management/permissions");
        self.put(&permissions, &serde_json::json!({"enabled": true}))?;
        let permission = self.get(&permissions)?["scopePermissions"]["token-exchange"]
            .as_str()
            .ok_or("the provider has no token-exchange permission")?
            .to_owned();
        let management = self.get(&format!("/{realm}/clients?clientId=realm-management"))?[0]["id"]
            .as_str()
            .ok_or("no realm-management client")?
            .to_owned();
        let server = format!("/{realm}/clients/{management}/authz/resource-server");
        let name = format!("exchange-{idp}");
        self.post(
            &format!("{server}/policy/client"),
            &serde_json::json!({"name": name, "logic": "POSITIVE", "clients": [client]}),
        )?;
        let policy = self.get(&format!("{server}/policy?name={name}"))?[0]["id"]
            .as_str()
            .ok_or("the new policy is not found")?
            .to_owned();
        let path = format!("{server}/permission/scope/{permission}");
        let mut scope_permission = self.get(&path)?;
        scope_permission["policies"] = serde_json::json!([policy]);
        self.put(&path, &scope_permission)
    }

    /// An identity provider `alias` of `realm` whose JWTs are a grant
    /// (RFC 7523 §2.1, Keycloak's JWT authorization grant): issued by
    /// `issuer`, checked with the keys at `jwks_url`, up to an hour old,
    /// each good for many requests if `reuse` (a projected token is).
    pub fn jwt_grant_provider(
        &self,
        realm: &str,
        alias: &str,
        issuer: &str,
        jwks_url: &str,
        reuse: bool,
    ) -> Result<(), String> {
        self.post(
            &format!("/{realm}/identity-provider/instances"),
            &serde_json::json!({"alias": alias, "providerId": "jwt-authorization-grant",
                "enabled": true, "config": {"issuer": issuer, "useJwksUrl": "true",
                    "jwksUrl": jwks_url,
                    "jwtAuthorizationGrantMaxAllowedAssertionExpiration": "3600",
                    "jwtAuthorizationGrantAssertionReuseAllowed": reuse.to_string()}}),
        )
        .map(|_| ())
    }

    /// The gateway's client (see [`Admin::gateway_for`]) with `secret`,
    /// allowed the JWT grant of provider `alias`; its id.
    pub fn jwt_grant_gateway(
        &self,
        realm: &str,
        url: &str,
        alias: &str,
        secret: &str,
    ) -> Result<String, String> {
        self.gateway_for(
            realm,
            url,
            &serde_json::json!({"secret": secret, "attributes": {
                "oauth2.jwt.authorization.grant.enabled": "true",
                "oauth2.jwt.authorization.grant.idp": alias}}),
        )
    }

    /// A user `username` of `realm`, linked to provider `alias` as `sub`
    /// (the JWT grant finds its user so: Keycloak does not create it); its
    /// id.
    pub fn linked_user(
        &self,
        realm: &str,
        alias: &str,
        username: &str,
        sub: &str,
    ) -> Result<String, String> {
        let user = self
            .post(
                &format!("/{realm}/users"),
                &serde_json::json!({"username": username, "enabled": true}),
            )?
            .ok_or("the new user has no Location")?;
        self.post(
            &format!("/{realm}/users/{user}/federated-identity/{alias}"),
            &serde_json::json!({"identityProvider": alias, "userId": sub, "userName": sub}),
        )?;
        Ok(user)
    }

    /// A realm of its own for one test.
    pub fn realm(&self, name: &str) -> Result<(), String> {
        let body = serde_json::json!({"realm": name, "enabled": true});
        self.post("", &body).map(|_| ())
    }

    /// Creates client `body` in `realm`; its internal id.
    pub fn client(&self, realm: &str, body: &Value) -> Result<String, String> {
        self.post(&format!("/{realm}/clients"), body)?
            .ok_or_else(|| "the new client has no Location".to_owned())
    }

    /// The gateway's client `gateway` in `realm` (`client`: how it
    /// authenticates, merged into a confidential client with service
    /// accounts), whose tokens are for the MCP server at `url` (RFC 8707):
    /// the server is the client `files-mcp` with that `resource_url`, put
    /// in the gateway's tokens by an audience mapper. Keycloak 26.7's
    /// resource indicators need a refresh token for client credentials,
    /// hence `client_credentials.use_refresh_token`. The gateway's id.
    pub fn gateway_for(&self, realm: &str, url: &str, client: &Value) -> Result<String, String> {
        self.client(
            realm,
            &serde_json::json!({"clientId": "files-mcp", "publicClient": false,
                "standardFlowEnabled": false, "attributes": {"resource_url": url}}),
        )?;
        let mut gateway = serde_json::json!({"clientId": "gateway", "publicClient": false,
            "serviceAccountsEnabled": true, "standardFlowEnabled": false,
            "attributes": {"client_credentials.use_refresh_token": "true"}});
        for (k, v) in client.as_object().into_iter().flatten() {
            if k == "attributes" {
                for (a, av) in v.as_object().into_iter().flatten() {
                    gateway["attributes"][a] = av.clone();
                }
            } else {
                gateway[k] = v.clone();
            }
        }
        let id = self.client(realm, &gateway)?;
        self.post(
            &format!("/{realm}/clients/{id}/protocol-mappers/models"),
            &serde_json::json!({"name": "files-audience", "protocol": "openid-connect",
                "protocolMapper": "oidc-audience-mapper",
                "config": {"included.client.audience": "files-mcp", "access.token.claim": "true"}}),
        )?;
        Ok(id)
    }
}

/// A fresh P-256 key: its PEM (PKCS#8) and its public JWK named `kid`
/// (for a client that signs its own assertions, or an issuer of JWTs).
///
/// # Panics
///
/// If the key cannot be generated.
pub fn ec_key(kid: &str) -> (String, Value) {
    use base64::Engine;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap_or_else(|e| panic!("cannot generate a P-256 key: {e}"));
    let point = key.public_key_raw();
    assert_eq!(point.len(), 65, "an uncompressed P-256 point");
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "x": b64(&point[1..33]),
        "y": b64(&point[33..65]), "kid": kid, "use": "sig", "alg": "ES256"});
    (key.serialize_pem(), jwk)
}

/// Serves `body` as JSON to every request on a loopback port until
/// `shutdown` (a JWKS, say, for Keycloak to fetch); its URL.
pub async fn serve_json(
    body: String,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<String> {
    let body = bytes::Bytes::from(body);
    let addr = serve_loopback(
        move |_req| {
            let mut r = hyper::Response::new(http_body_util::Full::new(body.clone()));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            async move { r }
        },
        shutdown,
    )
    .await?;
    Ok(format!("http://{addr}"))
}

/// Answers every request on a loopback port with `answer` until
/// `shutdown` (a JWKS, an upstream of the test's making); the port's
/// address.
pub async fn serve_loopback<F, Fut>(
    answer: F,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<std::net::SocketAddr>
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<http_body_util::Full<bytes::Bytes>>>
        + Send
        + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = shutdown.cancelled() => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let answered = answer(req);
                    async move { Ok::<_, std::convert::Infallible>(answered.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn two_free_ports() -> Result<(u16, u16), Error> {
    let bind = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
            .map_err(Error::io("cannot bind", "127.0.0.1:0"))
    };
    let (a, _la) = bind()?;
    let (b, _lb) = bind()?;
    Ok((a, b))
}

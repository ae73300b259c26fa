//! Access tokens for an upstream that is an OAuth 2.1 resource server
//! (docs/upstream-auth.md): the gateway is the OAuth client. It asks the
//! authorization server's token endpoint for a token with one of three
//! grants: client credentials (RFC 6749 §4.4), a JWT as the grant itself
//! (RFC 7523 §2.1) or a JWT exchanged for a token (RFC 8693), the JWT
//! being someone else's, such as the pod's projected ServiceAccount token,
//! read from its file at every request. The client authenticates with a
//! secret, with a key (RFC 7523 §2.2), with such a JWT as its assertion,
//! or not at all (a public client). Every request names the upstream as
//! the `resource` (RFC 8707); the token is cached and asked for again
//! before it expires.
//!
//! One token request at a time per connection: callers that find no fresh
//! token wait for the one request in flight and share its answer. A token
//! the upstream refused (401) is dropped once; the next caller asks anew.
//! Tokens, secrets, keys and assertions are [`SecretString`]s: they are
//! never printed, and an authorization server's error is reported by its
//! code and description with them redacted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::Value;

use crate::connection::Tls;
use crate::credentials::Credentials;

/// The largest token or metadata response read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// A token is asked for again when this little of its life is left (or a
/// fifth of it, if that is less).
const REFRESH_AHEAD: Duration = Duration::from_secs(60);
/// A token is not sent in its last moments: its `exp` is whole seconds
/// after an issue time rounded down, and the server's clock may run
/// ahead (or a fifth of its life, if that is less).
const EXPIRY_MARGIN: Duration = Duration::from_secs(5);
/// The lifetime assumed when the server gives no `expires_in`.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// The lifetime of a client assertion the gateway signs (RFC 7523 §3).
const ASSERTION_LIFETIME: Duration = Duration::from_secs(60);
/// The largest assertion file read (a projected token is about 1 KiB).
const MAX_ASSERTION_BYTES: u64 = 64 * 1024;

/// How the gateway gets tokens for one connection.
#[derive(Clone, Debug)]
pub struct OAuth {
    /// Where tokens come from: a token endpoint, or an issuer whose
    /// metadata names it (RFC 8414, then OpenID Connect discovery).
    pub server: AuthorizationServer,
    pub grant: Grant,
    pub client_id: String,
    pub client_auth: ClientAuth,
    /// Space-joined into `scope`; none: the server's default.
    pub scopes: Vec<String>,
    /// RFC 8707 `resource`: the upstream's URL unless set.
    pub resource: String,
    /// Whether `resource` is sent: false for an authorization server that
    /// mishandles RFC 8707 (the token's audience is then its own choice).
    pub send_resource: bool,
    /// Each token request's deadline.
    pub timeout: Duration,
    /// TLS for the authorization server.
    pub tls: Tls,
}

impl OAuth {
    /// How tokens are had, for a condition's message: the grant, where,
    /// as which client and how it authenticates (never a secret).
    pub fn describe(&self) -> String {
        let server = match &self.server {
            AuthorizationServer::TokenEndpoint(e) => format!("token endpoint {e}"),
            AuthorizationServer::Issuer(i) => format!("issuer {i}"),
            AuthorizationServer::FromResource => {
                format!(
                    "the authorization server {}'s metadata names",
                    self.resource
                )
            }
        };
        format!(
            "{} from {server} as client {} ({})",
            self.grant.name(),
            self.client_id,
            self.client_auth.method()
        )
    }

    /// Whether `other` asks for tokens exactly as this does (secrets
    /// included): a reload keeps the connection, and its token.
    pub fn same_as(&self, other: &OAuth) -> bool {
        self.server == other.server
            && self.grant == other.grant
            && self.client_id == other.client_id
            && self.client_auth.same_as(&other.client_auth)
            && self.scopes == other.scopes
            && self.resource == other.resource
            && self.send_resource == other.send_resource
            && self.timeout == other.timeout
            && self.tls == other.tls
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorizationServer {
    TokenEndpoint(String),
    Issuer(String),
    /// Found as MCP authorization says: the resource's RFC 9728 metadata
    /// names its authorization server, whose metadata names the token
    /// endpoint.
    FromResource,
}

/// What the gateway shows the token endpoint to be given a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// RFC 6749 §4.4: the client's own authentication is the grant.
    ClientCredentials,
    /// RFC 7523 §2.1: a JWT someone else issued (the pod's projected
    /// ServiceAccount token), read from this file at every request, is
    /// the grant: workload identity federation.
    JwtBearer { assertion: PathBuf },
    /// RFC 8693: that JWT is the subject token, exchanged for an access
    /// token for `audience` (and the resource).
    TokenExchange {
        subject_token: PathBuf,
        audience: Option<String>,
        /// Who issued the subject token, as the authorization server names
        /// it (Keycloak: the identity provider's alias), when it asks.
        subject_issuer: Option<String>,
    },
}

impl Grant {
    /// The name the docs and the CRD use.
    pub fn name(&self) -> &'static str {
        match self {
            Grant::ClientCredentials => "clientCredentials",
            Grant::JwtBearer { .. } => "jwtBearer",
            Grant::TokenExchange { .. } => "tokenExchange",
        }
    }

    /// The name as a Kubernetes condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Grant::ClientCredentials => "ClientCredentials",
            Grant::JwtBearer { .. } => "JwtBearer",
            Grant::TokenExchange { .. } => "TokenExchange",
        }
    }
}

/// How the gateway authenticates itself to the token endpoint.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// `client_secret_basic`: HTTP Basic with the client id and secret.
    SecretBasic(SecretString),
    /// `client_secret_post`: both in the form.
    SecretPost(SecretString),
    /// `private_key_jwt` (RFC 7523 §2.2): an assertion the gateway signs
    /// with this PEM private key (RSA or EC), `kid` when given.
    PrivateKeyJwt {
        key_pem: SecretString,
        key_id: Option<String>,
    },
    /// RFC 7523 §2.2 with an assertion someone else issued, read from a
    /// file at every request (the kubelet rotates a projected
    /// ServiceAccount token in place): federated client authentication.
    AssertionFile(PathBuf),
    /// None: a public client, named by `client_id` in the form (for the
    /// JWT grants, whose JWT says who asks).
    None,
}

impl ClientAuth {
    fn same_as(&self, other: &ClientAuth) -> bool {
        let same = |a: &SecretString, b: &SecretString| a.expose_secret() == b.expose_secret();
        match (self, other) {
            (ClientAuth::SecretBasic(a), ClientAuth::SecretBasic(b))
            | (ClientAuth::SecretPost(a), ClientAuth::SecretPost(b)) => same(a, b),
            (
                ClientAuth::PrivateKeyJwt {
                    key_pem: a,
                    key_id: i,
                },
                ClientAuth::PrivateKeyJwt {
                    key_pem: b,
                    key_id: j,
                },
            ) => same(a, b) && i == j,
            (ClientAuth::AssertionFile(a), ClientAuth::AssertionFile(b)) => a == b,
            (ClientAuth::None, ClientAuth::None) => true,
            _ => false,
        }
    }

    /// The RFC 8414 name of the method.
    pub fn method(&self) -> &'static str {
        match self {
            ClientAuth::SecretBasic(_) => "client_secret_basic",
            ClientAuth::SecretPost(_) => "client_secret_post",
            ClientAuth::PrivateKeyJwt { .. } => "private_key_jwt",
            ClientAuth::AssertionFile(_) => "private_key_jwt (federated assertion)",
            ClientAuth::None => "none",
        }
    }
}

/// Why no token could be had. The text names the authorization server's
/// error code and never a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token endpoint cannot be reached: {0}")]
    Unreachable(String),
    #[error("the token endpoint did not answer within {0:?}")]
    Timeout(Duration),
    /// The server's RFC 6749 §5.2 error (`invalid_client`, `invalid_grant`,
    /// `invalid_target`, ...), with its description.
    #[error("the token endpoint refused: {code}{}", .description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        code: String,
        description: Option<String>,
    },
    #[error("the token endpoint answered HTTP {0} without an OAuth error")]
    Status(u16),
    #[error("the token endpoint's answer is not a token: {0}")]
    Malformed(String),
    #[error("authorization server metadata: {0}")]
    Discovery(String),
    #[error("client assertion: {0}")]
    Assertion(String),
}

impl TokenError {
    /// A Kubernetes condition reason: the authorization server's error
    /// code in CamelCase (`invalid_grant`: InvalidGrant), or what failed.
    pub fn reason(&self) -> String {
        match self {
            TokenError::Unreachable(_) => "TokenEndpointUnreachable".into(),
            TokenError::Timeout(_) => "TokenEndpointTimeout".into(),
            TokenError::Refused { code, .. } => camel(code),
            TokenError::Status(_) => "TokenEndpointFailed".into(),
            TokenError::Malformed(_) => "MalformedTokenResponse".into(),
            TokenError::Discovery(_) => "DiscoveryFailed".into(),
            TokenError::Assertion(_) => "AssertionUnreadable".into(),
        }
    }
}

fn camel(code: &str) -> String {
    let out: String = code
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        "Refused".to_owned()
    } else {
        out
    }
}

/// A token in hand, with the header that carries it (built once, marked
/// sensitive).
pub struct Token {
    value: SecretString,
    header: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

impl Token {
    /// `Authorization: Bearer ...`, as sent.
    pub fn header(&self) -> &HeaderValue {
        &self.header
    }
}

/// Tokens for one connection.
pub struct TokenSource {
    oauth: OAuth,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The token in hand: read by every call without waiting on anything.
    current: std::sync::RwLock<Option<Arc<Token>>>,
    /// Held across a token request: the one request in flight.
    state: tokio::sync::Mutex<State>,
    /// Everything secret this source sends, for redacting what the
    /// authorization server says.
    secrets: Credentials,
    /// The tokens handed out (the current one and the one before), in
    /// every spelling: what the upstream must not echo to an agent.
    issued: std::sync::RwLock<std::sync::Arc<Credentials>>,
}

#[derive(Default)]
struct State {
    endpoint: Option<String>,
    requests: u64,
    /// After a failed request: no other before this, and its error, so
    /// that an authorization server that is down or refuses is not asked
    /// once per call.
    failed: Option<(Instant, TokenError)>,
}

/// How long after a failed token request the next may go.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("server", &self.oauth.server)
            .field("grant", &self.oauth.grant.name())
            .field("client_id", &self.oauth.client_id)
            .field("client_auth", &self.oauth.client_auth.method())
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    token_type: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl TokenSource {
    pub fn new(oauth: OAuth) -> Result<TokenSource, String> {
        let connector = crate::http::connector_for(&oauth.client_id, &oauth.tls)?;
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        let mut secrets = Vec::new();
        match &oauth.client_auth {
            ClientAuth::SecretBasic(s) | ClientAuth::SecretPost(s) => {
                secrets.push(("secret".to_owned(), s.clone()));
            }
            ClientAuth::PrivateKeyJwt { .. } | ClientAuth::AssertionFile(_) | ClientAuth::None => {}
        }
        Ok(TokenSource {
            issued: std::sync::RwLock::new(Arc::new(Credentials::new(&[]))),
            current: std::sync::RwLock::new(None),
            secrets: Credentials::new(&secrets),
            oauth,
            client,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    /// A token that is not about to expire: the one held (no waiting), or
    /// a new one, asked for by one caller while the others wait for it.
    pub async fn bearer(&self) -> Result<Arc<Token>, TokenError> {
        if let Some(token) = self.held().filter(|t| Instant::now() < t.refresh_at) {
            return Ok(token);
        }
        let mut state = self.state.lock().await;
        let now = Instant::now();
        // Another caller may have asked while this one waited.
        let held = self.held();
        if let Some(token) = held.clone().filter(|t| now < t.refresh_at) {
            return Ok(token);
        }
        let usable = held.filter(|t| now < t.expires_at);
        if let Some((until, error)) = &state.failed
            && now < *until
        {
            return usable.ok_or_else(|| error.clone());
        }
        match self.request(&mut state).await {
            Ok(token) => {
                let token = Arc::new(token);
                let mut issued = vec![("token".to_owned(), token.value.clone())];
                if let Some(previous) = self.held() {
                    issued.push(("previous".to_owned(), previous.value.clone()));
                }
                *write(&self.issued) = Arc::new(Credentials::new(&issued));
                *write(&self.current) = Some(token.clone());
                state.failed = None;
                Ok(token)
            }
            Err(e) => {
                state.failed = Some((Instant::now() + RETRY_AFTER_FAILURE, e.clone()));
                match usable {
                    // A token still inside its life serves while a refresh
                    // fails (the failure is reported when it has run out).
                    Some(token) => {
                        tracing::warn!(client_id = %self.oauth.client_id, error = %e, "token refresh failed; the current token serves until it expires");
                        Ok(token)
                    }
                    None => {
                        *write(&self.current) = None;
                        Err(e)
                    }
                }
            }
        }
    }

    /// The upstream refused `token` (401): it is dropped if it is still
    /// the one held, so that the next caller asks for a new one.
    pub fn refused(&self, token: &Arc<Token>) {
        let mut current = write(&self.current);
        if current.as_ref().is_some_and(|t| Arc::ptr_eq(t, token)) {
            *current = None;
        }
    }

    fn held(&self) -> Option<Arc<Token>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces every spelling of a token this source handed out (the
    /// current one and the one before) in `value`: a server that echoes
    /// its access token does not hand it to the agent. How many were found.
    pub fn redact(&self, value: &mut Value) -> usize {
        let issued = self
            .issued
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        issued.redact(value)
    }

    /// How many token requests this source has made.
    pub async fn requests(&self) -> u64 {
        self.state.lock().await.requests
    }

    async fn request(&self, state: &mut State) -> Result<Token, TokenError> {
        let endpoint = match &state.endpoint {
            Some(e) => e.clone(),
            None => {
                let e = self.token_endpoint().await?;
                state.endpoint = Some(e.clone());
                e
            }
        };
        state.requests += 1;
        let mut form: Vec<(&str, String)> = Vec::new();
        let mut extra = Vec::new();
        match &self.oauth.grant {
            Grant::ClientCredentials => form.push(("grant_type", "client_credentials".to_owned())),
            Grant::JwtBearer { assertion } => {
                form.push(("grant_type", JWT_BEARER_GRANT.to_owned()));
                extra.push(("assertion", read_assertion(assertion)?));
            }
            Grant::TokenExchange {
                subject_token,
                audience,
                subject_issuer,
            } => {
                form.push(("grant_type", TOKEN_EXCHANGE_GRANT.to_owned()));
                form.push(("subject_token_type", JWT_TOKEN_TYPE.to_owned()));
                form.push(("requested_token_type", ACCESS_TOKEN_TYPE.to_owned()));
                if let Some(audience) = audience {
                    form.push(("audience", audience.clone()));
                }
                if let Some(issuer) = subject_issuer {
                    form.push(("subject_issuer", issuer.clone()));
                }
                extra.push(("subject_token", read_assertion(subject_token)?));
            }
        }
        if !self.oauth.scopes.is_empty() {
            form.push(("scope", self.oauth.scopes.join(" ")));
        }
        if self.oauth.send_resource {
            form.push(("resource", self.oauth.resource.clone()));
        }
        let mut basic = None;
        match &self.oauth.client_auth {
            ClientAuth::SecretBasic(secret) => basic = Some(secret),
            ClientAuth::SecretPost(secret) => {
                form.push(("client_id", self.oauth.client_id.clone()));
                extra.push(("client_secret", secret.clone()));
            }
            ClientAuth::PrivateKeyJwt { key_pem, key_id } => {
                let assertion = self.signed_assertion(&endpoint, key_pem, key_id.as_deref())?;
                form.push(("client_id", self.oauth.client_id.clone()));
                form.push(("client_assertion_type", JWT_BEARER_ASSERTION.to_owned()));
                extra.push(("client_assertion", assertion));
            }
            ClientAuth::AssertionFile(path) => {
                // The assertion names the client (its `sub`); client_id is
                // left out, as federated client authentication expects.
                let assertion = read_assertion(path)?;
                form.push(("client_assertion_type", JWT_BEARER_ASSERTION.to_owned()));
                extra.push(("client_assertion", assertion));
            }
            ClientAuth::None => form.push(("client_id", self.oauth.client_id.clone())),
        }
        let body = {
            // (The serializer is not Send: it lives in this block only.)
            let mut body = form_urlencoded::Serializer::new(String::new());
            for (k, v) in &form {
                body.append_pair(k, v);
            }
            for (k, v) in &extra {
                body.append_pair(k, v.expose_secret());
            }
            SecretString::from(body.finish())
        };
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(&endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json");
        if let Some(secret) = basic {
            let pair = format!(
                "{}:{}",
                form_encode(&self.oauth.client_id),
                form_encode(secret.expose_secret())
            );
            let mut value = HeaderValue::from_str(&format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
            .map_err(|_| TokenError::Malformed("the client id cannot be sent".into()))?;
            value.set_sensitive(true);
            request = request.header("authorization", value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.expose_secret().to_owned())))
            .map_err(|e| TokenError::Unreachable(e.to_string()))?;
        let sent_at = Instant::now();
        let (status, bytes) = self.exchange(request).await?;
        if status != StatusCode::OK {
            // What was sent is redacted from what is shown too (an
            // assertion read from a file this time, say).
            let sent = Credentials::new(
                &extra
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect::<Vec<_>>(),
            );
            let shown = |text: &str, max: usize| self.shown(text, max, &sent);
            return Err(match serde_json::from_slice::<ErrorResponse>(&bytes) {
                Ok(e) => TokenError::Refused {
                    code: shown(&e.error, 64),
                    description: e.error_description.map(|d| shown(&d, 200)),
                },
                Err(_) => TokenError::Status(status.as_u16()),
            });
        }
        let answer: TokenResponse = serde_json::from_slice(&bytes)
            .map_err(|e| TokenError::Malformed(strip_content(&e.to_string())))?;
        if !answer.token_type.eq_ignore_ascii_case("bearer") {
            return Err(TokenError::Malformed(format!(
                "token_type {:?}, not Bearer",
                self.shown(&answer.token_type, 32, &Credentials::new(&[]))
            )));
        }
        if answer.access_token.is_empty() {
            return Err(TokenError::Malformed("an empty access_token".into()));
        }
        let lifetime = answer
            .expires_in
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let ahead = REFRESH_AHEAD.min(lifetime / 5);
        let margin = EXPIRY_MARGIN.min(lifetime / 5);
        let mut header = HeaderValue::from_str(&format!("Bearer {}", answer.access_token))
            .map_err(|_| TokenError::Malformed("the access_token is not a header value".into()))?;
        header.set_sensitive(true);
        Ok(Token {
            value: SecretString::from(answer.access_token),
            header,
            refresh_at: sent_at + lifetime.saturating_sub(ahead),
            expires_at: sent_at + lifetime.saturating_sub(margin),
        })
    }

    /// The token endpoint: given, or from the issuer's metadata (the
    /// issuer given, or named by the resource's metadata).
    async fn token_endpoint(&self) -> Result<String, TokenError> {
        let issuer = match &self.oauth.server {
            AuthorizationServer::TokenEndpoint(e) => return Ok(e.clone()),
            AuthorizationServer::Issuer(i) => i.trim_end_matches('/').to_owned(),
            AuthorizationServer::FromResource => self.resource_issuer().await?,
        };
        let (url, metadata) = self
            .metadata(metadata_urls(&issuer), "issuer", &issuer)
            .await?;
        metadata
            .get("token_endpoint")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| TokenError::Discovery(format!("{url} names no token_endpoint")))
    }

    /// The authorization server the resource's RFC 9728 metadata names
    /// (its first), as MCP authorization finds it: at the URL the
    /// resource's own 401 names (`WWW-Authenticate: Bearer
    /// resource_metadata=...`), else at the well-known URL with the
    /// resource's path, then without it. The metadata must name this
    /// resource.
    async fn resource_issuer(&self) -> Result<String, TokenError> {
        let resource = self.oauth.resource.trim_end_matches('/');
        let mut urls = resource_metadata_urls(resource);
        if let Some(named) = self.challenged_metadata_url().await
            && !urls.contains(&named)
        {
            urls.insert(0, named);
        }
        let (url, metadata) = self.metadata(urls, "resource", resource).await?;
        metadata
            .get("authorization_servers")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .map(|s| s.trim_end_matches('/').to_owned())
            .ok_or_else(|| TokenError::Discovery(format!("{url} names no authorization server")))
    }

    /// The metadata URL the resource names when asked without a token: an
    /// MCP POST (nothing it would act on: a request without a token is
    /// refused before it is read), its 401's challenge. None when it does
    /// not answer so.
    async fn challenged_metadata_url(&self) -> Option<String> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(&self.oauth.resource)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#,
            )))
            .ok()?;
        let timeout = self.oauth.timeout;
        let response = tokio::time::timeout(timeout, self.client.request(request))
            .await
            .ok()?
            .ok()?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return None;
        }
        response
            .headers()
            .get_all(hyper::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(crate::failure::resource_metadata)
    }

    /// The first of `urls` that answers a metadata document; it must say
    /// `field` is `expected` (an issuer, a resource). The URL and the
    /// document.
    async fn metadata(
        &self,
        urls: Vec<String>,
        field: &str,
        expected: &str,
    ) -> Result<(String, Value), TokenError> {
        let mut tried = Vec::new();
        for url in urls {
            let request = Request::builder()
                .method(Method::GET)
                .uri(&url)
                .header("accept", "application/json")
                .body(Full::new(Bytes::new()))
                .map_err(|e| TokenError::Discovery(format!("{url}: {e}")))?;
            let (status, bytes) = match self.exchange(request).await {
                Ok(answer) => answer,
                Err(e) => {
                    tried.push(format!("{url}: {e}"));
                    continue;
                }
            };
            if status != StatusCode::OK {
                tried.push(format!("{url}: HTTP {}", status.as_u16()));
                continue;
            }
            let metadata: Value = serde_json::from_slice(&bytes).map_err(|e| {
                TokenError::Discovery(format!(
                    "{url}: not JSON: {}",
                    strip_content(&e.to_string())
                ))
            })?;
            let said = metadata
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default();
            if said.trim_end_matches('/') != expected {
                return Err(TokenError::Discovery(format!(
                    "{url} names {field} {said:?}, not {expected:?}"
                )));
            }
            return Ok((url, metadata));
        }
        Err(TokenError::Discovery(format!(
            "no metadata naming {field} {expected}: {}",
            tried.join("; ")
        )))
    }

    /// One request and its whole (bounded) answer, within the deadline.
    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), TokenError> {
        let timeout = self.oauth.timeout;
        let answer = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| TokenError::Unreachable(crate::http::network_text(&e)))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| TokenError::Malformed(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| TokenError::Timeout(timeout))?
    }

    /// An RFC 7523 §3 client assertion signed with the client's key.
    fn signed_assertion(
        &self,
        audience: &str,
        key_pem: &SecretString,
        key_id: Option<&str>,
    ) -> Result<SecretString, TokenError> {
        let pem = key_pem.expose_secret().as_bytes();
        let (key, algorithm) = match jsonwebtoken::EncodingKey::from_rsa_pem(pem) {
            Ok(k) => (k, jsonwebtoken::Algorithm::RS256),
            Err(_) => match jsonwebtoken::EncodingKey::from_ec_pem(pem) {
                Ok(k) => (k, jsonwebtoken::Algorithm::ES256),
                Err(_) => {
                    return Err(TokenError::Assertion(
                        "the private key is neither an RSA nor a P-256 PEM key".into(),
                    ));
                }
            },
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut jti = [0u8; 16];
        rand::fill(&mut jti);
        let claims = serde_json::json!({
            "iss": self.oauth.client_id,
            "sub": self.oauth.client_id,
            "aud": audience,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME.as_secs(),
            "jti": hex_of(&jti),
        });
        let mut header = jsonwebtoken::Header::new(algorithm);
        header.kid = key_id.map(str::to_owned);
        jsonwebtoken::encode(&header, &claims, &key)
            .map(SecretString::from)
            .map_err(|e| TokenError::Assertion(format!("cannot sign: {e}")))
    }

    /// Server text as it may be shown: this source's secrets and what was
    /// `sent` redacted,
    /// control characters dropped, cut to `max` characters.
    fn shown(&self, text: &str, max: usize, sent: &Credentials) -> String {
        let mut value = Value::String(text.to_owned());
        self.secrets.redact(&mut value);
        sent.redact(&mut value);
        let text = value.as_str().unwrap_or_default();
        text.chars().filter(|c| !c.is_control()).take(max).collect()
    }
}

fn write<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const JWT_BEARER_ASSERTION: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// RFC 8414 §3.1 (the well-known segment before the issuer's path), then
/// OpenID Connect discovery (after it).
fn metadata_urls(issuer: &str) -> Vec<String> {
    vec![
        well_known(issuer, "oauth-authorization-server"),
        format!("{issuer}/.well-known/openid-configuration"),
    ]
}

/// RFC 9728 §3.1: the well-known segment inserted before the resource's
/// path; then at the origin alone (as MCP authorization allows).
fn resource_metadata_urls(resource: &str) -> Vec<String> {
    let mut urls = vec![well_known(resource, "oauth-protected-resource")];
    let at_origin = well_known(origin(resource), "oauth-protected-resource");
    if at_origin != urls[0] {
        urls.push(at_origin);
    }
    urls
}

/// `url` with `/.well-known/NAME` inserted between its origin and its path
/// (RFC 8414 §3.1, RFC 9728 §3.1).
fn well_known(url: &str, name: &str) -> String {
    let origin = origin(url);
    format!("{origin}/.well-known/{name}{}", &url[origin.len()..])
}

/// `scheme://authority` of `url`.
fn origin(url: &str) -> &str {
    match url.find("://").map(|i| i + 3) {
        Some(start) => url[start..]
            .find('/')
            .map_or(url, |slash| &url[..start + slash]),
        None => url,
    }
}

/// A projected token (or any assertion) from its file, read whole and
/// bounded; the file's name is in the error, its content never.
fn read_assertion(path: &std::path::Path) -> Result<SecretString, TokenError> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_ASSERTION_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| TokenError::Assertion(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_ASSERTION_BYTES {
        return Err(TokenError::Assertion(format!(
            "{} is larger than {MAX_ASSERTION_BYTES} bytes",
            path.display()
        )));
    }
    let text = text.trim();
    if text.split('.').count() != 3 {
        return Err(TokenError::Assertion(format!(
            "{} does not hold a JWT",
            path.display()
        )));
    }
    Ok(SecretString::from(text.to_owned()))
}

/// `application/x-www-form-urlencoded` of one value (RFC 6749 §2.3.1 asks
/// for it inside HTTP Basic too).
fn form_encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// serde_json's message without the text it quotes.
fn strip_content(message: &str) -> String {
    message
        .split(" at line")
        .next()
        .unwrap_or(message)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_as_rfc_8414_then_oidc_say() {
        assert_eq!(
            metadata_urls("http://127.0.0.1:8080/realms/aip"),
            [
                "http://127.0.0.1:8080/.well-known/oauth-authorization-server/realms/aip",
                "http://127.0.0.1:8080/realms/aip/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example"),
            [
                "https://as.example/.well-known/oauth-authorization-server",
                "https://as.example/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn resource_metadata_is_looked_for_with_the_path_then_at_the_origin() {
        assert_eq!(
            resource_metadata_urls("http://127.0.0.1:9/mcp"),
            [
                "http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp",
                "http://127.0.0.1:9/.well-known/oauth-protected-resource"
            ]
        );
    }

    #[test]
    fn every_token_error_is_a_condition_reason_of_the_failure_it_causes() {
        let errors = [
            TokenError::Unreachable("connection refused".into()),
            TokenError::Timeout(Duration::from_secs(5)),
            TokenError::Refused {
                code: "invalid_grant".into(),
                description: Some("Invalid token audience".into()),
            },
            TokenError::Refused {
                code: "unauthorized_client".into(),
                description: None,
            },
            TokenError::Refused {
                code: "???".into(),
                description: None,
            },
            TokenError::Status(502),
            TokenError::Malformed("an empty access_token".into()),
            TokenError::Discovery("no metadata".into()),
            TokenError::Assertion("cannot read /t".into()),
        ];
        // Kubernetes' pattern for a condition's reason.
        let valid = |r: &str| {
            r.starts_with(|c: char| c.is_ascii_alphabetic())
                && r.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_,:".contains(c))
                && !r.ends_with([',', ':'])
        };
        for e in errors {
            let reason = e.reason();
            assert!(valid(&reason), "{e}: {reason}");
            let failure = crate::failure::Failure::TokenUnavailable(e.clone());
            assert_eq!(failure.credential_reason(), Some(reason.clone()), "{e}");
            let initializing = crate::failure::Failure::InitFailed(Box::new(failure));
            assert_eq!(initializing.credential_reason(), Some(reason), "{e}");
        }
        assert_eq!(
            TokenError::Refused {
                code: "???".into(),
                description: None
            }
            .reason(),
            "Refused"
        );
        assert_eq!(
            TokenError::Refused {
                code: "invalid_grant".into(),
                description: None
            }
            .reason(),
            "InvalidGrant"
        );
        assert_eq!(
            crate::failure::Failure::InitAuthFailed(401).credential_reason(),
            None
        );
    }

    #[test]
    fn an_assertion_file_must_hold_a_jwt_and_is_never_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "not-a-jwt-but-secret").unwrap();
        let e = read_assertion(&path).unwrap_err().to_string();
        assert!(e.contains("does not hold a JWT"), "{e}");
        assert!(!e.contains("not-a-jwt-but-secret"), "{e}");
        std::fs::write(&path, "a.b.c\n").unwrap();
        assert_eq!(read_assertion(&path).unwrap().expose_secret(), "a.b.c");
    }
}

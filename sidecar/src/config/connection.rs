//! ToolConnection documents: a remote MCP server (or, standalone only, a
//! stdio command), shaped like the ToolConnection custom resource. Header
//! values come from environment variables or files where a cluster uses
//! Secrets; they are held as secrets that cannot be printed.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use aip_mcp::connection::{
    ClientCapabilities, Connection, DEFAULT_HEALTH_DEADLINE, DEFAULT_HEALTH_INTERVAL,
    DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT, Endpoint, MAX_TIMEOUT, Tls,
};

use aip_policy::tools::fingerprint::is_hash;
use aip_policy::tools::{Pin, Pins, Trust};

use super::{ConfigError, ScanAction, ToolRules};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolConnectionDoc {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: ToolConnectionSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolConnectionSpec {
    #[serde(default)]
    pub url: Option<String>,
    /// A stdio MCP server to run as `[PROGRAM, ARGS...]` (instead of url).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub headers: Vec<HeaderSpec>,
    #[serde(default)]
    pub bearer_token: Option<ValueSpec>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub max_response_bytes: Option<usize>,
    #[serde(default)]
    pub health_check: Option<HealthCheckSpec>,
    #[serde(default)]
    pub tool_prefix: Option<String>,
    #[serde(default)]
    pub client_capabilities: ClientCapabilities,
    #[serde(default)]
    pub tls: Option<TlsSpec>,
    /// Tools pinned by fingerprint, by the name the server lists them under.
    #[serde(default)]
    pub tool_pins: BTreeMap<String, ToolPinSpec>,
    /// `Listed`, `Pinned` or `FirstUse`; `Pinned` when toolPins is given,
    /// otherwise `Listed`.
    #[serde(default)]
    pub tool_trust: Option<Trust>,
    /// What a finding of the poisoning scan does: `Warn` (the default),
    /// `Block` (the tool is withheld) or `Off`.
    #[serde(default)]
    pub tool_scan: Option<ScanAction>,
    /// Access tokens from an authorization server instead of a static
    /// credential (docs/upstream-auth.md).
    #[serde(default)]
    pub auth: Option<AuthSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthSpec {
    /// RFC 6749 §4.4: the client's authentication is the grant.
    #[serde(default)]
    pub client_credentials: Option<GrantSpec>,
    /// RFC 7523 §2.1: the JWT in `assertionFile` is the grant.
    #[serde(default)]
    pub jwt_bearer: Option<GrantSpec>,
    /// RFC 8693: the JWT in `subjectTokenFile` is exchanged.
    #[serde(default)]
    pub token_exchange: Option<GrantSpec>,
}

/// One OAuth grant, the gateway the client.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrantSpec {
    /// The authorization server, its token endpoint found from its
    /// metadata (RFC 8414, then OpenID Connect discovery)...
    #[serde(default)]
    pub issuer: Option<String>,
    /// ...or its token endpoint, given.
    #[serde(default)]
    pub token_endpoint: Option<String>,
    pub client_id: String,
    /// One way to authenticate: a secret...
    #[serde(default)]
    pub client_secret: Option<ValueSpec>,
    /// ...sent as `client_secret_basic` (the default) or
    /// `client_secret_post`...
    #[serde(default)]
    pub client_auth_method: Option<String>,
    /// ...or a PEM private key the gateway signs assertions with
    /// (`private_key_jwt`)...
    #[serde(default)]
    pub private_key: Option<ValueSpec>,
    #[serde(default)]
    pub key_id: Option<String>,
    /// ...or a JWT in a file someone else issues (a projected
    /// ServiceAccount token): federated client authentication under
    /// clientCredentials, the grant itself under jwtBearer.
    #[serde(default)]
    pub assertion_file: Option<String>,
    /// tokenExchange: the subject token's file (a JWT, re-read at every
    /// request), the RFC 8693 audience, and the subject token's issuer as
    /// the authorization server names it.
    #[serde(default)]
    pub subject_token_file: Option<String>,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub subject_issuer: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// RFC 8707 `resource` (default: the connection's url)...
    #[serde(default)]
    pub resource: Option<String>,
    /// ...sent unless this is false.
    #[serde(default)]
    pub send_resource: Option<bool>,
    /// PEM CAs for an https authorization server.
    #[serde(default)]
    pub ca_file: Option<String>,
}

/// One tool's pin: its schema hash, and its metadata hash when the pin
/// covers it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolPinSpec {
    pub schema_hash: String,
    #[serde(default)]
    pub metadata_hash: Option<String>,
}

/// How an https upstream is verified.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsSpec {
    /// PEM bundle of the CAs to trust (instead of the built-in web roots).
    #[serde(default)]
    pub ca_file: Option<String>,
    /// Verify the certificate for this name instead of the URL's host.
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderSpec {
    pub name: String,
    pub value_from: ValueSource,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ValueSpec {
    pub value_from: ValueSource,
}

/// Where a secret value comes from. `secretKeyRef` is the Kubernetes form;
/// standalone mode reads environment variables and files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ValueSource {
    #[serde(default)]
    pub env: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub secret_key_ref: Option<SecretKeyRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheckSpec {
    #[serde(default)]
    pub interval_seconds: Option<u64>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A ToolConnection document, validated into the connection it describes
/// and what its tools are held to.
pub fn from_doc(doc: ToolConnectionDoc, at: &str) -> Result<(Connection, ToolRules), ConfigError> {
    let fail = |field: &str, message: String| Err(ConfigError::at(at, field, message));
    if doc.api_version != aip_policy::document::API_VERSION {
        return fail(
            "apiVersion",
            format!("must be {:?}", aip_policy::document::API_VERSION),
        );
    }
    if let Some(problem) = aip_policy::kubernetes::name_problem(&doc.metadata.name) {
        return fail(
            "metadata.name",
            format!("is not a valid Kubernetes name: it {problem}"),
        );
    }
    let spec = doc.spec;
    let rules = tool_rules(&spec, at)?;
    let endpoint = match (spec.url, spec.command) {
        (Some(url), None) => {
            if let Some(problem) = url_credentials(&url) {
                return fail("spec.url", problem);
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return fail(
                    "spec.url",
                    format!("must be an http:// or https:// URL, found {url:?}"),
                );
            }
            Endpoint::Http { url }
        }
        (None, Some(command)) => {
            if command.first().is_none_or(|program| program.is_empty()) {
                return fail(
                    "spec.command",
                    "must name a program to run: [PROGRAM, ARGS...]".to_owned(),
                );
            }
            // Headers travel on HTTP requests only; accepting them here
            // would let an author believe a credential is being sent.
            if !spec.headers.is_empty() || spec.bearer_token.is_some() {
                return fail(
                        "spec.command",
                        "a stdio connection takes no headers or bearerToken; pass credentials in the server's environment".to_owned(),
                    );
            }
            Endpoint::Stdio { command }
        }
        (Some(_), Some(_)) => {
            return fail(
                "spec.command",
                "give either url or command, not both".to_owned(),
            );
        }
        (None, None) => return fail("spec.url", "required field is missing".to_owned()),
    };
    let timeout = Duration::from_secs(spec.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT.as_secs()));
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return fail(
            "spec.timeoutSeconds",
            format!("must be 1..{}", MAX_TIMEOUT.as_secs()),
        );
    }
    let max_response_bytes = spec
        .max_response_bytes
        .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
    if max_response_bytes < 1024 {
        return fail("spec.maxResponseBytes", "must be at least 1024".to_owned());
    }
    let health = spec.health_check.unwrap_or(HealthCheckSpec {
        interval_seconds: None,
        timeout_seconds: None,
    });
    let health_interval = Duration::from_secs(
        health
            .interval_seconds
            .unwrap_or(DEFAULT_HEALTH_INTERVAL.as_secs()),
    );
    let health_deadline = Duration::from_secs(
        health
            .timeout_seconds
            .unwrap_or(DEFAULT_HEALTH_DEADLINE.as_secs()),
    );
    if health_interval.is_zero() || health_deadline.is_zero() {
        return fail(
            "spec.healthCheck",
            "intervalSeconds and timeoutSeconds must be at least 1".to_owned(),
        );
    }
    let tool_prefix = spec.tool_prefix.unwrap_or_default();
    if !tool_prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return fail(
            "spec.toolPrefix",
            "may hold only letters, digits, '_', '-' and '.'".to_owned(),
        );
    }
    for (i, h) in spec.headers.iter().enumerate() {
        let lower = h.name.to_ascii_lowercase();
        if h.name.is_empty()
            || !h
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return fail(
                &format!("spec.headers[{i}].name"),
                format!("{:?} is not a valid header name", h.name),
            );
        }
        if matches!(
            lower.as_str(),
            "mcp-session-id" | "mcp-protocol-version" | "content-type" | "content-length" | "host"
        ) {
            return fail(
                &format!("spec.headers[{i}].name"),
                format!("{} is set by the gateway itself", h.name),
            );
        }
    }
    let tls = match spec.tls {
        None => Tls::default(),
        Some(t) => {
            if !matches!(&endpoint, Endpoint::Http { url } if url.starts_with("https://")) {
                return fail("spec.tls", "applies to https:// URLs only".to_owned());
            }
            let ca_pem = match &t.ca_file {
                None => None,
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => Some(pem),
                    Ok(_) => {
                        return fail(
                            "spec.tls.caFile",
                            format!("{path} holds no PEM certificate"),
                        );
                    }
                    Err(e) => {
                        return fail(
                            "spec.tls.caFile",
                            format!("cannot read {path}: {}", e.kind()),
                        );
                    }
                },
            };
            if let Some(name) = &t.server_name
                && rustls_pki_types::ServerName::try_from(name.as_str()).is_err()
            {
                return fail(
                    "spec.tls.serverName",
                    format!("{name:?} is not a valid DNS name or IP address"),
                );
            }
            Tls {
                ca_pem,
                server_name: t.server_name,
            }
        }
    };
    let credentials = resolve_credentials(&spec.headers, spec.bearer_token.as_ref());
    if let Ok(values) = &credentials
        && let Some(i) = values
            .iter()
            .position(|(_, v)| !is_header_value(v.expose_secret()))
    {
        // What the header would carry is never repeated: only where it came from.
        let field = match spec.headers.get(i) {
            Some(_) => format!("spec.headers[{i}].valueFrom"),
            None => "spec.bearerToken.valueFrom".to_owned(),
        };
        return fail(
            &field,
            format!(
                "the value for header {} holds a line break or another control character, which no header may carry",
                values[i].0
            ),
        );
    }
    let oauth = match &spec.auth {
        None => None,
        Some(auth) => {
            let Endpoint::Http { url } = &endpoint else {
                return fail("spec.auth", "applies to url connections only".to_owned());
            };
            if !spec.headers.is_empty() || spec.bearer_token.is_some() {
                // Both would send an Authorization header.
                if spec.bearer_token.is_some()
                    || spec
                        .headers
                        .iter()
                        .any(|h| h.name.eq_ignore_ascii_case("authorization"))
                {
                    return fail(
                        "spec.auth",
                        "the token goes in the Authorization header, which bearerToken or a header already sets: remove one of them".to_owned(),
                    );
                }
            }
            let given = [
                ("clientCredentials", &auth.client_credentials),
                ("jwtBearer", &auth.jwt_bearer),
                ("tokenExchange", &auth.token_exchange),
            ]
            .into_iter()
            .filter_map(|(name, g)| g.as_ref().map(|g| (name, g)))
            .collect::<Vec<_>>();
            let [(name, g)] = given[..] else {
                return fail(
                    "spec.auth",
                    "give exactly one of clientCredentials, jwtBearer and tokenExchange".to_owned(),
                );
            };
            match grant(name, g, url, timeout) {
                Ok(oauth) => Some(oauth),
                Err((field, message)) => {
                    return fail(&format!("spec.auth.{name}{field}"), message);
                }
            }
        }
    };
    let connection = Connection {
        oauth,
        tls,
        name: doc.metadata.name,
        endpoint,
        credentials,
        timeout,
        max_response_bytes,
        health_interval,
        health_deadline,
        tool_prefix,
        capabilities: spec.client_capabilities,
    };
    Ok((connection, rules))
}

/// `auth.<name>`, checked: the field at fault (after `spec.auth.<name>`)
/// and why.
fn grant(
    name: &str,
    cc: &GrantSpec,
    url: &str,
    timeout: Duration,
) -> Result<aip_mcp::oauth::OAuth, (String, String)> {
    use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant, OAuth};
    let misplaced = |field: &str, what: &str| Err((format!(".{field}"), what.to_owned()));
    let exchange_only = "applies to tokenExchange only";
    let (grant, client_file) = match name {
        "clientCredentials" => {
            if cc.subject_token_file.is_some() {
                return misplaced("subjectTokenFile", exchange_only);
            }
            (Grant::ClientCredentials, cc.assertion_file.as_ref())
        }
        "jwtBearer" => {
            if cc.subject_token_file.is_some() {
                return misplaced("subjectTokenFile", exchange_only);
            }
            let Some(file) = &cc.assertion_file else {
                return misplaced("assertionFile", "is required: the JWT that is the grant");
            };
            (
                Grant::JwtBearer {
                    assertion: file.into(),
                },
                None,
            )
        }
        _ => {
            if cc.assertion_file.is_some() {
                return misplaced(
                    "assertionFile",
                    "does not apply to tokenExchange: its JWT is subjectTokenFile",
                );
            }
            let Some(file) = &cc.subject_token_file else {
                return misplaced("subjectTokenFile", "is required: the JWT exchanged");
            };
            (
                Grant::TokenExchange {
                    subject_token: file.into(),
                    audience: cc.audience.clone(),
                    subject_issuer: cc.subject_issuer.clone(),
                },
                None,
            )
        }
    };
    if name != "tokenExchange" {
        if cc.audience.is_some() {
            return misplaced("audience", exchange_only);
        }
        if cc.subject_issuer.is_some() {
            return misplaced("subjectIssuer", exchange_only);
        }
    }
    let http_url = |field: &str, value: &str| -> Result<(), (String, String)> {
        if value.starts_with("https://") || value.starts_with("http://") {
            Ok(())
        } else {
            Err((
                format!(".{field}"),
                format!("{value:?} is not an http:// or https:// URL"),
            ))
        }
    };
    let server = match (&cc.issuer, &cc.token_endpoint) {
        (Some(issuer), None) => {
            http_url("issuer", issuer)?;
            AuthorizationServer::Issuer(issuer.clone())
        }
        (None, Some(endpoint)) => {
            http_url("tokenEndpoint", endpoint)?;
            AuthorizationServer::TokenEndpoint(endpoint.clone())
        }
        (None, None) => AuthorizationServer::FromResource,
        (Some(_), Some(_)) => {
            return Err((
                String::new(),
                "give issuer (its token endpoint is discovered) or tokenEndpoint, not both (neither: both are found from the server's own metadata)".to_owned(),
            ));
        }
    };
    if cc.client_id.is_empty() {
        return Err((".clientId".to_owned(), "must not be empty".to_owned()));
    }
    let secret =
        |v: &ValueSpec, field: &str| resolve(&v.value_from).map_err(|e| (format!(".{field}"), e));
    let client_auth = match (&cc.client_secret, &cc.private_key, client_file) {
        (Some(s), None, None) => {
            let s = secret(s, "clientSecret")?;
            match cc.client_auth_method.as_deref() {
                None | Some("client_secret_basic") => ClientAuth::SecretBasic(s),
                Some("client_secret_post") => ClientAuth::SecretPost(s),
                Some(other) => {
                    return Err((
                        ".clientAuthMethod".to_owned(),
                        format!("{other:?}: expected client_secret_basic or client_secret_post"),
                    ));
                }
            }
        }
        (None, Some(k), None) => ClientAuth::PrivateKeyJwt {
            key_pem: secret(k, "privateKey")?,
            key_id: cc.key_id.clone(),
        },
        (None, None, Some(path)) => ClientAuth::AssertionFile(path.into()),
        (None, None, None) if grant != Grant::ClientCredentials => ClientAuth::None,
        _ if grant == Grant::ClientCredentials => {
            return Err((
                String::new(),
                "give exactly one of clientSecret, privateKey and assertionFile".to_owned(),
            ));
        }
        _ => {
            return Err((
                String::new(),
                "give at most one of clientSecret and privateKey (neither: a public client)"
                    .to_owned(),
            ));
        }
    };
    if cc.client_auth_method.is_some() && cc.client_secret.is_none() {
        return Err((
            ".clientAuthMethod".to_owned(),
            "applies to clientSecret only".to_owned(),
        ));
    }
    let tls = match &cc.ca_file {
        None => Tls::default(),
        Some(path) => match std::fs::read_to_string(path) {
            Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => Tls {
                ca_pem: Some(pem),
                server_name: None,
            },
            Ok(_) => {
                return Err((
                    ".caFile".to_owned(),
                    format!("{path} holds no PEM certificate"),
                ));
            }
            Err(e) => {
                return Err((
                    ".caFile".to_owned(),
                    format!("cannot read {path}: {}", e.kind()),
                ));
            }
        },
    };
    Ok(OAuth {
        server,
        grant,
        client_id: cc.client_id.clone(),
        client_auth,
        scopes: cc.scopes.clone(),
        resource: cc.resource.clone().unwrap_or_else(|| url.to_owned()),
        send_resource: cc.send_resource.unwrap_or(true),
        timeout,
        tls,
    })
}

/// toolPins, toolTrust and toolScan, checked.
fn tool_rules(spec: &ToolConnectionSpec, at: &str) -> Result<ToolRules, ConfigError> {
    let mut tools = BTreeMap::new();
    for (name, pin) in &spec.tool_pins {
        let hashes = [
            ("schemaHash", Some(&pin.schema_hash)),
            ("metadataHash", pin.metadata_hash.as_ref()),
        ];
        for (field, hash) in hashes {
            if let Some(hash) = hash
                && !is_hash(hash)
            {
                return Err(ConfigError::at(
                    at,
                    &format!("spec.toolPins.{name}.{field}"),
                    format!(
                        "{hash:?} is not a fingerprint: expected \"sha256:\" and 64 lower-case hex digits (`aip tools pin` writes them)"
                    ),
                ));
            }
        }
        tools.insert(
            name.clone(),
            Pin {
                schema_hash: pin.schema_hash.clone(),
                metadata_hash: pin.metadata_hash.clone(),
            },
        );
    }
    let trust = match spec.tool_trust {
        Some(Trust::Listed) if !tools.is_empty() => {
            return Err(ConfigError::at(
                at,
                "spec.toolTrust",
                "Listed serves every tool as listed, so toolPins would be ignored: remove one of them",
            ));
        }
        Some(trust) => trust,
        None if tools.is_empty() => Trust::Listed,
        None => Trust::Pinned,
    };
    Ok(ToolRules {
        pins: Pins { trust, tools },
        scan: spec.tool_scan.unwrap_or_default(),
    })
}

/// Visible ASCII, spaces and tabs (and bytes beyond ASCII, as HTTP allows):
/// no CR, LF or other control character.
fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Query parameter names that carry credentials by convention.
const CREDENTIAL_PARAMETERS: &[&str] = &[
    "access_token",
    "api_key",
    "apikey",
    "auth",
    "code",
    "credential",
    "key",
    "password",
    "passwd",
    "pwd",
    "secret",
    "sig",
    "signature",
    "token",
];

/// Why a URL may not be used because it carries a credential: in its user
/// information (which the HTTP client would drop, or send where no header
/// asked for it) or in a parameter named for one, in the query (which ends
/// up in logs and in `check` output) or in the fragment (where an OAuth
/// implicit grant puts its `access_token`, and `check` prints it too). The
/// value is never repeated.
fn url_credentials(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Some(
            "holds user information (user:password@ before the host); pass credentials as a header or bearerToken"
                .to_owned(),
        );
    }
    let (before_fragment, fragment) = rest.split_once('#').unwrap_or((rest, ""));
    let query = before_fragment.split_once('?').map_or("", |(_, q)| q);
    [query, fragment]
        .into_iter()
        .flat_map(|part| part.split(['&', ';']))
        .find_map(|pair| {
            let name = parameter_name(pair.split('=').next()?);
            let plain = name.replace('-', "_");
            let credential = CREDENTIAL_PARAMETERS.contains(&plain.as_str())
                || plain.ends_with("_token")
                || plain.ends_with("_key")
                || plain.ends_with("secret");
            credential.then(|| {
                format!(
                    "query parameter {name:?} carries a credential; pass it as a header or bearerToken"
                )
            })
        })
}

/// A parameter's name as the server reads it: form-decoded (`t%6Fken` and
/// `api+key` are `token` and `api key` to it), lowercased, without the
/// `[]` some frameworks read as a list of the name.
fn parameter_name(raw: &str) -> String {
    let spaced = raw.replace('+', " ");
    let decoded = percent_encoding::percent_decode_str(&spaced).decode_utf8_lossy();
    let name = decoded.split('[').next().unwrap_or_default();
    name.to_lowercase()
}

fn resolve_credentials(
    headers: &[HeaderSpec],
    bearer: Option<&ValueSpec>,
) -> Result<Vec<(String, SecretString)>, String> {
    let mut out = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        let value = resolve(&h.value_from).map_err(|e| format!("spec.headers[{i}]: {e}"))?;
        out.push((h.name.clone(), value));
    }
    if let Some(b) = bearer {
        let token = resolve(&b.value_from).map_err(|e| format!("spec.bearerToken: {e}"))?;
        let value = format!("Bearer {}", secrecy::ExposeSecret::expose_secret(&token));
        out.push(("authorization".to_owned(), SecretString::from(value)));
    }
    Ok(out)
}

/// Reads one secret value. Errors name the source, never the value.
fn resolve(source: &ValueSource) -> Result<SecretString, String> {
    match (&source.env, &source.file, &source.secret_key_ref) {
        (Some(var), None, None) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(SecretString::from(v)),
            _ => Err(format!("environment variable {var} is not set")),
        },
        (None, Some(path), None) => match std::fs::read_to_string(path) {
            Ok(v) if !v.trim().is_empty() => Ok(SecretString::from(
                v.trim_end_matches(['\r', '\n']).to_owned(),
            )),
            Ok(_) => Err(format!("file {path} is empty")),
            Err(e) => Err(format!("cannot read file {path}: {}", e.kind())),
        },
        (None, None, Some(r)) => Err(format!(
            "secretKeyRef {}/{} needs the operator; standalone mode reads env or file",
            r.name, r.key
        )),
        _ => Err("valueFrom needs exactly one of env, file, secretKeyRef".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_in_a_url_is_found_however_its_key_is_spelled_or_wherever_it_sits() {
        for url in [
            "https://example.com/mcp?t%6Fken=s3cr3t-value",
            "https://example.com/mcp?ACCESS%5fTOKEN=s3cr3t-value",
            "https://example.com/mcp?api+key=x&x%2Dapi%2Dkey=s3cr3t-value",
            "https://example.com/mcp?token[]=s3cr3t-value",
            "https://example.com/mcp?tenant=a;token=s3cr3t-value",
            "https://example.com/mcp#access_token=s3cr3t-value",
            "https://example.com/mcp?tenant=a#state=x&t%6Fken=s3cr3t-value",
        ] {
            let problem = url_credentials(url).unwrap_or_else(|| panic!("{url} passed"));
            assert!(problem.contains("carries a credential"), "{url}: {problem}");
            assert!(!problem.contains("s3cr3t"), "{url}: {problem}");
        }
        for url in [
            "https://example.com/mcp?tenant=a&region=eu",
            "https://example.com/mcp#section-2",
            "https://example.com/mcp?q=%74oken",
        ] {
            assert_eq!(url_credentials(url), None, "{url}");
        }
    }
}

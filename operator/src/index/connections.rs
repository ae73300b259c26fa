//! ToolConnections, each with its Secrets looked up: what a sidecar needs
//! to reach the server. Resolution is pure: the Secrets are given, not
//! fetched.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use aip_api::tool_connection::{
    AuthSpec, ClientAuthMethod, ClientCapabilities, DEFAULT_HEALTH_INTERVAL_SECONDS,
    DEFAULT_HEALTH_TIMEOUT_SECONDS, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT_SECONDS, GrantKind,
    GrantSpec, ToolConnectionSpec, ToolPin, ToolScan, ToolTrust,
};
use aip_policy::FieldError;
use secrecy::{ExposeSecret, SecretString};

use super::config::publish;
use super::secrets::{SecretKeyError, Secrets, Unreadable};
use super::{Index, Namespace, ObjectKey};
use crate::validate::Binding;

/// The connection as a sidecar receives it.
#[derive(Debug, Clone)]
pub struct ResolvedConnection {
    pub name: String,
    pub url: String,
    /// Header values and CA, or why they could not be resolved (then the
    /// sidecar sends nothing upstream and hides the connection's tools).
    pub credentials: Result<Credentials, CredentialsError>,
    pub server_name: Option<String>,
    pub timeout: Duration,
    pub max_response_bytes: u64,
    pub health_interval: Duration,
    pub health_deadline: Duration,
    pub tool_prefix: String,
    pub capabilities: ClientCapabilities,
    /// What the connection's tools are held to (docs/tool-pins.md): the
    /// spec's pins, or under toolTrust FirstUse the acceptances its status
    /// records.
    pub tool_pins: BTreeMap<String, ToolPin>,
    pub tool_trust: Option<ToolTrust>,
    pub tool_scan: Option<ToolScan>,
    /// The credentials wait for a Secret whose watch has not reported yet:
    /// not missing, just not read (the prober waits rather than reporting).
    pub credentials_pending: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub headers: Vec<(String, SecretString)>,
    pub ca_pem: Option<String>,
    /// How the gateway gets access tokens (spec.auth), its secrets read.
    pub oauth: Option<aip_mcp::oauth::OAuth>,
}

/// Why a connection has no credentials. The message is what the sidecar,
/// the connection's status and its Events say: it names the field and the
/// Secret key, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    /// The spec fails validation: its tools must not be offered.
    #[error("the ToolConnection is invalid: {}", joined(.0))]
    Invalid(Vec<FieldError>),
    /// The Secret key the field at `path` names cannot be used.
    #[error("{path}: {source}")]
    Secret {
        /// `spec.headers[i]`, `spec.bearerToken` or `spec.tls.caSecretRef`.
        path: String,
        source: SecretKeyError,
    },
}

fn joined(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Credentials {
    /// Whether tokens are had with each pod's projected ServiceAccount
    /// token (as the client's assertion or as the grant).
    pub fn as_pods(&self) -> bool {
        self.oauth.as_ref().is_some_and(|o| {
            matches!(o.client_auth, aip_mcp::oauth::ClientAuth::AssertionFile(_))
                || o.grant != aip_mcp::oauth::Grant::ClientCredentials
        })
    }
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Credentials) -> bool {
        self.ca_pem == other.ca_pem
            && match (&self.oauth, &other.oauth) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same_as(b),
                _ => false,
            }
            && self.headers.len() == other.headers.len()
            && self
                .headers
                .iter()
                .zip(&other.headers)
                .all(|((n1, v1), (n2, v2))| n1 == n2 && v1.expose_secret() == v2.expose_secret())
    }
}

impl ResolvedConnection {
    /// Whether the connection authenticates as each pod (its projected
    /// ServiceAccount token): the operator has no such token to probe it
    /// with, so only the sidecars check it.
    pub fn as_pods(&self) -> bool {
        self.credentials.as_ref().is_ok_and(Credentials::as_pods)
    }
}

impl PartialEq for ResolvedConnection {
    fn eq(&self, other: &ResolvedConnection) -> bool {
        self.name == other.name
            && self.url == other.url
            && self.credentials == other.credentials
            && self.server_name == other.server_name
            && self.timeout == other.timeout
            && self.max_response_bytes == other.max_response_bytes
            && self.health_interval == other.health_interval
            && self.health_deadline == other.health_deadline
            && self.tool_prefix == other.tool_prefix
            && self.capabilities == other.capabilities
            && self.tool_pins == other.tool_pins
            && self.tool_trust == other.tool_trust
            && self.tool_scan == other.tool_scan
            && self.credentials_pending == other.credentials_pending
    }
}

pub(super) struct ConnectionEntry {
    pub(super) spec: ToolConnectionSpec,
    /// The acceptances in its status (toolTrust FirstUse).
    accepted: BTreeMap<String, ToolPin>,
    resolved: Arc<ResolvedConnection>,
}

impl ConnectionEntry {
    /// Whether this connection reads Secret `secret`.
    pub(super) fn reads(&self, secret: &str) -> bool {
        self.spec
            .secret_refs()
            .iter()
            .any(|(_, r)| r.name == secret)
    }
}

impl Index {
    /// The projected ServiceAccount tokens the connections of `namespace`
    /// authenticate with: (audience, lifetime in seconds, path under the
    /// sidecar's token directory), one per audience. The injector puts
    /// them in every governed pod of the namespace.
    pub fn upstream_tokens(&self, namespace: &str) -> Vec<(String, u32, String)> {
        let Some(ns) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let mut out: BTreeMap<String, (u32, String)> = BTreeMap::new();
        for c in ns.connections.values() {
            let Some(sa) = c
                .spec
                .auth
                .as_ref()
                .and_then(AuthSpec::grant)
                .and_then(|(_, g)| g.service_account_token.as_ref())
            else {
                continue;
            };
            let life = sa.expiration_seconds.unwrap_or(
                aip_api::tool_connection::ServiceAccountTokenSpec::DEFAULT_EXPIRATION_SECONDS,
            );
            // The shortest lifetime asked for an audience wins.
            let entry = out
                .entry(sa.audience.clone())
                .or_insert_with(|| (life, sa.path()));
            entry.0 = entry.0.min(life);
        }
        out.into_iter()
            .map(|(audience, (life, path))| (audience, life, path))
            .collect()
    }

    pub fn apply_connection(
        &mut self,
        namespace: &str,
        name: &str,
        spec: &ToolConnectionSpec,
        accepted: BTreeMap<String, ToolPin>,
    ) -> BTreeSet<ObjectKey> {
        let ns = self.namespace(namespace);
        let resolved = Arc::new(resolve(namespace, name, spec, &accepted, &ns.secrets));
        if ns
            .connections
            .get(name)
            .is_some_and(|c| c.spec == *spec && *c.resolved == *resolved)
        {
            // A status write of its own (a health check): nothing changed.
            return BTreeSet::new();
        }
        ns.connections.insert(
            name.to_owned(),
            ConnectionEntry {
                spec: spec.clone(),
                accepted,
                resolved,
            },
        );
        self.refresh_granting(namespace, &[name.to_owned()])
    }

    pub fn delete_connection(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        if ns.connections.remove(name).is_none() {
            return BTreeSet::new();
        }
        self.refresh_granting(namespace, &[name.to_owned()])
    }

    /// The connection as resolved now (for the prober).
    pub fn connection(&self, namespace: &str, name: &str) -> Option<Arc<ResolvedConnection>> {
        let ns = self.namespaces.get(namespace)?;
        Some(ns.connections.get(name)?.resolved.clone())
    }

    /// Re-resolves the connections that read Secret `secret`.
    pub(super) fn reresolve_readers(
        &mut self,
        namespace: &str,
        secret: &str,
    ) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let mut changed = Vec::new();
        for (name, c) in &mut ns.connections {
            if c.reads(secret) {
                let resolved = resolve(namespace, name, &c.spec, &c.accepted, &ns.secrets);
                if *c.resolved != resolved {
                    c.resolved = Arc::new(resolved);
                    changed.push(name.clone());
                }
            }
        }
        if changed.is_empty() {
            return BTreeSet::new();
        }
        self.refresh_granting(namespace, &changed)
    }

    /// Republishes the pods whose policy grants one of `connections`.
    fn refresh_granting(&mut self, namespace: &str, connections: &[String]) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let granting: BTreeSet<String> = ns
            .policies
            .iter()
            .filter(|(_, p)| {
                p.binding()
                    .is_some_and(|b| b.connections.iter().any(|c| connections.contains(c)))
            })
            .map(|(name, _)| name.clone())
            .collect();
        let pods: Vec<String> = ns
            .pods
            .iter()
            .filter(|(_, p)| p.matched.iter().any(|m| granting.contains(m)))
            .map(|(name, _)| name.clone())
            .collect();
        for pod in pods {
            publish(ns, &pod, &mut self.version);
        }
        granting
            .iter()
            .map(|p| ObjectKey::new(namespace, p))
            .collect()
    }
}

impl Namespace {
    /// The existing connections a binding grants, each once.
    pub(super) fn granted(&self, binding: &Binding) -> Vec<Arc<ResolvedConnection>> {
        let mut seen = BTreeSet::new();
        binding
            .connections
            .iter()
            .filter(|c| seen.insert(*c))
            .filter_map(|c| self.connections.get(c))
            .map(|c| c.resolved.clone())
            .collect()
    }
}

/// Resolves `spec` against the Secrets of its namespace. A spec that fails
/// validation resolves to an error too: its tools must not be offered.
fn resolve(
    namespace: &str,
    name: &str,
    spec: &ToolConnectionSpec,
    accepted: &BTreeMap<String, ToolPin>,
    secrets: &Secrets,
) -> ResolvedConnection {
    let health = spec.health_check.clone().unwrap_or_default();
    let seconds = |s: Option<u32>, default: u32| Duration::from_secs(s.unwrap_or(default).into());
    let credentials = match crate::validate::tool_connection(namespace, spec) {
        Err(errors) => Err(CredentialsError::Invalid(errors)),
        Ok(()) => credentials(spec, secrets),
    };
    let credentials_pending = credentials.is_err()
        && spec.secret_refs().iter().any(|(_, r)| {
            !secrets.data.contains_key(&r.name)
                && secrets.unreadable.get(&r.name) == Some(&Unreadable::NotReadYet)
        });
    ResolvedConnection {
        name: name.to_owned(),
        url: spec.url.clone(),
        credentials,
        server_name: spec.tls.as_ref().and_then(|t| t.server_name.clone()),
        timeout: seconds(spec.timeout_seconds, DEFAULT_TIMEOUT_SECONDS),
        max_response_bytes: spec
            .max_response_bytes
            .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES),
        health_interval: seconds(health.interval_seconds, DEFAULT_HEALTH_INTERVAL_SECONDS),
        health_deadline: seconds(health.timeout_seconds, DEFAULT_HEALTH_TIMEOUT_SECONDS),
        tool_prefix: spec.tool_prefix.clone().unwrap_or_default(),
        capabilities: spec.client_capabilities.unwrap_or_default(),
        tool_pins: if spec.tool_trust == Some(ToolTrust::FirstUse) {
            accepted.clone()
        } else {
            spec.tool_pins.clone()
        },
        tool_trust: spec.tool_trust,
        tool_scan: spec.tool_scan,
        credentials_pending,
    }
}

fn credentials(
    spec: &ToolConnectionSpec,
    secrets: &Secrets,
) -> Result<Credentials, CredentialsError> {
    let at = |path: String| move |source: SecretKeyError| CredentialsError::Secret { path, source };
    let mut headers = Vec::new();
    for (i, h) in spec.headers.iter().enumerate() {
        let value = secrets
            .header_value(&h.value_from.secret_key_ref)
            .map_err(at(format!("spec.headers[{i}]")))?;
        headers.push((h.name.clone(), value));
    }
    if let Some(b) = &spec.bearer_token {
        let token = secrets
            .header_value(&b.value_from.secret_key_ref)
            .map_err(at("spec.bearerToken".to_owned()))?;
        let value = format!("Bearer {}", token.expose_secret());
        headers.push(("authorization".to_owned(), SecretString::from(value)));
    }
    let ca_pem = match spec.tls.as_ref().and_then(|t| t.ca_secret_ref.as_ref()) {
        None => None,
        Some(r) => Some(
            secrets
                .certificates(r)
                .map_err(at("spec.tls.caSecretRef".to_owned()))?,
        ),
    };
    let oauth = match spec.auth.as_ref().and_then(AuthSpec::grant) {
        None => None,
        Some((kind, g)) => Some(oauth(spec, kind, g, secrets)?),
    };
    Ok(Credentials {
        headers,
        ca_pem,
        oauth,
    })
}

/// spec.auth's grant with its Secrets read.
fn oauth(
    spec: &ToolConnectionSpec,
    kind: GrantKind,
    g: &GrantSpec,
    secrets: &Secrets,
) -> Result<aip_mcp::oauth::OAuth, CredentialsError> {
    use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant, OAuth};
    let at = |path: &str| {
        let path = format!("spec.auth.{}.{path}", kind.field());
        move |source: SecretKeyError| CredentialsError::Secret { path, source }
    };
    let server = match (&g.issuer, &g.token_endpoint) {
        (Some(issuer), _) => AuthorizationServer::Issuer(issuer.clone()),
        (None, Some(endpoint)) => AuthorizationServer::TokenEndpoint(endpoint.clone()),
        (None, None) => AuthorizationServer::FromResource,
    };
    // The projected token's file, relative to the sidecar's tokens (the
    // API server's rules require it for the JWT grants).
    let projected = g
        .service_account_token
        .as_ref()
        .map(|t| std::path::PathBuf::from(t.path()))
        .unwrap_or_default();
    let grant = match kind {
        GrantKind::ClientCredentials => Grant::ClientCredentials,
        GrantKind::JwtBearer => Grant::JwtBearer {
            assertion: projected.clone(),
        },
        GrantKind::TokenExchange => Grant::TokenExchange {
            subject_token: projected.clone(),
            audience: g.audience.clone(),
            subject_issuer: g.subject_issuer.clone(),
        },
    };
    let client_auth = match (&g.client_secret, &g.private_key) {
        (Some(v), _) => {
            let secret = secrets
                .header_value(&v.value_from.secret_key_ref)
                .map_err(at("clientSecret"))?;
            match g.client_auth_method {
                Some(ClientAuthMethod::ClientSecretPost) => ClientAuth::SecretPost(secret),
                _ => ClientAuth::SecretBasic(secret),
            }
        }
        (None, Some(v)) => ClientAuth::PrivateKeyJwt {
            key_pem: secrets
                .private_key(&v.value_from.secret_key_ref)
                .map_err(at("privateKey"))?,
            key_id: g.key_id.clone(),
        },
        (None, None) if kind == GrantKind::ClientCredentials => {
            ClientAuth::AssertionFile(projected)
        }
        (None, None) => ClientAuth::None,
    };
    Ok(OAuth {
        server,
        grant,
        client_id: g.client_id.clone(),
        client_auth,
        scopes: g.scopes.clone(),
        resource: g.resource.clone().unwrap_or_else(|| spec.url.clone()),
        send_resource: g.send_resource.unwrap_or(true),
        timeout: Duration::from_secs(
            spec.timeout_seconds
                .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
                .into(),
        ),
        tls: aip_mcp::Tls::default(),
    })
}

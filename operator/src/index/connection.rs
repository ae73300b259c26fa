//! A ToolConnection with its Secrets looked up: what a sidecar needs to
//! reach the server. Resolution is pure: the Secrets are given, not fetched.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aip_api::tool_connection::{
    ClientCapabilities, DEFAULT_HEALTH_INTERVAL_SECONDS, DEFAULT_HEALTH_TIMEOUT_SECONDS,
    DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT_SECONDS, SecretKeyRef, ToolConnectionSpec,
};
use secrecy::{ExposeSecret, SecretString};

/// A Secret's data. Debug never shows the values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData(pub BTreeMap<String, Vec<u8>>);

impl fmt::Debug for SecretData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The connection as a sidecar receives it.
#[derive(Debug, Clone)]
pub struct ResolvedConnection {
    pub name: String,
    pub url: String,
    /// Header values and CA, or why they could not be resolved (then the
    /// sidecar sends nothing upstream and hides the connection's tools).
    pub credentials: Result<Credentials, String>,
    pub server_name: Option<String>,
    pub timeout: Duration,
    pub max_response_bytes: u64,
    pub health_interval: Duration,
    pub health_deadline: Duration,
    pub tool_prefix: String,
    pub capabilities: ClientCapabilities,
    /// The credentials wait for a Secret whose watch has not reported yet:
    /// not missing, just not read (the prober waits rather than reporting).
    pub credentials_pending: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub headers: Vec<(String, SecretString)>,
    pub ca_pem: Option<String>,
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Credentials) -> bool {
        self.ca_pem == other.ca_pem
            && self.headers.len() == other.headers.len()
            && self
                .headers
                .iter()
                .zip(&other.headers)
                .all(|((n1, v1), (n2, v2))| n1 == n2 && v1.expose_secret() == v2.expose_secret())
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
            && self.credentials_pending == other.credentials_pending
    }
}

/// The Secrets of a namespace that connections read, and why the operator
/// has not got others.
#[derive(Default)]
pub struct Secrets {
    pub data: HashMap<String, Arc<SecretData>>,
    /// Secret name -> why it cannot be used yet.
    pub unreadable: HashMap<String, Unreadable>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Referenced, and its watch has not reported yet.
    NotReadYet,
    /// The operator may not read it; the text says how to grant it.
    Forbidden(String),
}

/// Resolves `spec` against the Secrets of its namespace. A spec that fails
/// validation resolves to an error too: its tools must not be offered.
pub fn resolve(
    namespace: &str,
    name: &str,
    spec: &ToolConnectionSpec,
    secrets: &Secrets,
) -> ResolvedConnection {
    let health = spec.health_check.clone().unwrap_or_default();
    let seconds = |s: Option<u32>, default: u32| Duration::from_secs(s.unwrap_or(default).into());
    let credentials = match crate::validate::tool_connection(namespace, spec) {
        Err(errors) => Err(format!(
            "the ToolConnection is invalid: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )),
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
        credentials_pending,
    }
}

fn credentials(spec: &ToolConnectionSpec, secrets: &Secrets) -> Result<Credentials, String> {
    let mut headers = Vec::new();
    for (i, h) in spec.headers.iter().enumerate() {
        let r = &h.value_from.secret_key_ref;
        let value = lookup(secrets, r)
            .and_then(|v| header_safe(r, v))
            .map_err(|e| format!("spec.headers[{i}]: {e}"))?;
        headers.push((h.name.clone(), value));
    }
    if let Some(b) = &spec.bearer_token {
        let r = &b.value_from.secret_key_ref;
        let token = lookup(secrets, r)
            .and_then(|v| header_safe(r, v))
            .map_err(|e| format!("spec.bearerToken: {e}"))?;
        let value = format!("Bearer {}", token.expose_secret());
        headers.push(("authorization".to_owned(), SecretString::from(value)));
    }
    let ca_pem = match spec.tls.as_ref().and_then(|t| t.ca_secret_ref.as_ref()) {
        None => None,
        Some(r) => {
            let pem = lookup(secrets, r).map_err(|e| format!("spec.tls.caSecretRef: {e}"))?;
            if !pem.expose_secret().contains("-----BEGIN CERTIFICATE-----") {
                return Err(format!(
                    "spec.tls.caSecretRef: Secret {} key {} holds no PEM certificate",
                    r.name, r.key
                ));
            }
            Some(pem.expose_secret().to_owned())
        }
    };
    Ok(Credentials { headers, ca_pem })
}

/// One Secret key's value. Errors name the Secret and key, never the value.
fn lookup(secrets: &Secrets, r: &SecretKeyRef) -> Result<SecretString, String> {
    let data = secrets
        .data
        .get(&r.name)
        .ok_or_else(|| match secrets.unreadable.get(&r.name) {
            Some(Unreadable::NotReadYet) => format!("Secret {} has not been read yet", r.name),
            Some(Unreadable::Forbidden(why)) => why.clone(),
            None => format!("Secret {} not found", r.name),
        })?;
    let bytes = data
        .0
        .get(&r.key)
        .ok_or_else(|| format!("Secret {} has no key {}", r.name, r.key))?;
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("Secret {} key {} is not UTF-8", r.name, r.key))?;
    let text = text.trim_end_matches(['\r', '\n']);
    if text.is_empty() {
        return Err(format!("Secret {} key {} is empty", r.name, r.key));
    }
    Ok(SecretString::from(text.to_owned()))
}

/// A header value may not hold control characters: a line break inside a
/// Secret would otherwise end the header early.
fn header_safe(r: &SecretKeyRef, value: SecretString) -> Result<SecretString, String> {
    let bad = |b: u8| (b < 0x20 && b != b'\t') || b == 0x7f;
    if value.expose_secret().bytes().any(bad) {
        return Err(format!(
            "Secret {} key {} holds a control character, which no header value may",
            r.name, r.key
        ));
    }
    Ok(value)
}

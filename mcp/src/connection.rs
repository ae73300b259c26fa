//! A resolved connection to one MCP server: where it is, how to reach it
//! (TLS, credentials, limits) and what the client offers it. Credentials
//! are secrets that cannot be printed.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1_000_000;
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_HEALTH_DEADLINE: Duration = Duration::from_secs(5);

/// Resolved TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// PEM text of the trusted CAs; None: the built-in web roots.
    pub ca_pem: Option<String>,
    pub server_name: Option<String>,
}

/// Client capabilities offered to the upstream: none unless opted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCapabilities {
    #[serde(default)]
    pub sampling: bool,
    #[serde(default)]
    pub elicitation: bool,
    #[serde(default)]
    pub roots: bool,
}

/// A validated connection.
#[derive(Debug, Clone)]
pub struct Connection {
    pub name: String,
    pub endpoint: Endpoint,
    /// Resolved header values, or why they could not be resolved (then the
    /// connection needs credentials and nothing is sent upstream).
    pub credentials: Result<Vec<(String, SecretString)>, String>,
    pub timeout: Duration,
    pub max_response_bytes: usize,
    pub health_interval: Duration,
    pub health_deadline: Duration,
    /// Agent-facing tool names are `{prefix}{name}` (the prefix includes any
    /// separator the author wants, e.g. `github_`).
    pub tool_prefix: String,
    pub capabilities: ClientCapabilities,
    pub tls: Tls,
    /// Access tokens from an authorization server, beside (or instead of)
    /// the static credentials.
    pub oauth: Option<crate::oauth::OAuth>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Http {
        url: String,
    },
    /// A local MCP server spoken to over its stdin/stdout.
    Stdio {
        command: Vec<String>,
    },
}

impl Connection {
    /// A connection to `endpoint` with no credentials and the default
    /// timeouts and limits.
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Connection {
        Connection {
            name: name.into(),
            endpoint,
            credentials: Ok(Vec::new()),
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            health_interval: DEFAULT_HEALTH_INTERVAL,
            health_deadline: DEFAULT_HEALTH_DEADLINE,
            tool_prefix: String::new(),
            capabilities: ClientCapabilities::default(),
            tls: Tls::default(),
            oauth: None,
        }
    }

    /// Whether `other` would make exactly this connection, credentials
    /// included: a reload keeps such a connection (its session, catalog
    /// and stdio process) instead of starting it again.
    pub fn same_as(&self, other: &Connection) -> bool {
        let same_credentials = match (&self.credentials, &other.credentials) {
            (Ok(a), Ok(b)) => {
                a.len() == b.len()
                    && a.iter().zip(b).all(|((n1, v1), (n2, v2))| {
                        n1 == n2 && v1.expose_secret() == v2.expose_secret()
                    })
            }
            (Err(a), Err(b)) => a == b,
            _ => false,
        };
        self.name == other.name
            && self.endpoint == other.endpoint
            && self.timeout == other.timeout
            && self.max_response_bytes == other.max_response_bytes
            && self.health_interval == other.health_interval
            && self.health_deadline == other.health_deadline
            && self.tool_prefix == other.tool_prefix
            && self.capabilities == other.capabilities
            && self.tls == other.tls
            && same_credentials
            && match (&self.oauth, &other.oauth) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same_as(b),
                _ => false,
            }
    }
}

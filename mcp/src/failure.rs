//! How an upstream call can fail, and what each failure means (the failure
//! table in docs/sidecar.md, "Upstreams and connection health"). A failure belongs to the call
//! that saw it: only credential evidence touches the whole connection.

use serde_json::{Value, json};

/// The JSON-RPC code for every failure that comes from an upstream. The
/// reason in `data` says which.
pub const UPSTREAM_ERROR: i64 = -32603;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Refused, reset, or the socket closed before any SSE event id.
    Network(String),
    /// The per-call deadline passed (handshake + call + body).
    Timeout,
    /// An HTTP status other than 401/403 (5xx, other 4xx, redirects).
    HttpStatus(u16),
    /// Invalid JSON, a malformed result, or no response with the call's id.
    Malformed(String),
    /// More than the connection's response size limit.
    TooLarge { limit: usize },
    /// HTTP 401 on any request.
    AuthFailed,
    /// HTTP 403 on a tools/call; the scope from an `insufficient_scope`
    /// challenge, when given.
    Forbidden { scope: Option<String> },
    /// 401/403 while initializing: the credential itself is bad.
    InitAuthFailed(u16),
    /// 401/403 to a health check's tools/list: the credential cannot even
    /// list the tools.
    CheckAuthFailed(u16),
    /// Any other failure while initializing.
    InitFailed(Box<Failure>),
    /// A credential could not be resolved: nothing was sent.
    CredentialsMissing(String),
    /// No access token could be had from the authorization server (its
    /// error code, never a credential): nothing was sent.
    TokenUnavailable(crate::oauth::TokenError),
}

/// What a failure does to the upstream session it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEffect {
    Keep,
    Discard,
}

/// What a failure does to the connection and its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEffect {
    None,
    NeedsCredentials,
    /// Hide and refuse this one tool until the credential changes.
    GateTool {
        scope: Option<String>,
    },
}

impl Failure {
    /// The `reason` the agent (and audit, metrics) sees.
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Network(_) => "upstream_unreachable",
            Failure::Timeout => "upstream_timeout",
            Failure::HttpStatus(_) => "upstream_http_error",
            Failure::Malformed(_) => "upstream_malformed",
            Failure::TooLarge { .. } => "upstream_too_large",
            Failure::AuthFailed
            | Failure::InitAuthFailed(_)
            | Failure::CheckAuthFailed(_)
            | Failure::CredentialsMissing(_) => "upstream_auth_failed",
            Failure::Forbidden { .. } => "upstream_forbidden",
            Failure::TokenUnavailable(_) => "upstream_token_unavailable",
            Failure::InitFailed(inner) => inner.reason(),
        }
    }

    /// The reason with what it knows beyond its code (for health and
    /// status, which show why a connection needs credentials): a token
    /// failure's authorization-server error.
    pub fn explained(&self) -> String {
        match self {
            Failure::TokenUnavailable(why) => format!("{}: {why}", self.reason()),
            Failure::CredentialsMissing(why) => format!("{}: {why}", self.reason()),
            Failure::InitFailed(inner) => inner.explained(),
            other => other.reason().to_owned(),
        }
    }

    /// Why the connection's credential is refused, as a Kubernetes
    /// condition reason, when the failure knows more than "refused": the
    /// authorization server's error code (`InvalidGrant`) or what failed
    /// on the way to a token (`TokenEndpointUnreachable`, ...).
    pub fn credential_reason(&self) -> Option<String> {
        match self {
            Failure::TokenUnavailable(e) => Some(e.reason()),
            Failure::InitFailed(inner) => inner.credential_reason(),
            _ => None,
        }
    }

    /// The metric/audit class label.
    pub fn class(&self) -> &'static str {
        match self {
            Failure::Network(_) => "network",
            Failure::Timeout => "timeout",
            Failure::HttpStatus(_) => "http_status",
            Failure::Malformed(_) => "malformed",
            Failure::TooLarge { .. } => "too_large",
            Failure::AuthFailed => "auth",
            Failure::Forbidden { .. } => "forbidden",
            Failure::InitAuthFailed(_) => "init_auth",
            Failure::CheckAuthFailed(_) => "check_auth",
            Failure::InitFailed(_) => "init",
            Failure::CredentialsMissing(_) => "credentials",
            Failure::TokenUnavailable(_) => "token",
        }
    }

    pub fn http_status(&self) -> Option<u16> {
        match self {
            Failure::HttpStatus(s) | Failure::InitAuthFailed(s) | Failure::CheckAuthFailed(s) => {
                Some(*s)
            }
            Failure::AuthFailed => Some(401),
            Failure::Forbidden { .. } => Some(403),
            Failure::InitFailed(inner) => inner.http_status(),
            _ => None,
        }
    }

    pub fn session_effect(&self) -> SessionEffect {
        match self {
            Failure::Network(_)
            | Failure::Timeout
            | Failure::AuthFailed
            | Failure::InitAuthFailed(_)
            | Failure::CheckAuthFailed(_)
            | Failure::InitFailed(_) => SessionEffect::Discard,
            _ => SessionEffect::Keep,
        }
    }

    pub fn connection_effect(&self) -> ConnectionEffect {
        match self {
            Failure::AuthFailed
            | Failure::InitAuthFailed(_)
            | Failure::CheckAuthFailed(_)
            | Failure::CredentialsMissing(_)
            | Failure::TokenUnavailable(_) => ConnectionEffect::NeedsCredentials,
            Failure::Forbidden { scope } => ConnectionEffect::GateTool {
                scope: scope.clone(),
            },
            _ => ConnectionEffect::None,
        }
    }

    /// The JSON-RPC error object for the agent. Its text never says
    /// "session expired" or "session not found": some clients replay a call
    /// when they read that, and a tool call must never run twice.
    pub fn to_error(&self, connection: &str, tool: Option<&str>) -> Value {
        let mut data = json!({"reason": self.reason(), "connection": connection});
        if let Some(t) = tool {
            data["tool"] = json!(t);
        }
        if let Some(status) = self.http_status() {
            data["http_status"] = json!(status);
        }
        if let Failure::Forbidden { scope: Some(scope) } = self {
            data["required_scope"] = json!(scope);
        }
        // What the authorization server said (its error code and
        // description, redacted where the text was made): the agent can
        // tell a refusal from an outage.
        if let Failure::TokenUnavailable(why) = self {
            data["token_error"] = json!(why.to_string());
        }
        json!({"code": UPSTREAM_ERROR, "message": self.message(), "data": data})
    }

    fn message(&self) -> &'static str {
        match self {
            Failure::Network(_) => "Upstream server unreachable",
            Failure::Timeout => "Upstream server did not answer in time",
            Failure::HttpStatus(_) => "Upstream server returned an HTTP error",
            Failure::Malformed(_) => "Upstream server sent a malformed response",
            Failure::TooLarge { .. } => "Upstream response exceeds the size limit",
            Failure::AuthFailed
            | Failure::InitAuthFailed(_)
            | Failure::CheckAuthFailed(_)
            | Failure::CredentialsMissing(_) => {
                "Upstream server refused the connection's credentials"
            }
            Failure::Forbidden { .. } => {
                "Upstream server forbids this tool with the connection's credentials"
            }
            Failure::TokenUnavailable(_) => {
                "No access token for the upstream server: the authorization server refused or cannot be reached"
            }
            Failure::InitFailed(_) => "Upstream server could not be initialized",
        }
    }
}

/// The `scope` of a `WWW-Authenticate: Bearer error="insufficient_scope",
/// scope="..."` challenge (parsed from the header, never from a body).
pub fn insufficient_scope(challenge: &str) -> Option<String> {
    let rest = challenge.trim().strip_prefix("Bearer")?.trim_start();
    let params = auth_params(rest);
    let error = params
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("error"))?;
    if error.1 != "insufficient_scope" {
        return None;
    }
    params
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("scope"))
        .map(|(_, v)| v)
}

/// The `resource_metadata` URL of a `WWW-Authenticate: Bearer ...`
/// challenge (RFC 9728 §5.1): where the resource's metadata is.
pub fn resource_metadata(challenge: &str) -> Option<String> {
    let rest = challenge.trim().strip_prefix("Bearer")?.trim_start();
    auth_params(rest)
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("resource_metadata"))
        .map(|(_, v)| v)
        .filter(|v| v.starts_with("https://") || v.starts_with("http://"))
}

/// `k=v, k="quoted, value"` pairs of an auth challenge.
fn auth_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = rest[eq + 1..].trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end.min(quoted.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        out.push((key, value));
        rest = remaining;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_metadata_from_challenge() {
        assert_eq!(
            resource_metadata(
                r#"Bearer error="invalid_token", resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp""#
            ),
            Some("http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp".into())
        );
        assert_eq!(resource_metadata(r#"Bearer realm="x""#), None);
        assert_eq!(
            resource_metadata(r#"Basic resource_metadata="http://x""#),
            None
        );
        assert_eq!(
            resource_metadata(r#"Bearer resource_metadata="file:///etc/passwd""#),
            None
        );
    }

    #[test]
    fn scope_from_challenge() {
        assert_eq!(
            insufficient_scope(
                r#"Bearer error="insufficient_scope", scope="items:read items:write""#
            ),
            Some("items:read items:write".into())
        );
        assert_eq!(
            insufficient_scope(r#"Bearer realm="x", error="invalid_token""#),
            None
        );
        assert_eq!(
            insufficient_scope(r#"Bearer error=insufficient_scope, scope=a:b"#),
            Some("a:b".into())
        );
        assert_eq!(insufficient_scope("Basic realm=x"), None);
    }

    #[test]
    fn caller_text_never_suggests_a_dead_session() {
        for f in [
            Failure::Network("reset".into()),
            Failure::Timeout,
            Failure::HttpStatus(404),
            Failure::Malformed("x".into()),
            Failure::TooLarge { limit: 10 },
            Failure::AuthFailed,
            Failure::Forbidden { scope: None },
            Failure::InitFailed(Box::new(Failure::Timeout)),
        ] {
            let text = f.to_error("c", Some("t")).to_string().to_lowercase();
            assert!(!text.contains("session"), "{text}");
        }
    }
}

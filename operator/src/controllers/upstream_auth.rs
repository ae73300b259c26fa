//! The `Authenticated` condition of a ToolConnection: how the gateway
//! authenticates to the server (an OAuth grant, a static credential or
//! none), and whether the server, or its authorization server, accepts
//! it. A refusal is named by the authorization server's error code
//! (`InvalidGrant`, `InvalidClient`, ...) or by what failed
//! (`TokenEndpointUnreachable`, ...); the message never holds a secret:
//! the health reason it quotes is redacted where it is made.

use aip_api::tool_connection::{HealthState, ToolConnectionSpec};

use crate::index::{Credentials, CredentialsError};

/// The condition's type.
pub const TYPE: &str = "Authenticated";

/// The condition judged: "True", "False" or "Unknown", its reason and
/// message.
#[derive(Debug, PartialEq, Eq)]
pub struct Judged {
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

/// How a connection with `credentials` authenticates, judged by its
/// health `state`, its `reason` (the message) and, for a refused
/// credential, the `refusal`'s own condition reason when one is known
/// (`InvalidGrant`, `TokenEndpointUnreachable`: `Failure::credential_reason`).
pub fn judge(
    spec: &ToolConnectionSpec,
    credentials: &Result<Credentials, CredentialsError>,
    state: HealthState,
    reason: Option<&str>,
    refusal: Option<&str>,
) -> Judged {
    let credentials = match credentials {
        Ok(c) => c,
        Err(e) => {
            return Judged {
                status: "False",
                reason: "CredentialsUnresolved".to_owned(),
                message: e.to_string(),
            };
        }
    };
    let (mode, how) = match &credentials.oauth {
        Some(o) => {
            let as_pods = if credentials.as_pods() {
                "; each pod as its own ServiceAccount"
            } else {
                ""
            };
            (
                o.grant.reason().to_owned(),
                format!("{}{as_pods}", o.describe()),
            )
        }
        None if spec.bearer_token.is_some() => (
            "BearerToken".to_owned(),
            "a static bearer token from a Secret".to_owned(),
        ),
        None if !credentials.headers.is_empty() => (
            "Headers".to_owned(),
            "static headers from Secrets".to_owned(),
        ),
        None => ("None".to_owned(), "no credentials".to_owned()),
    };
    match state {
        HealthState::Healthy | HealthState::Degraded => Judged {
            status: "True",
            reason: mode,
            message: format!("{how}: the server accepts it"),
        },
        HealthState::NeedsCredentials => {
            let why = reason.unwrap_or("the server refused the credential");
            Judged {
                status: "False",
                reason: refusal.unwrap_or("CredentialRefused").to_owned(),
                message: format!("{how}: {why}"),
            }
        }
        HealthState::Unchecked | HealthState::Unreachable => Judged {
            status: "Unknown",
            reason: mode,
            message: format!("{how}: not known yet whether the server accepts it"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant, OAuth};

    fn spec() -> ToolConnectionSpec {
        serde_json::from_value(serde_json::json!({"url": "https://mcp.example/mcp"})).unwrap()
    }

    fn jwt_bearer() -> Result<Credentials, CredentialsError> {
        Ok(Credentials {
            oauth: Some(OAuth {
                server: AuthorizationServer::Issuer("https://as.example/realms/r".into()),
                grant: Grant::JwtBearer {
                    assertion: "upstream/0123".into(),
                },
                client_id: "gateway".into(),
                client_auth: ClientAuth::SecretBasic("s3cret-Q".to_owned().into()),
                scopes: vec![],
                resource: "https://mcp.example/mcp".into(),
                send_resource: true,
                timeout: std::time::Duration::from_secs(5),
                tls: aip_mcp::Tls::default(),
            }),
            ..Credentials::default()
        })
    }

    #[test]
    fn a_refused_grant_is_named_by_the_servers_code_and_the_mode() {
        let why = "pod agent-1: upstream_token_unavailable: the token endpoint refused: invalid_grant (User is not enabled)";
        let judged = judge(
            &spec(),
            &jwt_bearer(),
            HealthState::NeedsCredentials,
            Some(why),
            Some("InvalidGrant"),
        );
        assert_eq!(judged.status, "False");
        assert_eq!(judged.reason, "InvalidGrant");
        assert_eq!(
            judged.message,
            format!(
                "jwtBearer from issuer https://as.example/realms/r as client gateway (client_secret_basic); each pod as its own ServiceAccount: {why}"
            )
        );
        assert!(!judged.message.contains("s3cret-Q"));
    }

    #[test]
    fn a_working_grant_names_its_mode_and_an_unchecked_one_is_unknown() {
        let judged = judge(&spec(), &jwt_bearer(), HealthState::Healthy, None, None);
        assert_eq!(
            (judged.status, judged.reason.as_str()),
            ("True", "JwtBearer")
        );
        let judged = judge(&spec(), &jwt_bearer(), HealthState::Unchecked, None, None);
        assert_eq!(
            (judged.status, judged.reason.as_str()),
            ("Unknown", "JwtBearer")
        );
        let none = judge(
            &spec(),
            &Ok(Credentials::default()),
            HealthState::Healthy,
            None,
            None,
        );
        assert_eq!((none.status, none.reason.as_str()), ("True", "None"));
        let refused = judge(
            &spec(),
            &Ok(Credentials::default()),
            HealthState::NeedsCredentials,
            Some("HTTP 401"),
            None,
        );
        assert_eq!(
            (refused.status, refused.reason.as_str()),
            ("False", "CredentialRefused")
        );
    }
}

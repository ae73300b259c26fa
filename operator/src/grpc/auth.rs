//! Who is calling: a sidecar proves its pod with a projected service-account
//! token for this system's audience, which the API server reviews. The
//! pod's default token (audience: the API server) is refused, so a token an
//! agent container can read by default is worth nothing here.

use std::future::Future;
use std::time::{Duration, SystemTime};

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use crate::identity::PodIdentity;

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error(
        "no bearer token: send the pod's projected service-account token as `authorization: Bearer ...`"
    )]
    Missing,
    #[error("the API server did not accept the token: {0}")]
    Rejected(String),
    #[error("the token is for audiences {found:?}, not {wanted:?}")]
    Audience { found: Vec<String>, wanted: String },
    #[error("the token is not bound to a pod (use a projected service-account token)")]
    NotPodBound,
    #[error("the token could not be reviewed: {0}")]
    Unavailable(String),
}

impl AuthError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Rejected(_) => "rejected",
            AuthError::Audience { .. } => "audience",
            AuthError::NotPodBound => "not_pod_bound",
            AuthError::Unavailable(_) => "unavailable",
        }
    }
}

/// Turns a bearer token into the pod it proves.
pub trait Authenticate: Send + Sync + 'static {
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<PodIdentity, AuthError>> + Send;
}

/// Authentication by TokenReview against the API server.
#[derive(Clone)]
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audience: &str) -> TokenReviewer {
        TokenReviewer {
            client,
            audience: audience.to_owned(),
        }
    }
}

impl Authenticate for TokenReviewer {
    async fn authenticate(&self, token: &str) -> Result<PodIdentity, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answered = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        identity(answered, &self.audience, token)
    }
}

/// Reads the review's verdict. `status.audiences` is checked here too: an
/// API server that ignored `spec.audiences` must not let a default token in.
fn identity(review: TokenReview, audience: &str, token: &str) -> Result<PodIdentity, AuthError> {
    let status = review.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(AuthError::Rejected(
            status
                .error
                .unwrap_or_else(|| "not authenticated".to_owned()),
        ));
    }
    let audiences = status.audiences.unwrap_or_default();
    if !audiences.iter().any(|a| a == audience) {
        return Err(AuthError::Audience {
            found: audiences,
            wanted: audience.to_owned(),
        });
    }
    let user = status.user.unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let Some((namespace, service_account)) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    else {
        return Err(AuthError::NotPodBound);
    };
    let extra = user.extra.unwrap_or_default();
    let one = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
    let (Some(pod), Some(uid)) = (one(POD_NAME), one(POD_UID)) else {
        return Err(AuthError::NotPodBound);
    };
    Ok(PodIdentity {
        namespace: namespace.to_owned(),
        pod,
        uid,
        service_account: service_account.to_owned(),
        expires: expiry(token),
    })
}

/// The `exp` claim of a JWT the API server has just accepted (so its
/// signature is already checked).
fn expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(exp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
    use std::collections::BTreeMap;

    fn review(audiences: &[&str], username: &str, pod: bool) -> TokenReview {
        let mut extra = BTreeMap::new();
        if pod {
            extra.insert(POD_NAME.to_owned(), vec!["agent-1".to_owned()]);
            extra.insert(POD_UID.to_owned(), vec!["uid-1".to_owned()]);
        }
        TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(true),
                audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
                user: Some(UserInfo {
                    username: Some(username.to_owned()),
                    extra: Some(extra),
                    ..UserInfo::default()
                }),
                error: None,
            }),
            ..TokenReview::default()
        }
    }

    const SA: &str = "system:serviceaccount:agents:runner";

    #[test]
    fn a_pod_bound_token_for_the_audience_names_its_pod() {
        let claims =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"exp":2000000000}"#);
        let token = format!("h.{claims}.s");
        let id = identity(
            review(&["aip.io/sidecar"], SA, true),
            "aip.io/sidecar",
            &token,
        )
        .unwrap();
        assert_eq!(id.namespace, "agents");
        assert_eq!(id.service_account, "runner");
        assert_eq!((id.pod.as_str(), id.uid.as_str()), ("agent-1", "uid-1"));
        assert_eq!(
            id.expires,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000))
        );
    }

    #[test]
    fn a_review_that_ignored_the_audience_is_still_refused() {
        let e = identity(
            review(&["https://kubernetes.default.svc"], SA, true),
            "aip.io/sidecar",
            "t",
        )
        .unwrap_err();
        assert_eq!(e.metric_label(), "audience");
    }

    #[test]
    fn tokens_not_bound_to_a_pod_are_refused() {
        let e = identity(
            review(&["aip.io/sidecar"], SA, false),
            "aip.io/sidecar",
            "t",
        )
        .unwrap_err();
        assert_eq!(e, AuthError::NotPodBound);
        let e = identity(
            review(&["aip.io/sidecar"], "alice", true),
            "aip.io/sidecar",
            "t",
        )
        .unwrap_err();
        assert_eq!(e, AuthError::NotPodBound);
    }

    #[test]
    fn an_unauthenticated_review_carries_the_servers_reason() {
        let mut r = review(&["aip.io/sidecar"], SA, true);
        let status = r.status.as_mut().unwrap();
        status.authenticated = Some(false);
        status.error = Some("token expired".to_owned());
        assert_eq!(
            identity(r, "aip.io/sidecar", "t").unwrap_err().to_string(),
            "the API server did not accept the token: token expired"
        );
    }
}

//! Service-account tokens: the `serviceaccounts/token` subresource mints
//! audience- and pod-bound JWTs (signed HS256 with a per-server key), and
//! `tokenreviews` validates them — signature, expiry, audience, and that
//! the service account and the bound pod still exist with the same uids —
//! as the operator will do for sidecars. A token whose audience includes
//! the API server's also authenticates requests to this server.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::User;
use crate::kinds::Resource;
use crate::status::ApiError;
use crate::store::Store;

/// The issuer, and the API server's own audience.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Tokens live at least this long (the real server's minimum is 10 min).
const MIN_EXPIRATION: u64 = 600;
/// The userInfo extras a pod-bound token carries, as kube-apiserver names them.
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: u64,
    pub iat: u64,
    pub nbf: u64,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Bound,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bound {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

pub struct Signer {
    key: [u8; 32],
}

impl Default for Signer {
    fn default() -> Self {
        Signer {
            key: rand::random(),
        }
    }
}

/// The audiences asked for, or the API server's own.
fn audiences_or_default(value: Option<&Value>) -> Vec<String> {
    let audiences = crate::values::strings(value);
    if audiences.is_empty() {
        vec![ISSUER.to_owned()]
    } else {
        audiences
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn core(plural: &str) -> Resource {
    Resource {
        group: String::new(),
        plural: plural.into(),
    }
}

fn uid_of(object: &Value) -> String {
    object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl Signer {
    pub fn sign(&self, claims: &Claims) -> Result<String, ApiError> {
        let key = EncodingKey::from_secret(&self.key)
            .map_err(|e| ApiError::bad_request(format!("cannot sign the token: {e}")))?;
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key)
            .map_err(|e| ApiError::bad_request(format!("cannot sign the token: {e}")))
    }

    /// The claims of a token this server signed that has not expired.
    pub fn verify(&self, token: &str) -> Result<Claims, String> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.validate_aud = false; // checked against the review's audiences
        validation.leeway = 0;
        validation.set_issuer(&[ISSUER]);
        let key = DecodingKey::from_secret(&self.key).map_err(|e| e.to_string())?;
        jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => "token has expired".to_owned(),
                jsonwebtoken::errors::ErrorKind::InvalidSignature => "invalid signature".to_owned(),
                _ => format!("invalid token: {e}"),
            })
    }

    /// A TokenRequest for service account `name` in `namespace`: the
    /// TokenRequest answered with its token.
    pub fn request(
        &self,
        store: &Store,
        namespace: &str,
        name: &str,
        request: &Value,
    ) -> Result<Value, ApiError> {
        let account = store
            .get(&core("serviceaccounts"), namespace, name)
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
        let spec = request.get("spec").cloned().unwrap_or(json!({}));
        let audiences = audiences_or_default(spec.get("audiences"));
        let seconds = spec
            .get("expirationSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(3600)
            .max(MIN_EXPIRATION);
        let pod = match spec.get("boundObjectRef") {
            None | Some(Value::Null) => None,
            Some(bound) => {
                if bound.get("kind").and_then(Value::as_str) != Some("Pod") {
                    return Err(ApiError::bad_request(
                        "spec.boundObjectRef.kind: only Pod is supported",
                    ));
                }
                let pod_name = bound
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let pod = store
                    .get(&core("pods"), namespace, pod_name)
                    .ok_or_else(|| ApiError::not_found("", "pods", pod_name))?;
                let uid = uid_of(&pod);
                if let Some(want) = bound.get("uid").and_then(Value::as_str)
                    && want != uid
                {
                    return Err(ApiError::conflict("", "pods", pod_name));
                }
                Some(Ref {
                    name: pod_name.to_owned(),
                    uid,
                })
            }
        };
        let issued = now();
        let claims = Claims {
            iss: ISSUER.into(),
            sub: format!("system:serviceaccount:{namespace}:{name}"),
            aud: audiences.clone(),
            exp: issued + seconds,
            iat: issued,
            nbf: issued,
            kubernetes: Bound {
                namespace: namespace.into(),
                serviceaccount: Ref {
                    name: name.into(),
                    uid: uid_of(&account),
                },
                pod,
            },
        };
        let token = self.sign(&claims)?;
        let expires = humantime::format_rfc3339_seconds(
            UNIX_EPOCH + std::time::Duration::from_secs(claims.exp),
        );
        Ok(json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": spec.get("boundObjectRef")},
            "status": {"token": token, "expirationTimestamp": expires.to_string()},
        }))
    }

    /// The user a token stands for, if it is valid for one of `audiences`
    /// and what it is bound to still exists.
    pub fn authenticate(
        &self,
        store: &Store,
        token: &str,
        audiences: &[String],
    ) -> Result<(User, Claims, Vec<String>), String> {
        let claims = self.verify(token)?;
        let matched: Vec<String> = claims
            .aud
            .iter()
            .filter(|a| audiences.contains(a))
            .cloned()
            .collect();
        if matched.is_empty() {
            return Err("token audiences do not match the requested audiences".into());
        }
        let bound = &claims.kubernetes;
        let account = store.get(
            &core("serviceaccounts"),
            &bound.namespace,
            &bound.serviceaccount.name,
        );
        if account.as_ref().map(uid_of) != Some(bound.serviceaccount.uid.clone()) {
            return Err("the service account no longer exists".into());
        }
        if let Some(pod) = &bound.pod {
            let found = store.get(&core("pods"), &bound.namespace, &pod.name);
            if found.as_ref().map(uid_of) != Some(pod.uid.clone()) {
                return Err("the pod the token is bound to no longer exists".into());
            }
        }
        let user = User {
            name: claims.sub.clone(),
            uid: bound.serviceaccount.uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", bound.namespace),
                "system:authenticated".into(),
            ],
            extra: bound
                .pod
                .as_ref()
                .map(|pod| {
                    [
                        (POD_NAME.to_owned(), vec![pod.name.clone()]),
                        (POD_UID.to_owned(), vec![pod.uid.clone()]),
                    ]
                    .into()
                })
                .unwrap_or_default(),
        };
        Ok((user, claims, matched))
    }

    /// A TokenReview answered.
    pub fn review(&self, store: &Store, review: &Value) -> Value {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let audiences = audiences_or_default(review.pointer("/spec/audiences"));
        let status = match self.authenticate(store, token, &audiences) {
            Ok((user, _, matched)) => json!({"authenticated": true, "audiences": matched,
                   "user": crate::admission::user_info(&user)}),
            Err(e) => json!({"authenticated": false, "user": {}, "error": e}),
        };
        json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
               "metadata": {"creationTimestamp": null}, "spec": review.get("spec"), "status": status})
    }
}

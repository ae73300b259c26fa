//! Admission webhooks as the real server calls them: every matching
//! MutatingWebhookConfiguration webhook first (its JSON patch applied), then
//! every matching ValidatingWebhookConfiguration webhook, each with an
//! AdmissionReview v1 that carries the requester's userInfo. Matching: rules
//! (operations, apiGroups, apiVersions, resources with subresources,
//! scope), namespaceSelector and objectSelector. Calls go to
//! `clientConfig.url` over HTTPS trusting `caBundle`, within
//! `timeoutSeconds`; `failurePolicy` decides what a failed call means.
//! (`clientConfig.service` is not supported: there is no cluster network.)

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::auth::User;
use crate::kinds::{Kind, Resource};
use crate::status::ApiError;
use crate::store::Store;
use crate::values::strings;

/// One admission decision to make.
pub struct Review<'a> {
    pub kind: &'a Kind,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// CREATE, UPDATE or DELETE.
    pub operation: &'a str,
    pub user: &'a User,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

fn admissionregistration(plural: &str) -> Resource {
    Resource {
        group: "admissionregistration.k8s.io".into(),
        plural: plural.into(),
    }
}

/// Runs the mutating webhooks, then the validating ones; the object as
/// mutated, or the refusal.
pub async fn admit(store: &Store, review: &Review<'_>) -> Result<Option<Value>, ApiError> {
    // Admission reviews, webhook configurations and events never go
    // through webhooks here (as the real server exempts its own
    // registration objects).
    if review.kind.group == "admissionregistration.k8s.io" {
        return Ok(review.object.cloned());
    }
    let mut object = review.object.cloned();
    for webhook in webhooks(store, "mutatingwebhookconfigurations", review) {
        let current = Review {
            object: object.as_ref(),
            ..*review
        };
        if let Some(patched) = call(&webhook, &current).await? {
            object = Some(patched);
        }
    }
    for webhook in webhooks(store, "validatingwebhookconfigurations", review) {
        let current = Review {
            object: object.as_ref(),
            ..*review
        };
        call(&webhook, &current).await?;
    }
    Ok(object)
}

/// The webhooks of every configuration of `plural` that match `review`,
/// in configuration-name order.
fn webhooks(store: &Store, plural: &str, review: &Review<'_>) -> Vec<Value> {
    let (configurations, _) = store.list(&admissionregistration(plural), None);
    let namespace = review.namespace.and_then(|ns| {
        store.get(
            &Resource {
                group: String::new(),
                plural: "namespaces".into(),
            },
            "",
            ns,
        )
    });
    configurations
        .iter()
        .flat_map(|c| {
            c.get("webhooks")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|w| matches_rules(w, review))
        .filter(|w| {
            let selector = w.get("namespaceSelector");
            match (&namespace, review.kind.namespaced) {
                (Some(ns), true) => label_selector_matches(selector, ns),
                _ => true,
            }
        })
        .filter(|w| {
            let target = review.object.or(review.old_object);
            target.is_none_or(|o| label_selector_matches(w.get("objectSelector"), o))
        })
        .collect()
}

fn matches_rules(webhook: &Value, review: &Review<'_>) -> bool {
    let kind = review.kind;
    let resource = match review.subresource {
        Some(sub) => format!("{}/{sub}", kind.plural),
        None => kind.plural.clone(),
    };
    let rules = webhook.get("rules").and_then(Value::as_array);
    rules.into_iter().flatten().any(|rule| {
        let has = |field: &str, wanted: &str| {
            strings(rule.get(field))
                .iter()
                .any(|v| v == "*" || v == wanted)
        };
        let resources = strings(rule.get("resources"));
        let resource_ok = resources.iter().any(|r| {
            *r == resource
                || (*r == "*" && review.subresource.is_none())
                || review
                    .subresource
                    .is_some_and(|sub| *r == format!("*/{sub}"))
                || *r == "*/*"
        });
        let scope = rule.get("scope").and_then(Value::as_str).unwrap_or("*");
        let scope_ok = match scope {
            "Namespaced" => kind.namespaced,
            "Cluster" => !kind.namespaced,
            _ => true,
        };
        has("operations", review.operation)
            && has("apiGroups", &kind.group)
            && has("apiVersions", &kind.version)
            && resource_ok
            && scope_ok
    })
}

/// A LabelSelector object (matchLabels, matchExpressions) against an
/// object's labels; an absent selector matches everything.
fn label_selector_matches(selector: Option<&Value>, object: &Value) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let labels = object.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let labels_ok = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k) == v.as_str());
    let expressions_ok = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values = strings(e.get("values"));
            match e.get("operator").and_then(Value::as_str) {
                Some("In") => label(key).is_some_and(|l| values.iter().any(|v| v == l)),
                Some("NotIn") => label(key).is_none_or(|l| !values.iter().any(|v| v == l)),
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                _ => false,
            }
        });
    labels_ok && expressions_ok
}

/// Calls one webhook; its JSON patch applied to the object if it sent one.
async fn call(webhook: &Value, review: &Review<'_>) -> Result<Option<Value>, ApiError> {
    let name = webhook
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("unnamed");
    let ignore = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
    let timeout = webhook
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(10);
    let uid = uuid::Uuid::new_v4().to_string();
    let request = review_request(review, &uid);
    let answer = tokio::time::timeout(Duration::from_secs(timeout), post(webhook, &request)).await;
    let response = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if ignore => {
            tracing::warn!(webhook = name, error = %e, "webhook failed; ignored (failurePolicy Ignore)");
            return Ok(None);
        }
        Err(_) if ignore => return Ok(None),
        Ok(Err(e)) => return Err(internal(format!("failed calling webhook \"{name}\": {e}"))),
        Err(_) => {
            return Err(internal(format!(
                "failed calling webhook \"{name}\": context deadline exceeded"
            )));
        }
    };
    let response = response.get("response").cloned().unwrap_or(Value::Null);
    if response.get("uid").and_then(Value::as_str) != Some(uid.as_str()) {
        let e = format!("failed calling webhook \"{name}\": expected response.uid=\"{uid}\"");
        return if ignore { Ok(None) } else { Err(internal(e)) };
    }
    if response.get("allowed") != Some(&Value::Bool(true)) {
        return Err(denied(name, response.get("status")));
    }
    let Some(patch) = response.get("patch").and_then(Value::as_str) else {
        return Ok(None);
    };
    let bytes = STANDARD.decode(patch).map_err(|e| {
        internal(format!(
            "webhook \"{name}\" sent a patch that is not base64: {e}"
        ))
    })?;
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).map_err(|e| {
        internal(format!(
            "webhook \"{name}\" sent an invalid JSON patch: {e}"
        ))
    })?;
    let mut object = review.object.cloned().unwrap_or(Value::Null);
    json_patch::patch(&mut object, &patch).map_err(|e| {
        internal(format!(
            "webhook \"{name}\" sent a patch that does not apply: {e}"
        ))
    })?;
    Ok(Some(object))
}

fn review_request(review: &Review<'_>, uid: &str) -> Value {
    let kind = review.kind;
    let gvk = json!({"group": kind.group, "version": kind.version, "kind": kind.kind});
    let gvr = json!({"group": kind.group, "version": kind.version, "resource": kind.plural});
    let mut request = json!({
        "uid": uid,
        "kind": gvk, "resource": gvr,
        "requestKind": gvk, "requestResource": gvr,
        "name": review.name,
        "operation": review.operation,
        "userInfo": user_info(review.user),
        "object": review.object,
        "oldObject": review.old_object,
        "dryRun": false,
    });
    if let Some(ns) = review.namespace {
        request["namespace"] = json!(ns);
    }
    if let Some(sub) = review.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// POSTs the review to the webhook's URL over HTTPS trusting its caBundle.
async fn post(webhook: &Value, review: &Value) -> Result<Value, String> {
    let config = webhook.get("clientConfig").ok_or("no clientConfig")?;
    let url = config
        .get("url")
        .and_then(Value::as_str)
        .ok_or("clientConfig.url is required (service references are not supported)")?;
    let ca = config
        .get("caBundle")
        .and_then(Value::as_str)
        .map(|b| STANDARD.decode(b).map_err(|e| format!("caBundle: {e}")))
        .transpose()?;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca {
        use rustls_pki_types::pem::PemObject;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots
                .add(cert.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<Bytes>>(connector);
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("Post \"{url}\": {e}"))?;
    if !response.status().is_success() {
        return Err(format!(
            "Post \"{url}\": HTTP {}",
            response.status().as_u16()
        ));
    }
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| format!("the response is not JSON: {e}"))
}

fn internal(message: String) -> ApiError {
    ApiError {
        code: 500,
        reason: "InternalError",
        message: format!("Internal error occurred: {message}"),
        details: None,
    }
}

/// A webhook's refusal, worded as the real server words it.
fn denied(name: &str, status: Option<&Value>) -> ApiError {
    let message = status
        .and_then(|s| s.get("message"))
        .and_then(Value::as_str);
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let reason = match code {
        403 => "Forbidden",
        422 => "Invalid",
        _ => "BadRequest",
    };
    ApiError {
        code,
        reason,
        message: match message {
            Some(m) if !m.is_empty() => {
                format!("admission webhook \"{name}\" denied the request: {m}")
            }
            _ => format!("admission webhook \"{name}\" denied the request without explanation"),
        },
        details: None,
    }
}

/// The requester as AdmissionReview and TokenReview describe it.
pub fn user_info(user: &crate::auth::User) -> Value {
    let mut info = json!({"username": user.name, "uid": user.uid, "groups": user.groups});
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

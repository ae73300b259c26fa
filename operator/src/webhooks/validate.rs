//! What the validating webhook decides, kind by kind.

use aip_api::{AgentPolicySpec, ToolConnectionSpec};
use aip_policy::FieldError;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::de::DeserializeOwned;

use super::Webhooks;

/// Why the validating webhook refuses a write. The message is what kubectl
/// prints, and names the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The spec does not have the kind's shape, at `path`.
    #[error("spec.{path}: {message}")]
    Malformed { path: String, message: String },
    /// Every field error of an AgentPolicy or ToolConnection, on one line.
    #[error("{kind} {name} is invalid: {}", joined(.errors))]
    Invalid {
        kind: &'static str,
        name: String,
        errors: Vec<FieldError>,
    },
    #[error("cannot check access to Secret {secret}: {source}")]
    AccessCheck { secret: String, source: kube::Error },
    /// The author may not read a Secret the ToolConnection names at `path`.
    #[error(
        "ToolConnection {name} is refused: {path} names Secret {secret}, which {who} may not get in namespace {namespace}; a ToolConnection may only use Secrets its author can read"
    )]
    SecretNotReadable {
        name: String,
        path: String,
        secret: String,
        who: String,
        namespace: String,
    },
    #[error(transparent)]
    Approval(#[from] super::approvals::Refusal),
    #[error(transparent)]
    Acceptance(#[from] super::tool_acceptance::Refusal),
    #[error(transparent)]
    Lock(#[from] super::lock::UpdateRefusal),
    #[error("this webhook does not validate {0}")]
    UnknownKind(String),
}

fn joined(errors: &[FieldError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("; ")
}

/// The verdict on one request. Anything not understood is refused: the
/// webhook is registered for exactly the kinds it knows.
pub async fn review(
    webhooks: &Webhooks,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let allowed = AdmissionResponse::from(request);
    if matches!(request.operation, Operation::Delete | Operation::Connect) {
        return allowed;
    }
    let Some(object) = &request.object else {
        return allowed.deny("the request carries no object");
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let name = object
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| request.name.clone());
    let kind = request.kind.kind.as_str();
    webhooks.metrics.reconciled(&format!("admission/{kind}"));
    let verdict = match kind {
        "AgentPolicy" => match spec::<AgentPolicySpec>(object) {
            Ok(spec) => crate::validate::agent_policy(&namespace, &name, &spec)
                .map(|_| ())
                .map_err(|errors| Refusal::Invalid {
                    kind: "AgentPolicy",
                    name: name.clone(),
                    errors,
                }),
            Err(e) => Err(e),
        },
        "ToolConnection" if request.sub_resource.as_deref() == Some("status") => {
            super::tool_acceptance::validate(&webhooks.operator, request).map_err(Refusal::from)
        }
        "ToolConnection" => match spec::<ToolConnectionSpec>(object) {
            Ok(spec) => tool_connection(webhooks, request, &namespace, &name, &spec).await,
            Err(e) => Err(e),
        },
        "ApprovalRequest" => {
            super::approvals::validate(&webhooks.client, &webhooks.operator, request)
                .await
                .map_err(Refusal::from)
        }
        "Pod" => pod_update(webhooks, request),
        other => Err(Refusal::UnknownKind(other.to_owned())),
    };
    match verdict {
        Ok(()) => allowed,
        Err(refusal) => {
            let message = refusal.to_string();
            tracing::info!(kind, namespace = %namespace, name = %name, user = request.user_info.username.as_deref().unwrap_or_default(), reason = %message, "admission refused");
            allowed.deny(message)
        }
    }
}

/// A pod's UPDATE (or its ephemeral containers'): see `lock::review_update`.
fn pod_update(
    webhooks: &Webhooks,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(), Refusal> {
    let pod = |o: Option<&DynamicObject>| -> Result<k8s_openapi::api::core::v1::Pod, Refusal> {
        let value = serde_json::to_value(o).unwrap_or_default();
        serde_path_to_error::deserialize(value).map_err(|e| Refusal::Malformed {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })
    };
    if request.operation != Operation::Update {
        return Ok(());
    }
    let old = pod(request.old_object.as_ref())?;
    let new = pod(request.object.as_ref())?;
    let sidecar = webhooks
        .injection
        .as_ref()
        .map_or(super::inject::DEFAULT_USER, |i| i.user_id);
    super::lock::review_update(&old, &new, sidecar).map_err(Refusal::from)
}

fn spec<T: DeserializeOwned>(object: &DynamicObject) -> Result<T, Refusal> {
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    serde_path_to_error::deserialize(spec).map_err(|e| Refusal::Malformed {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

async fn tool_connection(
    webhooks: &Webhooks,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    name: &str,
    spec: &ToolConnectionSpec,
) -> Result<(), Refusal> {
    crate::validate::tool_connection(namespace, spec).map_err(|errors| Refusal::Invalid {
        kind: "ToolConnection",
        name: name.to_owned(),
        errors,
    })?;
    let user = &request.user_info;
    let who = user
        .username
        .clone()
        .unwrap_or_else(|| "the requester".to_owned());
    let mut checked = std::collections::BTreeSet::new();
    for (path, r) in spec.secret_refs() {
        if !checked.insert(r.name.clone()) {
            continue;
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_owned()),
                    verb: Some("get".to_owned()),
                    resource: Some("secrets".to_owned()),
                    name: Some(r.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(webhooks.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Refusal::AccessCheck {
                secret: r.name.clone(),
                source,
            })?;
        let allowed = answer.status.as_ref().is_some_and(|s| s.allowed);
        if !allowed {
            return Err(Refusal::SecretNotReadable {
                name: name.to_owned(),
                path,
                secret: r.name.clone(),
                who,
                namespace: namespace.to_owned(),
            });
        }
    }
    Ok(())
}

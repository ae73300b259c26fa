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
                .map_err(|e| refusal("AgentPolicy", &name, &e)),
            Err(e) => Err(e),
        },
        "ToolConnection" => match spec::<ToolConnectionSpec>(object) {
            Ok(spec) => tool_connection(webhooks, request, &namespace, &name, &spec).await,
            Err(e) => Err(e),
        },
        "ApprovalRequest" => {
            super::approvals::validate(&webhooks.client, &webhooks.operator, request).await
        }
        other => Err(format!("this webhook does not validate {other}")),
    };
    match verdict {
        Ok(()) => allowed,
        Err(message) => {
            tracing::info!(kind, namespace = %namespace, name = %name, user = ?request.user_info.username, reason = %message, "admission refused");
            allowed.deny(message)
        }
    }
}

fn spec<T: DeserializeOwned>(object: &DynamicObject) -> Result<T, String> {
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    serde_path_to_error::deserialize(spec).map_err(|e| format!("spec.{}: {}", e.path(), e.inner()))
}

/// One line naming every problem with its path, as kubectl prints it.
fn refusal(kind: &str, name: &str, errors: &[FieldError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{kind} {name} is invalid: {}", lines.join("; "))
}

async fn tool_connection(
    webhooks: &Webhooks,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    name: &str,
    spec: &ToolConnectionSpec,
) -> Result<(), String> {
    crate::validate::tool_connection(namespace, spec)
        .map_err(|e| refusal("ToolConnection", name, &e))?;
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
            .map_err(|e| format!("cannot check access to Secret {}: {e}", r.name))?;
        let allowed = answer.status.as_ref().is_some_and(|s| s.allowed);
        if !allowed {
            return Err(format!(
                "ToolConnection {name} is refused: {path} names Secret {secret}, which {who} may not get in namespace {namespace}; a ToolConnection may only use Secrets its author can read",
                secret = r.name
            ));
        }
    }
    Ok(())
}

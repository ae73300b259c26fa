//! Who may decide an ApprovalRequest, and the record of who did.
//!
//! Validating (`/validate`): only the operator creates requests; the spec
//! never changes; a decision is final; nothing but Expired after expiry; the
//! operator itself may only expire or withdraw; no identity bound to the
//! asking pod, and no service account of its namespace unless the policy
//! allows it, may decide. Mutating (`/mutate`): a decision is stamped with
//! `decidedBy` (the authenticated user) and `decidedAt`.

use aip_api::approval_request::Decision;
use aip_api::{AgentPolicy, ApprovalRequest};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// The verdict on a write to an ApprovalRequest (or its status).
pub async fn validate(
    client: &kube::Client,
    operator: &str,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(), String> {
    let user = request.user_info.username.clone().unwrap_or_default();
    let new = parse(request.object.as_ref())?;
    if request.operation == Operation::Create {
        return if user == operator {
            Ok(())
        } else {
            Err(format!(
                "ApprovalRequests are created by the operator only, not by {user}"
            ))
        };
    }
    let old = parse(request.old_object.as_ref())?;
    let is_status = request.sub_resource.as_deref() == Some("status");
    if !is_status {
        return if new.spec == old.spec {
            Ok(())
        } else {
            Err("the spec of an ApprovalRequest cannot change".to_owned())
        };
    }
    let before = old.status.clone().unwrap_or_default();
    let after = new.status.clone().unwrap_or_default();
    if before.decision != Decision::Pending {
        return if after == before {
            Ok(())
        } else {
            Err(format!(
                "ApprovalRequest {} was already decided ({:?}{}); a decision is final",
                request.name,
                before.decision,
                before
                    .decided_by
                    .map(|b| format!(" by {b}"))
                    .unwrap_or_default()
            ))
        };
    }
    if after.decision == Decision::Pending {
        return Ok(());
    }
    if user == operator {
        return if matches!(after.decision, Decision::Expired | Decision::Withdrawn) {
            Ok(())
        } else {
            Err(format!(
                "the operator ({user}) may only set Expired or Withdrawn, not {:?}",
                after.decision
            ))
        };
    }
    if matches!(after.decision, Decision::Expired | Decision::Withdrawn) {
        return Err(format!(
            "only the operator sets {:?}; approvers set Approved or Denied",
            after.decision
        ));
    }
    let expires = old.spec.expires_at.0;
    if Timestamp::now() >= expires {
        return Err(format!(
            "ApprovalRequest {} expired at {expires}; it can no longer be decided",
            request.name
        ));
    }
    let extra = request.user_info.extra.clone().unwrap_or_default();
    if extra
        .get(POD_NAME_EXTRA)
        .is_some_and(|pods| pods.contains(&old.spec.pod))
    {
        return Err(format!(
            "{user} is bound to pod {}, which asked; a pod cannot approve its own calls",
            old.spec.pod
        ));
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    if let Some(account) = user.strip_prefix(&format!("system:serviceaccount:{namespace}:")) {
        if account == old.spec.service_account {
            return Err(format!(
                "{user} is the asking pod's own service account; it cannot decide its calls"
            ));
        }
        let policies: Api<AgentPolicy> = Api::namespaced(client.clone(), &namespace);
        let allowed = policies
            .get_opt(&old.spec.policy)
            .await
            .map_err(|e| format!("cannot read AgentPolicy {}: {e}", old.spec.policy))?
            .and_then(|p| p.spec.approval)
            .is_some_and(|a| a.allowed_service_accounts.iter().any(|a| a == account));
        if !allowed {
            return Err(format!(
                "{user} is a service account of namespace {namespace}, where the asking pod runs; it may decide only if AgentPolicy {} lists {account} in spec.approval.allowedServiceAccounts",
                old.spec.policy
            ));
        }
    }
    Ok(())
}

/// The JSON patch that records who decided, when the decision changes.
pub fn stamp(request: &AdmissionRequest<DynamicObject>) -> Option<json_patch::Patch> {
    if request.sub_resource.as_deref() != Some("status") {
        return None;
    }
    let new = parse(request.object.as_ref()).ok()?;
    let old = parse(request.old_object.as_ref()).ok()?;
    let after = new.status.unwrap_or_default();
    let before = old.status.unwrap_or_default();
    if after.decision == before.decision || after.decision == Decision::Pending {
        return None;
    }
    let user = request.user_info.username.clone().unwrap_or_default();
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let patch = serde_json::json!([
        {"op": "add", "path": "/status/decidedBy", "value": user},
        {"op": "add", "path": "/status/decidedAt", "value": now},
    ]);
    serde_json::from_value(patch).ok()
}

fn parse(object: Option<&DynamicObject>) -> Result<ApprovalRequest, String> {
    let object = object.ok_or("the request carries no object")?;
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| format!("not an ApprovalRequest: {e}"))
}

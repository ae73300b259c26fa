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

/// Why a write to an ApprovalRequest is refused: what the writer was not
/// allowed to do, and who they are.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the request carries no object")]
    NoObject,
    #[error("{0}")]
    Unreadable(String),
    #[error("not an ApprovalRequest: {0}")]
    NotAnApprovalRequest(String),
    #[error("ApprovalRequests are created by the operator only, not by {user}")]
    CreatedByOther { user: String },
    #[error("the spec of an ApprovalRequest cannot change")]
    SpecChanged,
    #[error(
        "ApprovalRequest {name} was already decided ({decision:?}{}); a decision is final",
        .decided_by.as_ref().map(|b| format!(" by {b}")).unwrap_or_default()
    )]
    AlreadyDecided {
        name: String,
        decision: Decision,
        decided_by: Option<String>,
    },
    #[error("the operator ({user}) may only set Expired or Withdrawn, not {decision:?}")]
    OperatorDecided { user: String, decision: Decision },
    #[error("only the operator sets {decision:?}; approvers set Approved or Denied")]
    OperatorOnly { decision: Decision },
    #[error("ApprovalRequest {name} expired at {expires}; it can no longer be decided")]
    Expired { name: String, expires: Timestamp },
    #[error("{user} is bound to pod {pod}, which asked; a pod cannot approve its own calls")]
    AskingPod { user: String, pod: String },
    #[error("{user} is the asking pod's own service account; it cannot decide its calls")]
    OwnServiceAccount { user: String },
    #[error("cannot read AgentPolicy {policy}: {source}")]
    PolicyUnreadable { policy: String, source: kube::Error },
    #[error(
        "{user} is a service account of namespace {namespace}, where the asking pod runs; it may decide only if AgentPolicy {policy} lists {account} in spec.approval.allowedServiceAccounts"
    )]
    NamespaceServiceAccount {
        user: String,
        namespace: String,
        policy: String,
        account: String,
    },
}

/// The verdict on a write to an ApprovalRequest (or its status).
pub async fn validate(
    client: &kube::Client,
    operator: &str,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(), Refusal> {
    let user = request.user_info.username.clone().unwrap_or_default();
    let new = parse(request.object.as_ref())?;
    if request.operation == Operation::Create {
        return if user == operator {
            Ok(())
        } else {
            Err(Refusal::CreatedByOther { user })
        };
    }
    let old = parse(request.old_object.as_ref())?;
    let is_status = request.sub_resource.as_deref() == Some("status");
    if !is_status {
        return if new.spec == old.spec {
            Ok(())
        } else {
            Err(Refusal::SpecChanged)
        };
    }
    let before = old.status.clone().unwrap_or_default();
    let after = new.status.clone().unwrap_or_default();
    if before.decision != Decision::Pending {
        return if after == before {
            Ok(())
        } else {
            Err(Refusal::AlreadyDecided {
                name: request.name.clone(),
                decision: before.decision,
                decided_by: before.decided_by,
            })
        };
    }
    if after.decision == Decision::Pending {
        return Ok(());
    }
    if user == operator {
        return if matches!(after.decision, Decision::Expired | Decision::Withdrawn) {
            Ok(())
        } else {
            Err(Refusal::OperatorDecided {
                user,
                decision: after.decision,
            })
        };
    }
    if matches!(after.decision, Decision::Expired | Decision::Withdrawn) {
        return Err(Refusal::OperatorOnly {
            decision: after.decision,
        });
    }
    let expires = old.spec.expires_at.0;
    if Timestamp::now() >= expires {
        return Err(Refusal::Expired {
            name: request.name.clone(),
            expires,
        });
    }
    let extra = request.user_info.extra.clone().unwrap_or_default();
    if extra
        .get(POD_NAME_EXTRA)
        .is_some_and(|pods| pods.contains(&old.spec.pod))
    {
        return Err(Refusal::AskingPod {
            user,
            pod: old.spec.pod,
        });
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    if let Some(account) = user.strip_prefix(&format!("system:serviceaccount:{namespace}:")) {
        if account == old.spec.service_account {
            return Err(Refusal::OwnServiceAccount { user });
        }
        let policies: Api<AgentPolicy> = Api::namespaced(client.clone(), &namespace);
        let allowed = policies
            .get_opt(&old.spec.policy)
            .await
            .map_err(|source| Refusal::PolicyUnreadable {
                policy: old.spec.policy.clone(),
                source,
            })?
            .and_then(|p| p.spec.approval)
            .is_some_and(|a| a.allowed_service_accounts.iter().any(|a| a == account));
        if !allowed {
            return Err(Refusal::NamespaceServiceAccount {
                account: account.to_owned(),
                user,
                namespace,
                policy: old.spec.policy,
            });
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

fn parse(object: Option<&DynamicObject>) -> Result<ApprovalRequest, Refusal> {
    let object = object.ok_or(Refusal::NoObject)?;
    let value = serde_json::to_value(object).map_err(|e| Refusal::Unreadable(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| Refusal::NotAnApprovalRequest(e.to_string()))
}

//! ApprovalRequest: one tool call held by an `ask` rule, waiting for a human.
//! Created by the operator (never by the agent pod); one request releases
//! exactly one execution. Approvers patch its status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A held tool call and the human decision about it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "aip.io",
    version = "v1alpha1",
    kind = "ApprovalRequest",
    doc = "One tool call held for a human decision; approvers patch its status.",
    plural = "approvalrequests",
    shortname = "apr",
    category = "aip",
    namespaced,
    status = "ApprovalRequestStatus",
    printcolumn = r#"{"name":"Tool","type":"string","jsonPath":".spec.tool"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.pod"}"#,
    printcolumn = r#"{"name":"Decision","type":"string","jsonPath":".status.decision"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self == oldSelf", "message": "spec is immutable"}
]))]
pub struct ApprovalRequestSpec {
    /// The AgentPolicy whose ask rule held the call.
    pub policy: String,
    /// The asking pod's name.
    pub pod: String,
    /// The asking pod's uid (a pod of the same name later is another pod).
    pub pod_uid: String,
    /// The asking pod's service account.
    pub service_account: String,
    /// The sidecar process that asked; a restarted sidecar (a new
    /// instance) has lost the call, and the request is withdrawn.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sidecar_instance: String,
    /// The sidecar's id for the held call (fixed across its retries); the
    /// request is named after it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ask_id: String,
    /// The ToolConnection the call goes to.
    pub connection: String,
    /// The tool as the agent named it.
    pub tool: String,
    /// The call's arguments as JSON, DLP-redacted and size-capped.
    pub arguments: String,
    /// sha256:... of the arguments as the agent sent them.
    pub arguments_hash: String,
    /// After this the request is Expired and the call is answered as such.
    pub expires_at: Time,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Decision {
    #[default]
    Pending,
    Approved,
    Denied,
    /// No decision before spec.expiresAt.
    Expired,
    /// Ended without a person's decision (status.reason says why: the
    /// agent cancelled, its session ended, the policy changed, the gateway
    /// shut down or stayed away, the pod is gone): it will never run.
    Withdrawn,
}

/// The decision, and who made it when.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestStatus {
    /// Pending until an approver sets Approved or Denied, or the operator
    /// Expired or Withdrawn; final once set.
    #[serde(default)]
    pub decision: Decision,
    /// Stamped by the admission webhook from the authenticated user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// When, stamped by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
    /// The approver's words; for Withdrawn, why, as one word
    /// (PolicyChanged, Cancelled, SessionEnded, GatewayShutdown,
    /// SidecarAway, SidecarRestarted, PodGone, OperatorUnreachable,
    /// OperatorRefused, StreamClosed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

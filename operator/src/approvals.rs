//! The operator's side of human approval: a sidecar's `RequestApproval`
//! becomes an ApprovalRequest object (created by the operator, never by the
//! agent pod), and the decision an approver patches into its status is
//! streamed back. State lives in the object, so a stream that breaks (an
//! operator restart) is resumed by name and loses nothing.

use std::time::{Duration, SystemTime};

use aip_proto::v1::{ApprovalRequest as Ask, ApprovalUpdate, approval_update::Decision as Wire};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::Status;

use crate::api::ApprovalRequest;
use crate::api::approval_request::{ApprovalRequestSpec, Decision};
use crate::grpc::PodIdentity;

/// Arguments kept in a request, at most (the hash covers the whole).
pub const MAX_ARGUMENTS_BYTES: usize = 16 * 1024;
pub const FIELD_MANAGER: &str = "aip-operator";
pub const POD_LABEL: &str = "aip.io/pod";
pub const POLICY_LABEL: &str = "aip.io/policy";
pub const TOOL_LABEL: &str = "aip.io/tool";

/// Creates the ApprovalRequest for an ask from `pod`, governed by
/// `policy`, waiting at most `timeout`; its name.
pub async fn create(
    client: &kube::Client,
    pod: &PodIdentity,
    policy: &str,
    timeout: Duration,
    ask: &Ask,
) -> Result<String, Status> {
    if ask.tool.is_empty() || ask.connection.is_empty() {
        return Err(Status::invalid_argument("tool and connection are required"));
    }
    let mut arguments = ask.arguments_json.clone();
    if arguments.len() > MAX_ARGUMENTS_BYTES {
        let mut end = MAX_ARGUMENTS_BYTES;
        while !arguments.is_char_boundary(end) {
            end -= 1;
        }
        arguments.truncate(end);
        arguments.push_str("…(truncated)");
    }
    let expires = Timestamp::try_from(SystemTime::now() + timeout)
        .map_err(|e| Status::internal(format!("expiry: {e}")))?;
    let object = ApprovalRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", label_value(&ask.tool).replace('_', "-"))),
            namespace: Some(pod.namespace.clone()),
            labels: Some(
                [
                    (POD_LABEL.to_owned(), label_value(&pod.pod)),
                    (POLICY_LABEL.to_owned(), label_value(policy)),
                    (TOOL_LABEL.to_owned(), label_value(&ask.tool)),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: ApprovalRequestSpec {
            policy: policy.to_owned(),
            pod: pod.pod.clone(),
            pod_uid: pod.uid.clone(),
            service_account: pod.service_account.clone(),
            connection: ask.connection.clone(),
            tool: ask.tool.clone(),
            arguments,
            arguments_hash: ask.arguments_hash.clone(),
            expires_at: Time(expires),
        },
        status: None,
    };
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), &pod.namespace);
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| Status::unavailable(format!("cannot create the ApprovalRequest: {e}")))?;
    let name = created.metadata.name.unwrap_or_default();
    set_decision(&api, &name, Decision::Pending, None).await?;
    tracing::info!(namespace = %pod.namespace, pod = %pod.pod, approval = %name, tool = %ask.tool, "approval requested");
    Ok(name)
}

/// Follows ApprovalRequest `name` until it is decided, expires, or the
/// sidecar goes away (then it is Withdrawn), sending each state on `tx`.
pub async fn follow(
    client: kube::Client,
    pod: PodIdentity,
    name: String,
    tx: mpsc::Sender<Result<ApprovalUpdate, Status>>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let _pending = metrics.approval_pending();
    let api: Api<ApprovalRequest> = Api::namespaced(client, &pod.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut objects = watcher::watcher(api.clone(), config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut expiry: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let object = tokio::select! {
            next = objects.next() => match next {
                Some(Ok(o)) => o,
                Some(Err(e)) => { tracing::warn!(approval = %name, error = %e, "watch error"); continue; }
                None => return,
            },
            () = sleep(&mut expiry) => {
                // Only a request still pending expires; a decision that won
                // the race is delivered by the watch.
                let _ = set_decision_if_pending(&api, &name, Decision::Expired).await;
                expiry = None;
                continue;
            }
            () = tx.closed() => {
                let _ = set_decision_if_pending(&api, &name, Decision::Withdrawn).await;
                return;
            }
        };
        if object.spec.pod_uid != pod.uid {
            let _ = tx
                .send(Err(Status::permission_denied(
                    "that ApprovalRequest belongs to another pod",
                )))
                .await;
            return;
        }
        let status = object.status.clone().unwrap_or_default();
        if expiry.is_none() && status.decision == Decision::Pending {
            let left = SystemTime::from(object.spec.expires_at.0)
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            expiry = Some(Box::pin(tokio::time::sleep(left)));
        }
        let update = ApprovalUpdate {
            name: name.clone(),
            decision: wire(status.decision) as i32,
            reason: status.reason.clone().unwrap_or_default(),
            decided_by: status.decided_by.clone().unwrap_or_default(),
        };
        let last = status.decision != Decision::Pending;
        if last && let Some(created) = object.metadata.creation_timestamp.as_ref() {
            let took = Timestamp::now().duration_since(created.0);
            metrics.approval_decided(Duration::from_secs(
                u64::try_from(took.as_secs()).unwrap_or(0),
            ));
        }
        if tx.send(Ok(update)).await.is_err() || last {
            return;
        }
    }
}

async fn sleep(at: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match at {
        Some(s) => s.as_mut().await,
        None => std::future::pending().await,
    }
}

fn wire(decision: Decision) -> Wire {
    match decision {
        Decision::Pending => Wire::Pending,
        Decision::Approved => Wire::Approved,
        Decision::Denied => Wire::Denied,
        Decision::Expired => Wire::Expired,
        Decision::Withdrawn => Wire::Withdrawn,
    }
}

async fn set_decision(
    api: &Api<ApprovalRequest>,
    name: &str,
    decision: Decision,
    resource_version: Option<String>,
) -> Result<(), Status> {
    let mut status = json!({"status": {"decision": decision}});
    if let Some(rv) = resource_version {
        status["metadata"] = json!({"resourceVersion": rv});
    }
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map(|_| ())
        .map_err(|e| Status::unavailable(format!("cannot write the ApprovalRequest's status: {e}")))
}

/// Sets a final decision only if none was made: the read's resourceVersion
/// makes the write fail if a person decided in between.
async fn set_decision_if_pending(
    api: &Api<ApprovalRequest>,
    name: &str,
    decision: Decision,
) -> Result<(), Status> {
    let current = api
        .get(name)
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    if current.status.unwrap_or_default().decision != Decision::Pending {
        return Ok(());
    }
    tracing::info!(approval = %name, decision = ?decision, "approval ended without a decision");
    set_decision(api, name, decision, current.metadata.resource_version).await
}

/// A label value: at most 63 of [A-Za-z0-9-_.], starting and ending with an
/// alphanumeric.
pub fn label_value(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "x".to_owned()
    } else {
        trimmed.to_ascii_lowercase()
    }
}

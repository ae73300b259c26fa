//! The operator's side of human approval: a sidecar's `RequestApproval`
//! becomes an ApprovalRequest object (created by the operator, never by the
//! agent pod), and the decision an approver patches into its status is
//! streamed back. State lives in the object, so a stream that breaks (an
//! operator restart) is resumed by name and loses nothing.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aip_api::ApprovalRequest;
use aip_api::approval_request::{ApprovalRequestSpec, Decision};
use aip_proto::v1::{ApprovalRequest as Ask, ApprovalUpdate, approval_update::Decision as Wire};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::events::{pod_reference, publish};
use crate::identity::PodIdentity;
use crate::metrics::Metrics;

/// Arguments kept in a request, at most (the hash covers the whole).
pub const MAX_ARGUMENTS_BYTES: usize = 16 * 1024;
pub const POD_LABEL: &str = "aip.io/pod";
pub const POLICY_LABEL: &str = "aip.io/policy";
pub const TOOL_LABEL: &str = "aip.io/tool";

/// Where asks become ApprovalRequests, and what watches them.
pub struct Approvals {
    pub client: kube::Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// On shutdown a follower stops without withdrawing: the sidecar resumes
    /// with the next operator.
    pub shutdown: CancellationToken,
}

impl Approvals {
    /// Creates the ApprovalRequest for an ask from `pod`, governed by
    /// `policy`, waiting at most `timeout`; its name.
    pub async fn create(
        &self,
        pod: &PodIdentity,
        policy: &str,
        timeout: Duration,
        ask: &Ask,
    ) -> Result<String, Status> {
        let object = request_object(pod, policy, timeout, ask)?;
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &pod.namespace);
        let created = api
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| Status::unavailable(format!("cannot create the ApprovalRequest: {e}")))?;
        let name = created.metadata.name.clone().unwrap_or_default();
        set_decision(&api, &name, Decision::Pending, None).await?;
        tracing::info!(namespace = %pod.namespace, pod = %pod.pod, approval = %name, tool = %ask.tool, "approval requested");
        let note = format!(
            "pod {} asks to call {} on {}; decide with: kubectl aip approve {name} -n {} (or deny)",
            pod.pod, ask.tool, ask.connection, pod.namespace
        );
        let pod_ref = pod_reference(&pod.namespace, &pod.pod, Some(&pod.uid));
        for reference in [created.object_ref(&()), pod_ref] {
            publish(
                &self.recorder,
                EventType::Normal,
                "ApprovalRequested",
                "Ask",
                Some(note.clone()),
                &reference,
            )
            .await;
        }
        Ok(name)
    }

    /// Follows ApprovalRequest `name` until it is decided, expires, or the
    /// sidecar goes away (then it is Withdrawn), sending each state on `tx`.
    pub async fn follow(
        self: Arc<Self>,
        pod: PodIdentity,
        name: String,
        tx: mpsc::Sender<Result<ApprovalUpdate, Status>>,
    ) {
        let _pending = self.metrics.approval_pending();
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &pod.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut objects = watcher::watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut expiry: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            let object = tokio::select! {
                biased;
                // Checked first: at shutdown the streams close too, and that
                // is not the sidecar leaving.
                () = self.shutdown.cancelled() => return,
                () = tx.closed() => {
                    let _ = set_decision_if_pending(&api, &name, Decision::Withdrawn).await;
                    return;
                }
                () = sleep(&mut expiry) => {
                    // Only a request still pending expires; a decision that
                    // won the race is delivered by the watch.
                    let _ = set_decision_if_pending(&api, &name, Decision::Expired).await;
                    expiry = None;
                    continue;
                }
                next = objects.next() => match next {
                    Some(Ok(o)) => o,
                    Some(Err(e)) => { tracing::warn!(approval = %name, error = %e, "watch error"); continue; }
                    None => return,
                },
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
                self.metrics.approval_decided(Duration::from_secs(
                    u64::try_from(took.as_secs()).unwrap_or(0),
                ));
            }
            if tx.send(Ok(update)).await.is_err() || last {
                return;
            }
        }
    }

    /// A sidecar of `pod` started as `instance`: the requests an earlier
    /// instance left pending wait for calls that no longer exist (the
    /// agents' sessions died with it), so they are withdrawn.
    pub async fn withdraw_earlier(&self, pod: &PodIdentity, instance: &str) {
        if instance.is_empty() {
            return;
        }
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &pod.namespace);
        let selector = format!("{POD_LABEL}={}", label_value(&pod.pod));
        let list = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.pod, error = %e, "cannot list the pod's ApprovalRequests");
                return;
            }
        };
        for request in list {
            let pending = request
                .status
                .as_ref()
                .is_none_or(|s| s.decision == Decision::Pending);
            let earlier = !request.spec.sidecar_instance.is_empty()
                && request.spec.sidecar_instance != instance;
            if pending && earlier && request.spec.pod_uid == pod.uid {
                let name = request.name_any();
                tracing::info!(approval = %name, "the sidecar that asked restarted");
                let _ = set_decision_if_pending(&api, &name, Decision::Withdrawn).await;
            }
        }
    }
}

/// The object for an ask: arguments capped, labels for pod, policy and
/// tool; not owned by the pod, so the record outlives it until retention.
fn request_object(
    pod: &PodIdentity,
    policy: &str,
    timeout: Duration,
    ask: &Ask,
) -> Result<ApprovalRequest, Status> {
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
    Ok(ApprovalRequest {
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
            sidecar_instance: ask.sidecar_instance.clone(),
            connection: ask.connection.clone(),
            tool: ask.tool.clone(),
            arguments,
            arguments_hash: ask.arguments_hash.clone(),
            expires_at: Time(expires),
        },
        status: None,
    })
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
pub async fn set_decision_if_pending(
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

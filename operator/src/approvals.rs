//! The operator's side of human approval: a sidecar's `RequestApproval`
//! becomes an ApprovalRequest object (created by the operator, never by the
//! agent pod), and the decision an approver patches into its status is
//! streamed back. State lives in the object, so a stream that breaks (a
//! TCP reset, an operator restart) is resumed by name and loses nothing.
//!
//! An ask belongs to the sidecar instance and the call, not to one stream.
//! It ends without a person's decision only when the sidecar says so
//! (`withdraw`), a new instance of the pod's sidecar connects
//! (`withdraw_earlier`), the pod is gone, or nobody has followed it for
//! longer than [`AWAY_BOUND`]: each follower writes who follows the request
//! (`FOLLOWED_BY`, a replica and a stream of it) when it starts, and, when
//! its stream closes while it is still the one named, since when nobody
//! does (`AWAY_SINCE`); the lease holder withdraws a request away for
//! longer than the bound (`controllers::approval_lifecycle`). Sidecars from
//! before explicit withdrawals (`withdraws_explicitly` unset) keep the old
//! rule: their stream closing withdraws the ask.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aip_api::ApprovalRequest;
use aip_api::approval_request::{ApprovalRequestSpec, Decision};
use aip_policy::Withdrawal;
use aip_proto::v1::{
    ApprovalRequest as Ask, ApprovalUpdate, ApprovalWithdrawal, approval_update::Decision as Wire,
};
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
/// Which replica follows a request for its sidecar, and on which stream:
/// `REPLICA/STREAM`.
pub const FOLLOWED_BY: &str = "aip.io/followed-by";
/// Since when no stream follows the request (RFC 3339), written by the
/// follower whose stream closed while it was still the one named.
pub const AWAY_SINCE: &str = "aip.io/away-since";
/// How long an ask waits for its sidecar to come back (to any replica)
/// before the lease holder withdraws it (`SidecarAway`), by default
/// (`--approval-away-bound`). Longer than a sidecar's reconnect back-off
/// (15 s and a quarter) and an operator restart; the sidecar is told to give
/// up on its own after twice the bound, by when the operator has withdrawn
/// the request even if it learned of the loss only through HTTP/2 keepalive
/// (50 s).
pub const AWAY_BOUND: Duration = aip_proto::APPROVAL_AWAY_BOUND;

/// Where asks become ApprovalRequests, and what watches them.
pub struct Approvals {
    pub client: kube::Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// On shutdown a follower stops without withdrawing: the sidecar resumes
    /// with the next operator.
    pub shutdown: CancellationToken,
    /// This replica's name, for `FOLLOWED_BY`.
    pub replica: String,
    /// How long an ask waits for its sidecar to come back.
    pub away_bound: Duration,
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
        let created = match api.create(&PostParams::default(), &object).await {
            Ok(created) => created,
            // A retry of an ask whose first create succeeded unseen (the
            // answer was lost with the connection): the same request.
            Err(kube::Error::Api(e)) if e.code == 409 && !ask.ask_id.is_empty() => {
                let name = object.metadata.name.clone().unwrap_or_default();
                let existing = api.get(&name).await.map_err(|e| {
                    Status::unavailable(format!(
                        "cannot read ApprovalRequest {name}: {}",
                        crate::errors::api_reason(&e)
                    ))
                })?;
                if existing.spec.pod_uid != pod.uid || existing.spec.ask_id != ask.ask_id {
                    return Err(Status::already_exists(format!(
                        "ApprovalRequest {name} exists for another call"
                    )));
                }
                if existing.status.is_none() {
                    set_decision(&api, &name, Decision::Pending, None, None).await?;
                }
                tracing::info!(namespace = %pod.namespace, pod = %pod.pod, approval = %name, "approval request retried; following the one already made");
                return Ok(name);
            }
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "cannot create the ApprovalRequest: {}",
                    crate::errors::api_reason(&e)
                )));
            }
        };
        let name = created.metadata.name.clone().unwrap_or_default();
        set_decision(&api, &name, Decision::Pending, None, None).await?;
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

    /// Follows ApprovalRequest `name` until it is decided or expires,
    /// sending each state on `tx`, while the stream is open. `explicit`: the
    /// sidecar withdraws its asks itself, so a stream that closes only
    /// leaves the request away (`AWAY_SINCE`); from older sidecars it
    /// withdraws the request, as before.
    pub async fn follow(
        self: Arc<Self>,
        pod: PodIdentity,
        name: String,
        explicit: bool,
        tx: mpsc::Sender<Result<ApprovalUpdate, Status>>,
    ) {
        let _pending = self.metrics.approval_pending();
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &pod.namespace);
        let stream = format!("{}/{:08x}", self.replica, rand::random::<u32>());
        if explicit {
            self.mark_followed(&api, &name, &stream).await;
        }
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
                    if explicit {
                        self.mark_away(&api, &name, &stream).await;
                    } else {
                        let _ = set_decision_if_pending(&api, &name, Decision::Withdrawn, Some(Withdrawal::StreamClosed)).await;
                    }
                    return;
                }
                () = sleep(&mut expiry) => {
                    // Only a request still pending expires; a decision that
                    // won the race is delivered by the watch.
                    let _ = set_decision_if_pending(&api, &name, Decision::Expired, None).await;
                    expiry = None;
                    continue;
                }
                next = objects.next() => match next {
                    Some(Ok(o)) => o,
                    Some(Err(e)) => { tracing::warn!(approval = %name, error = %crate::errors::Watch(&e), "the ApprovalRequest's watch failed; it is retried"); continue; }
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
            let update = self.update_of(&name, &object);
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

    /// Names this stream as the one following `name`, and clears any
    /// `AWAY_SINCE`: the sidecar is back.
    async fn mark_followed(&self, api: &Api<ApprovalRequest>, name: &str, stream: &str) {
        let patch = json!({"metadata": {"annotations": {FOLLOWED_BY: stream, AWAY_SINCE: null}}});
        if let Err(e) = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            tracing::warn!(approval = %name, error = %crate::errors::Api(&e), "could not record who follows the ApprovalRequest");
        }
    }

    /// Records since when nobody follows `name`, if this stream is still
    /// the one named: a stream the sidecar opened since (here or on another
    /// replica) has renamed it, and then the JSON patch's test fails and
    /// nothing is written.
    async fn mark_away(&self, api: &Api<ApprovalRequest>, name: &str, stream: &str) {
        let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let patch = json!([
            {"op": "test", "path": "/metadata/annotations/aip.io~1followed-by", "value": stream},
            {"op": "add", "path": "/metadata/annotations/aip.io~1away-since", "value": now},
        ]);
        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else {
            return;
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(approval = %name, withdrawn_after_s = self.away_bound.as_secs(), "the sidecar's approval stream closed; the ask waits for the sidecar to resume it");
            }
            // Followed again already, decided, or gone.
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => {}
            Err(e) => {
                tracing::warn!(approval = %name, error = %crate::errors::Api(&e), "could not record that the sidecar's approval stream closed");
            }
        }
    }

    /// The sidecar of `pod` ends an ask undecided (`withdrawal.reason`); the
    /// request's state afterwards (a decision that came first stands).
    pub async fn withdraw(
        &self,
        pod: &PodIdentity,
        withdrawal: &ApprovalWithdrawal,
    ) -> Result<ApprovalUpdate, Status> {
        let reason: Withdrawal = withdrawal
            .reason
            .parse()
            .map_err(|e: aip_policy::UnknownWithdrawal| Status::invalid_argument(e.to_string()))?;
        let name = if withdrawal.name.is_empty() {
            if withdrawal.ask_id.is_empty() {
                return Err(Status::invalid_argument("name or ask_id is required"));
            }
            request_name(
                &withdrawal.tool,
                &pod.uid,
                &withdrawal.sidecar_instance,
                &withdrawal.ask_id,
            )
        } else {
            withdrawal.name.clone()
        };
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &pod.namespace);
        let current = match api.get_opt(&name).await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(Status::not_found(format!("no ApprovalRequest {name}"))),
            Err(e) => return Err(Status::unavailable(crate::errors::api_reason(&e))),
        };
        if current.spec.pod_uid != pod.uid {
            return Err(Status::permission_denied(
                "that ApprovalRequest belongs to another pod",
            ));
        }
        if current
            .status
            .as_ref()
            .is_none_or(|s| s.decision == Decision::Pending)
        {
            tracing::info!(namespace = %pod.namespace, approval = %name, reason = reason.as_str(), "the sidecar withdrew its ask");
            set_decision_if_pending(&api, &name, Decision::Withdrawn, Some(reason)).await?;
        }
        let after = api
            .get(&name)
            .await
            .map_err(|e| Status::unavailable(crate::errors::api_reason(&e)))?;
        let decision = after
            .status
            .as_ref()
            .map(|s| s.decision)
            .unwrap_or_default();
        if decision == Decision::Approved {
            tracing::warn!(namespace = %pod.namespace, approval = %name, reason = reason.as_str(), "an approved ApprovalRequest's call was withdrawn by its sidecar before the approval reached it; the call did not run");
        }
        Ok(self.update_of(&name, &after))
    }

    /// What the sidecar is told of `object`: its state, its expiry, and how
    /// long to keep the ask without this operator.
    fn update_of(&self, name: &str, object: &ApprovalRequest) -> ApprovalUpdate {
        let status = object.status.clone().unwrap_or_default();
        let keep = self.away_bound.saturating_mul(2);
        ApprovalUpdate {
            name: name.to_owned(),
            decision: wire(status.decision) as i32,
            reason: status.reason.unwrap_or_default(),
            decided_by: status.decided_by.unwrap_or_default(),
            expires_at_unix_ms: object.spec.expires_at.0.as_millisecond(),
            keep_without_operator_ms: u32::try_from(keep.as_millis()).unwrap_or(u32::MAX),
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
                tracing::warn!(namespace = %pod.namespace, pod = %pod.pod, error = %crate::errors::Api(&e), "cannot list the pod's ApprovalRequests");
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
                let _ = set_decision_if_pending(
                    &api,
                    &name,
                    Decision::Withdrawn,
                    Some(Withdrawal::SidecarRestarted),
                )
                .await;
            }
        }
    }
}

/// The name of the request for ask `ask_id` of sidecar `instance` of pod
/// `uid`: the tool's name and ten hex digits of their hash, so that a
/// retried create meets the request it already made.
pub fn request_name(tool: &str, uid: &str, instance: &str, ask_id: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{uid}/{instance}/{ask_id}").as_bytes());
    let hash = hex::encode(&digest[..5]);
    format!("{}-{hash}", label_value(tool).replace('_', "-"))
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
    // Named after the ask when the sidecar gives its id (a retried create
    // then finds it), generated otherwise (sidecars before ask ids).
    let (name, generate_name) = if ask.ask_id.is_empty() {
        (
            None,
            Some(format!("{}-", label_value(&ask.tool).replace('_', "-"))),
        )
    } else {
        let name = request_name(&ask.tool, &pod.uid, &ask.sidecar_instance, &ask.ask_id);
        (Some(name), None)
    };
    Ok(ApprovalRequest {
        metadata: ObjectMeta {
            name,
            generate_name,
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
            ask_id: ask.ask_id.clone(),
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
    reason: Option<&str>,
    resource_version: Option<String>,
) -> Result<(), Status> {
    let mut status = json!({"status": {"decision": decision}});
    if let Some(reason) = reason {
        status["status"]["reason"] = json!(reason);
    }
    if let Some(rv) = resource_version {
        status["metadata"] = json!({"resourceVersion": rv});
    }
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map(|_| ())
        .map_err(|e| {
            Status::unavailable(format!(
                "cannot write the ApprovalRequest's status: {}",
                crate::errors::api_reason(&e)
            ))
        })
}

/// Sets a final decision only if none was made: the read's resourceVersion
/// makes the write fail if a person decided in between. `why`: the
/// withdrawal's word, kept as the status's reason.
pub async fn set_decision_if_pending(
    api: &Api<ApprovalRequest>,
    name: &str,
    decision: Decision,
    why: Option<Withdrawal>,
) -> Result<(), Status> {
    let current = api
        .get(name)
        .await
        .map_err(|e| Status::unavailable(crate::errors::api_reason(&e)))?;
    if current.status.unwrap_or_default().decision != Decision::Pending {
        return Ok(());
    }
    let reason = why.map(Withdrawal::as_str);
    tracing::info!(approval = %name, decision = decision_word(decision), reason, "approval ended without a person's decision");
    let rv = current.metadata.resource_version;
    set_decision(api, name, decision, reason, rv).await
}

/// A decision as its status writes it.
pub fn decision_word(decision: Decision) -> &'static str {
    match decision {
        Decision::Pending => "Pending",
        Decision::Approved => "Approved",
        Decision::Denied => "Denied",
        Decision::Expired => "Expired",
        Decision::Withdrawn => "Withdrawn",
    }
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

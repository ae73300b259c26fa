//! AgentPolicy status: Accepted (with aip-policy's exact field-path errors),
//! Ready (every governed sidecar runs the current hash), Conflict (a pod is
//! also selected by another policy), the hash and "synced/governed". Written
//! with server-side apply, only by the lease holder, only when it changes.

use std::sync::Arc;
use std::time::Duration;

use aip_api::{AgentPolicy, AgentPolicyStatus};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use super::conditions::{Conditions, ours};
use super::{Context, FIELD_MANAGER, LIST_PAGE};
use crate::events::{pod_reference, publish};
use crate::index::{ObjectKey, PolicyView};

/// The condition types this writer owns.
const CONDITIONS: &[&str] = &["Accepted", "Ready", "Conflict"];

/// Status writes in flight at once.
const STATUS_WRITERS: u16 = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the status: {0}")]
    Patch(#[source] kube::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Patch(_) => "patch",
        }
    }
}

/// Runs the status writer until the stream of policies ends.
pub async fn run(ctx: Arc<Context>, touched: mpsc::UnboundedReceiver<ObjectKey>) {
    let api: Api<AgentPolicy> = Api::all(ctx.client.clone());
    let touched = tokio_stream::wrappers::UnboundedReceiverStream::new(touched)
        .map(|k| ObjectRef::new(&k.name).within(&k.namespace));
    // Gaining the lease means every status may be stale: rewrite them all.
    let leading = tokio_stream::wrappers::WatchStream::new(ctx.leader.clone())
        .filter_map(|l| async move { l.then_some(()) });
    // A bounded number of status writes in flight: each is an API request,
    // and ten thousand at once would open as many connections.
    let config = kube::runtime::controller::Config::default().concurrency(STATUS_WRITERS);
    // The cache keeps what a status write needs (metadata and status); the
    // index holds the validated spec, so ten thousand policies are not kept
    // twice.
    let (reader, writer) = kube::runtime::reflector::store();
    let objects = watcher::watcher(api, watcher::Config::default().page_size(LIST_PAGE))
        .default_backoff()
        .modify(|p: &mut AgentPolicy| {
            p.managed_fields_mut().clear();
            p.annotations_mut().clear();
            p.spec = aip_api::AgentPolicySpec::default();
        })
        .reflect(writer)
        .touched_objects();
    Controller::for_stream(objects, reader)
        .with_config(config)
        .reconcile_on(touched)
        .reconcile_all_on(leading)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

async fn reconcile(policy: Arc<AgentPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled("AgentPolicy");
    if !*ctx.leader.borrow() {
        // The replica that gains the lease reconciles everything then.
        return Ok(Action::await_change());
    }
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let Some(view) = ctx
        .index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .policy_view(&ns, &name)
    else {
        // The feed has not seen it yet; it will signal when it has.
        return Ok(Action::await_change());
    };
    if view.generation != policy.metadata.generation {
        return Ok(Action::await_change());
    }
    let current = policy.status.clone().unwrap_or_default();
    let desired = desired(&view, &current, Time(jiff_now()));
    // Other writers' conditions are theirs: they neither call for a write
    // nor go with one.
    let ours_now = AgentPolicyStatus {
        conditions: ours(&current.conditions, CONDITIONS),
        ..current.clone()
    };
    if desired == ours_now {
        return Ok(Action::requeue(Duration::from_secs(300)));
    }
    let api: Api<AgentPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({
        "apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
        "status": desired,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await
    .map_err(Error::Patch)?;
    announce(&ctx, &policy, &view, &current, &desired).await;
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<AgentPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "AgentPolicy status not written; retrying");
    ctx.metrics
        .reconcile_failed("AgentPolicy", error.metric_label());
    Action::requeue(Duration::from_secs(2))
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// The status the view calls for. Conditions keep their transition time
/// while their status stays the same.
pub fn desired(view: &PolicyView, current: &AgentPolicyStatus, now: Time) -> AgentPolicyStatus {
    let generation = view.generation;
    let conditions = Conditions {
        before: &current.conditions,
        generation,
        now,
    };
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        conditions.set(type_, ok, reason, message)
    };
    let accepted = if view.errors.is_empty() {
        condition(
            "Accepted",
            true,
            "Valid",
            "the policy validates and compiles".to_owned(),
        )
    } else {
        let errors: Vec<String> = view.errors.iter().map(ToString::to_string).collect();
        let kept = view.accepted.as_ref().map_or_else(
            || {
                " No earlier version was accepted: the pods it selects refuse every tool call."
                    .to_owned()
            },
            |a| {
                format!(
                    " Pods keep enforcing the last accepted version ({}).",
                    a.hash
                )
            },
        );
        condition(
            "Accepted",
            false,
            "Invalid",
            format!("{}.{kept}", errors.join("; ")),
        )
    };
    let conflict = if view.conflicts.is_empty() {
        condition("Conflict", false, "NoConflict", String::new())
    } else {
        let pods: Vec<String> = view
            .conflicts
            .iter()
            .take(10)
            .map(|(pod, others)| format!("{pod} (also {})", others.join(", ")))
            .collect();
        let more = view.conflicts.len().saturating_sub(10);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        condition(
            "Conflict",
            true,
            "PodsSelectedTwice",
            format!(
                "pods selected by more than one AgentPolicy get neither and refuse every tool call: {}{tail}",
                pods.join("; ")
            ),
        )
    };
    let ready = if !view.errors.is_empty() {
        condition(
            "Ready",
            false,
            "NotAccepted",
            "the current spec is not accepted".to_owned(),
        )
    } else if !view.missing_connections.is_empty() {
        condition(
            "Ready",
            false,
            "MissingConnections",
            format!(
                "no ToolConnection named {} in this namespace",
                view.missing_connections.join(", ")
            ),
        )
    } else if !view.without_sidecar.is_empty() {
        condition(
            "Ready",
            false,
            "PodsWithoutSidecar",
            format!(
                "{} governed pod(s) run without the aip-sidecar gateway, so their tool calls are not governed (e.g. {}): label the namespace or the pods aip.io/inject=enabled and recreate them",
                view.without_sidecar.len(),
                view.without_sidecar
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else if view.synced_pods < view.governed_pods {
        condition(
            "Ready",
            false,
            "Syncing",
            format!(
                "{} of {} governed sidecars run the current policy",
                view.synced_pods, view.governed_pods
            ),
        )
    } else {
        condition(
            "Ready",
            true,
            "Synced",
            format!(
                "{} governed sidecars run the current policy",
                view.governed_pods
            ),
        )
    };
    AgentPolicyStatus {
        conditions: vec![accepted, ready, conflict],
        observed_generation: generation,
        // With no accepted version known (a restart while the spec is
        // invalid) the sidecars keep what they run: the hash last reported.
        policy_hash: view
            .accepted
            .as_ref()
            .map(|a| a.hash.clone())
            .or_else(|| current.policy_hash.clone()),
        mode: view
            .accepted
            .as_ref()
            .map(|a| a.mode.as_str().to_owned())
            .or_else(|| current.mode.clone()),
        governed_pods: view.governed_pods,
        synced_pods: view.synced_pods,
        locked_pods: view.locked_pods,
        synced: Some(format!("{}/{}", view.synced_pods, view.governed_pods)),
        pods_without_sidecar: view
            .without_sidecar
            .iter()
            .take(MAX_LISTED_PODS)
            .cloned()
            .collect(),
    }
}

/// Pods named in a status, at most.
const MAX_LISTED_PODS: usize = 20;

/// Events for what a person should notice: a refused spec, and pods caught
/// between two policies (on the pods too).
async fn announce(
    ctx: &Context,
    policy: &AgentPolicy,
    view: &PolicyView,
    before: &AgentPolicyStatus,
    after: &AgentPolicyStatus,
) {
    let became = |type_: &str, status: &str| {
        let was = before
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status);
        let is = after
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status);
        is && !was
    };
    let reference = policy.object_ref(&());
    if became("Accepted", "False") {
        let note = after
            .conditions
            .iter()
            .find(|c| c.type_ == "Accepted")
            .map(|c| c.message.clone());
        publish(
            &ctx.recorder,
            EventType::Warning,
            "Invalid",
            "Validate",
            note,
            &reference,
        )
        .await;
    }
    let ns = policy.namespace().unwrap_or_default();
    for pod in after
        .pods_without_sidecar
        .iter()
        .filter(|p| !before.pods_without_sidecar.contains(p))
    {
        publish(
            &ctx.recorder,
            EventType::Warning,
            "NoSidecar",
            "Govern",
            Some(format!(
                "AgentPolicy {} selects this pod, but it runs without the aip-sidecar gateway: its tool calls are not governed (label its namespace aip.io/inject=enabled and recreate it)",
                policy.name_any()
            )),
            &pod_reference(&ns, pod, None),
        )
        .await;
    }
    if became("Conflict", "True") {
        for (pod, others) in view.conflicts.iter().take(10) {
            let note = format!(
                "selected by AgentPolicies {} and {}: every tool call is refused until only one selects it",
                policy.name_any(),
                others.join(", ")
            );
            let pod_ref = pod_reference(&ns, pod, None);
            publish(
                &ctx.recorder,
                EventType::Warning,
                "PolicyConflict",
                "Select",
                Some(note.clone()),
                &pod_ref,
            )
            .await;
            publish(
                &ctx.recorder,
                EventType::Warning,
                "PolicyConflict",
                "Select",
                Some(note),
                &reference,
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use aip_policy::FieldError;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::validate::AcceptedPolicy;

    fn view() -> PolicyView {
        PolicyView {
            generation: Some(3),
            errors: Vec::new(),
            accepted: Some(Arc::new(AcceptedPolicy {
                namespace: "agents".to_owned(),
                name: "p".to_owned(),
                hash: "sha256:abc".to_owned(),
                document_json: String::new(),
                mode: aip_policy::Mode::Monitor,
                approval_timeout: Duration::from_secs(300),
            })),
            governed_pods: 12,
            synced_pods: 12,
            locked_pods: 0,
            conflicts: BTreeMap::new(),
            missing_connections: Vec::new(),
            without_sidecar: Vec::new(),
        }
    }

    fn condition<'a>(s: &'a AgentPolicyStatus, type_: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn a_synced_policy_is_accepted_and_ready() {
        let s = desired(&view(), &AgentPolicyStatus::default(), at(100));
        assert_eq!(s.synced.as_deref(), Some("12/12"));
        assert_eq!(s.policy_hash.as_deref(), Some("sha256:abc"));
        assert_eq!(s.mode.as_deref(), Some("monitor"));
        assert_eq!(condition(&s, "Accepted").status, "True");
        assert_eq!(condition(&s, "Ready").status, "True");
        assert_eq!(condition(&s, "Conflict").status, "False");
        assert_eq!(s.observed_generation, Some(3));
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let first = desired(&view(), &AgentPolicyStatus::default(), at(100));
        let mut v = view();
        v.synced_pods = 11;
        let second = desired(&v, &first, at(200));
        assert_eq!(condition(&second, "Accepted").last_transition_time, at(100));
        assert_eq!(condition(&second, "Ready").last_transition_time, at(200));
        assert_eq!(
            condition(&second, "Ready").message,
            "11 of 12 governed sidecars run the current policy"
        );
        // Nothing changed: the same status, so nothing to write.
        assert_eq!(desired(&v, &second, at(300)), second);
    }

    #[test]
    fn errors_conflicts_and_missing_connections_are_said() {
        let mut v = view();
        v.errors = vec![FieldError {
            path: "spec.tool_rules[0].rate_limit".to_owned(),
            message: "invalid rate_limit \"lots\"".to_owned(),
        }];
        v.conflicts
            .insert("agent-1".to_owned(), vec!["wide".to_owned()]);
        let s = desired(&v, &AgentPolicyStatus::default(), at(100));
        let accepted = condition(&s, "Accepted");
        assert_eq!(
            (accepted.status.as_str(), accepted.reason.as_str()),
            ("False", "Invalid")
        );
        assert_eq!(
            accepted.message,
            "spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\". Pods keep enforcing the last accepted version (sha256:abc)."
        );
        assert!(
            condition(&s, "Conflict")
                .message
                .ends_with("agent-1 (also wide)")
        );
        assert_eq!(s.policy_hash.as_deref(), Some("sha256:abc"));

        let mut v = view();
        v.missing_connections = vec!["gh".to_owned()];
        let s = desired(&v, &AgentPolicyStatus::default(), at(100));
        assert_eq!(
            condition(&s, "Ready").message,
            "no ToolConnection named gh in this namespace"
        );
    }

    #[test]
    fn pods_without_a_sidecar_are_named() {
        let mut v = view();
        v.without_sidecar = (0..25).map(|i| format!("agent-{i:02}")).collect();
        let s = desired(&v, &AgentPolicyStatus::default(), at(100));
        let ready = condition(&s, "Ready");
        assert_eq!(ready.reason, "PodsWithoutSidecar");
        assert!(
            ready
                .message
                .starts_with("25 governed pod(s) run without the aip-sidecar gateway"),
            "{}",
            ready.message
        );
        assert_eq!(s.pods_without_sidecar.len(), 20);
        assert_eq!(s.pods_without_sidecar[0], "agent-00");
    }
}

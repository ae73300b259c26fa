//! Kubernetes Events, for what a person should notice: one Recorder per
//! replica, and a publish that never fails the caller (an Event is a note,
//! not a state).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The Recorder of this replica: Events name the operator and its pod.
pub fn recorder(client: kube::Client, instance: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "aip-operator".to_owned(),
            instance: Some(instance.to_owned()),
        },
    )
}

/// Records an Event about `reference`; a failure is logged, never fatal.
pub async fn publish(
    recorder: &Recorder,
    type_: EventType,
    reason: &str,
    action: &str,
    note: Option<String>,
    reference: &ObjectReference,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: note.map(|n| n.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(error = %crate::errors::Api(&e), reason, "event not recorded");
    }
}

/// A reference to a pod, for Events about it.
pub fn pod_reference(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

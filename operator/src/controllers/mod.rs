//! The controllers: feeds that keep the index current, and status writers
//! that report what the index concluded (only on the lease holder, and only
//! when the status really changes).

pub mod approval_lifecycle;
pub mod conditions;
pub mod connection_health;
pub mod feed;
pub mod policy_status;
pub mod secret_feed;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::watch;

use crate::index::Index;
use crate::metrics::Metrics;

/// What the status writers share.
pub struct Context {
    pub client: Client,
    pub index: Arc<Mutex<Index>>,
    /// Whether this replica holds the Lease (only the holder writes).
    pub leader: watch::Receiver<bool>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
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
        tracing::warn!(error = %e, reason, "event not recorded");
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

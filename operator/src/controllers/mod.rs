//! The controllers: feeds that keep the index current, and status writers
//! that report what the index concluded (only on the lease holder, and only
//! when the status really changes).

pub mod approval_lifecycle;
pub mod conditions;
pub mod connection_health;
pub mod egress_status;
pub mod feed;
pub mod lock_proofs;
pub mod policy_status;
pub mod sync_report;
pub mod tool_ledger;
pub mod upstream_auth;

use std::sync::{Arc, Mutex};

use kube::Client;
use kube::runtime::events::Recorder;
use tokio::sync::watch;

use crate::index::Index;
use crate::metrics::Metrics;

/// The field manager of every status the operator writes by server-side
/// apply.
pub const FIELD_MANAGER: &str = "aip-operator";

/// Objects per page of an initial list: a smaller peak than one big page.
pub const LIST_PAGE: u32 = 200;

/// What the status writers share.
pub struct Context {
    pub client: Client,
    pub index: Arc<Mutex<Index>>,
    /// Whether this replica holds the Lease (only the holder writes).
    pub leader: watch::Receiver<bool>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The operator's own user name (what first-use acceptances name).
    pub operator: String,
}

//! Watches that feed the index: AgentPolicies, ToolConnections, the Secrets
//! those reference (one watch each, see `secrets`), EgressLocks, and pods as
//! metadata only. Each event becomes one index update; what it touched is handed to
//! the status writers.
//!
//! The other replicas' sync reports are followed on their own (`peers`):
//! serving sidecars does not wait for them.
//!
//! This module only starts the watches and says when the index is synced;
//! each kind has its own file, and they share `follow` (applying a watch's
//! events) and `Touched` (telling the status writers), never each other.

mod connections;
mod egress;
mod follow;
pub mod peers;
mod pods;
mod policies;
mod secrets;
mod touched;

use std::sync::Arc;

use kube::Client;
use tokio::sync::{mpsc, watch};

use follow::{Shared, lock};
pub use touched::Touched;

/// Follows every watch until one ends (they do not, short of shutdown).
/// The index is marked synced once each watch has listed once; the Secret
/// watch starts after the ToolConnections are known, so that its first list
/// keeps every Secret they read.
pub async fn run(client: Client, index: Shared, touched: Touched, ready: watch::Sender<bool>) {
    let (refs_tx, refs_rx) = mpsc::unbounded_channel();
    let (listed_tx, mut listed) = watch::channel(0u8);
    let listed_tx = Arc::new(listed_tx);
    let done = |tx: &Arc<watch::Sender<u8>>| {
        let tx = tx.clone();
        let mut once = false;
        move || {
            if !std::mem::replace(&mut once, true) {
                tx.send_modify(|n| *n += 1);
            }
        }
    };
    let (connections_listed_tx, connections_listed) = watch::channel(false);
    let connections_done = {
        let count = done(&listed_tx);
        let mut count = count;
        move || {
            count();
            connections_listed_tx.send_replace(true);
        }
    };
    let mark_synced = {
        let index = index.clone();
        async move {
            if listed.wait_for(|n| *n >= 5).await.is_ok() {
                lock(&index).mark_synced();
                ready.send_replace(true);
                tracing::info!("cluster state loaded; serving sidecars");
            }
        }
    };
    tokio::join!(
        policies::run(
            client.clone(),
            index.clone(),
            touched.clone(),
            done(&listed_tx)
        ),
        connections::run(
            client.clone(),
            index.clone(),
            touched.clone(),
            refs_tx,
            connections_done
        ),
        secrets::run(
            client.clone(),
            index.clone(),
            touched.clone(),
            connections_listed,
            refs_rx,
            done(&listed_tx)
        ),
        egress::run(client.clone(), index.clone(), done(&listed_tx)),
        pods::run(client, index, touched, done(&listed_tx)),
        mark_synced,
    );
}

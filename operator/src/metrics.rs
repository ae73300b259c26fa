//! The operator's Prometheus metrics.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub decision: &'static str,
    /// Why a request was withdrawn (a Withdrawal word); empty otherwise.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindErrorLabel {
    pub kind: String,
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabel {
    pub namespace: String,
    pub connection: String,
}

pub struct Metrics {
    registry: Registry,
    tools_drifted: Family<ConnectionLabel, Counter>,
    connected: Gauge<i64, std::sync::atomic::AtomicI64>,
    pushes: Counter<u64, AtomicU64>,
    propagation: Histogram,
    auth_failures: Family<ReasonLabel, Counter>,
    reconciles: Family<KindLabel, Counter>,
    reconcile_errors: Family<KindErrorLabel, Counter>,
    approvals_pending: Gauge<i64, std::sync::atomic::AtomicI64>,
    approval_decisions: Histogram,
    approval_outcomes: Family<OutcomeLabels, Counter>,
    grpc_connections: Gauge<i64, std::sync::atomic::AtomicI64>,
    capacity_refusals: Counter<u64, AtomicU64>,
    max_sidecars: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("aip_operator");
        let connected = Gauge::default();
        registry.register(
            "connected_sidecars",
            "Sidecars with an open Watch stream",
            connected.clone(),
        );
        let pushes = Counter::default();
        registry.register(
            "config_pushes",
            "Configuration snapshots sent to sidecars",
            pushes.clone(),
        );
        let propagation = Histogram::new([
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ]);
        registry.register(
            "propagation_seconds",
            "From sending a snapshot to the sidecar's ack of it",
            propagation.clone(),
        );
        let auth_failures = Family::default();
        registry.register(
            "sidecar_auth_failures",
            "Sidecar calls refused, by reason",
            auth_failures.clone(),
        );
        let reconciles = Family::default();
        registry.register("reconciles", "Reconciliations by kind", reconciles.clone());
        let reconcile_errors = Family::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by kind and error",
            reconcile_errors.clone(),
        );
        let approvals_pending = Gauge::default();
        registry.register(
            "approvals_pending",
            "ApprovalRequests a sidecar is waiting on",
            approvals_pending.clone(),
        );
        let approval_decisions =
            Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0]);
        registry.register(
            "approval_decision_seconds",
            "From an ApprovalRequest's creation to its final state",
            approval_decisions.clone(),
        );
        let approval_outcomes = Family::default();
        registry.register(
            "approval_outcomes",
            "ApprovalRequests by final state, and why a withdrawn one was (counted once, by the lease holder)",
            approval_outcomes.clone(),
        );
        let grpc_connections = Gauge::default();
        registry.register(
            "grpc_connections",
            "Sidecar connections this replica serves (under its --max-sidecars)",
            grpc_connections.clone(),
        );
        let capacity_refusals = Counter::default();
        registry.register(
            "capacity_refusals",
            "Sidecar connections refused because this replica serves its --max-sidecars (the sidecar retries through the Service)",
            capacity_refusals.clone(),
        );
        let max_sidecars = Gauge::default();
        registry.register(
            "max_sidecars",
            "This replica's --max-sidecars",
            max_sidecars.clone(),
        );
        let tools_drifted = Family::default();
        registry.register(
            "tools_drifted",
            "Times a ToolConnection's probe found a tool withheld by its pins (drifted or unpinned), by connection",
            tools_drifted.clone(),
        );
        Metrics {
            tools_drifted,
            approvals_pending,
            approval_decisions,
            approval_outcomes,
            grpc_connections,
            capacity_refusals,
            max_sidecars,
            registry,
            connected,
            pushes,
            propagation,
            auth_failures,
            reconciles,
            reconcile_errors,
        }
    }

    /// Counts a connected sidecar until the guard drops.
    pub fn sidecar_connected(&self) -> ConnectedGuard {
        self.connected.inc();
        ConnectedGuard(self.connected.clone())
    }

    /// Counts a served gRPC connection until the guard drops.
    pub fn grpc_connection(&self) -> ConnectedGuard {
        self.grpc_connections.inc();
        ConnectedGuard(self.grpc_connections.clone())
    }

    /// A connection over the cap was accepted, to be refused.
    pub fn capacity_refused(&self) {
        self.capacity_refusals.inc();
    }

    pub fn set_max_sidecars(&self, max: usize) {
        self.max_sidecars
            .set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    pub fn pushed(&self) {
        self.pushes.inc();
    }

    pub fn propagation(&self, took: Duration) {
        self.propagation.observe(took.as_secs_f64());
    }

    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn reconciled(&self, kind: &str) {
        self.reconciles
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A connection's probe found a tool its pins withhold (counted once
    /// per change of what is withheld).
    pub fn tools_drifted(&self, namespace: &str, connection: &str) {
        self.tools_drifted
            .get_or_create(&ConnectionLabel {
                namespace: namespace.to_owned(),
                connection: connection.to_owned(),
            })
            .inc();
    }

    pub fn reconcile_failed(&self, kind: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&KindErrorLabel {
                kind: kind.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }

    /// Counts a pending approval until the guard drops.
    pub fn approval_pending(&self) -> PendingGuard {
        self.approvals_pending.inc();
        PendingGuard(self.approvals_pending.clone())
    }

    /// One request reached its final state (`reason`: why it was
    /// withdrawn; empty for the others).
    pub fn approval_outcome(&self, decision: &'static str, reason: &'static str) {
        self.approval_outcomes
            .get_or_create(&OutcomeLabels { decision, reason })
            .inc();
    }

    pub fn approval_decided(&self, took: Duration) {
        self.approval_decisions.observe(took.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

pub struct ConnectedGuard(Gauge<i64, std::sync::atomic::AtomicI64>);

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub struct PendingGuard(Gauge<i64, std::sync::atomic::AtomicI64>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

//! Prometheus metrics of the data plane. Label values are bounded: a tool
//! label is a name from a connection's catalog (or "other"), never whatever
//! an agent typed.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The decision and mode are the engine's own words: borrowed, so counting
/// a decision allocates only the tool's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: &'static str,
    pub tool: String,
    pub mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FailureLabels {
    pub connection: String,
    pub class: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConnectionLabels {
    pub connection: String,
}

pub struct Metrics {
    registry: Registry,
    pub decisions: Family<DecisionLabels, Counter>,
    pub upstream_failures: Family<FailureLabels, Counter>,
    pub upstream_latency: Family<ConnectionLabels, Histogram>,
    pub refused_messages: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("aip_sidecar");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Policy decisions on agent messages",
            decisions.clone(),
        );
        let upstream_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "upstream_failures",
            "Failed upstream calls by connection and failure class",
            upstream_failures.clone(),
        );
        let upstream_latency = Family::<ConnectionLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
        });
        registry.register(
            "upstream_call_seconds",
            "Upstream tools/call duration",
            upstream_latency.clone(),
        );
        let refused_messages = Counter::default();
        registry.register(
            "refused_messages",
            "Agent messages refused by strict parsing",
            refused_messages.clone(),
        );
        Metrics {
            registry,
            decisions,
            upstream_failures,
            upstream_latency,
            refused_messages,
        }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

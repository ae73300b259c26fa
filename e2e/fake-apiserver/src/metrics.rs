//! Prometheus metrics at `/metrics`: requests by verb and status code, and
//! the watches open.

use std::sync::Mutex;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub code: String,
}

pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub watches: Gauge<i64, AtomicI64>,
    registry: Mutex<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let watches = Gauge::<i64, AtomicI64>::default();
        let mut registry = Registry::with_prefix("aip_fake_apiserver");
        registry.register(
            "requests",
            "API requests by HTTP verb and status code",
            requests.clone(),
        );
        registry.register("open_watches", "Watch streams open now", watches.clone());
        Metrics {
            requests,
            watches,
            registry: Mutex::new(registry),
        }
    }
}

impl Metrics {
    pub fn text(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

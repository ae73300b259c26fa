//! The attempt log: one JSON line per tools/call outcome (and per scripted
//! tools/list step), append-only,
//! flushed line by line so that nothing is lost when the process is killed.
//! Arguments appear only as a SHA-256 of their canonical JSON (unless asked
//! for), the Authorization header only as a SHA-256 of its value.

use aip_service::sync::lock;
use std::io::Write;
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Why a tools/call ended the way it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// A step that answers normally (`return`, `oversize`, or the result
    /// behind `sse_close_after_event`) was played.
    Delivered,
    /// A step that is a scripted failure was played.
    FixtureError,
    UnknownTool,
    Unmatched,
    Exhausted,
    CanceledRunning,
    CanceledQueued,
    RejectedOverflow,
    RejectedDuplicate,
    /// The step expects a retry carrying other `requestState` or
    /// `inputResponses`; nothing consumed.
    RetryMismatch,
    /// An `input_required` step asks for input the request's declared
    /// client capabilities do not cover; nothing consumed.
    MissingCapability,
    /// An `input_required` step met a legacy request; nothing consumed.
    WrongEra,
}

impl AttemptOutcome {
    /// The word used in log lines and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::FixtureError => "fixture_error",
            AttemptOutcome::UnknownTool => "unknown_tool",
            AttemptOutcome::Unmatched => "unmatched",
            AttemptOutcome::Exhausted => "exhausted",
            AttemptOutcome::CanceledRunning => "canceled_running",
            AttemptOutcome::CanceledQueued => "canceled_queued",
            AttemptOutcome::RejectedOverflow => "rejected_overflow",
            AttemptOutcome::RejectedDuplicate => "rejected_duplicate",
            AttemptOutcome::RetryMismatch => "retry_mismatch",
            AttemptOutcome::MissingCapability => "missing_capability",
            AttemptOutcome::WrongEra => "wrong_era",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub ts: String,
    pub seq: u64,
    pub session: String,
    pub request_id: Value,
    /// `tools/call`, or `tools/list` for a scripted tools/list step.
    pub method: &'static str,
    /// The tool called (null on a tools/list line).
    pub tool: Option<String>,
    pub response_index: Option<usize>,
    pub step_index: Option<usize>,
    pub steps_total: Option<usize>,
    pub outcome: AttemptOutcome,
    /// The step kind played, when one was.
    pub step: Option<&'static str>,
    pub is_error: bool,
    pub delay_ms: u64,
    pub latency_ms: u64,
    pub args_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    pub auth_sha256: Option<String>,
    pub protocol_version: Option<String>,
}

/// SHA-256 (lowercase hex) of the RFC 8785 canonical JSON of `value`.
pub fn canonical_sha256(value: &Value) -> String {
    let bytes = serde_json_canonicalizer::to_vec(value).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

/// Whether two values are the same JSON value in canonical form (numbers by
/// value: `2` is `2.0`).
pub fn canonical_eq(a: &Value, b: &Value) -> bool {
    match (
        serde_json_canonicalizer::to_vec(a),
        serde_json_canonicalizer::to_vec(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

pub struct AttemptLog {
    sink: Mutex<Sink>,
    include_args: bool,
    registry: Registry,
    attempts: Family<OutcomeLabel, Counter>,
    /// The number of lines written, for anything that must wait for one.
    written: watch::Sender<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    /// The same word as the log line's `outcome`.
    outcome: String,
}

struct Sink {
    out: Box<dyn Write + Send>,
    seq: u64,
    lines: Vec<String>,
}

impl AttemptLog {
    pub fn new(out: Box<dyn Write + Send>, include_args: bool) -> AttemptLog {
        let mut registry = Registry::with_prefix("aip_fault");
        let attempts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "attempts",
            "tools/call attempts (and scripted tools/list steps) by outcome",
            attempts.clone(),
        );
        AttemptLog {
            sink: Mutex::new(Sink {
                out,
                seq: 0,
                lines: Vec::new(),
            }),
            include_args,
            registry,
            attempts,
            written: watch::Sender::new(0),
        }
    }

    /// Prometheus/OpenMetrics text exposition of the attempt counters.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn include_args(&self) -> bool {
        self.include_args
    }

    /// Appends one attempt, numbering it; returns its sequence number.
    pub fn record(&self, mut attempt: Attempt) -> u64 {
        let outcome = attempt.outcome.as_str().to_owned();
        self.attempts.get_or_create(&OutcomeLabel { outcome }).inc();
        let mut sink = lock(&self.sink);
        sink.seq += 1;
        attempt.seq = sink.seq;
        attempt.ts = humantime_now();
        if !self.include_args {
            attempt.args = None;
        }
        let line = serde_json::to_string(&attempt).unwrap_or_default();
        // A full disk must not stop the server; the in-memory copy remains.
        let _ = writeln!(sink.out, "{line}").and_then(|()| sink.out.flush());
        sink.lines.push(line);
        self.written.send_replace(sink.seq);
        sink.seq
    }

    /// Watches how many lines have been written.
    pub fn written(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Every line written so far, in order.
    pub fn lines(&self) -> Vec<String> {
        lock(&self.sink).lines.clone()
    }

    pub fn flush(&self) {
        let _ = lock(&self.sink).out.flush();
    }
}

pub(crate) fn humantime_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

//! Every decision on an agent's message, written down twice: an audit line
//! and a count in `aip_sidecar_decisions`. The pipeline records what it
//! decides; `asks` records the ends of held calls that no agent receives
//! (a cancelled call, an ended session): those are written here all the
//! same.

use std::sync::Arc;
use std::time::SystemTime;

use aip_mcp::jsonrpc::Message;
use aip_policy::{AuditRecord, Evaluator, Request, Verdict};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;

use crate::audit::Audit;
use crate::metrics::DecisionLabels;

/// Where decisions are written down.
#[derive(Clone)]
pub(super) struct Decisions {
    audit: Arc<Audit>,
    counts: Family<DecisionLabels, Counter>,
}

impl Decisions {
    pub(super) fn new(audit: Arc<Audit>, counts: Family<DecisionLabels, Counter>) -> Decisions {
        Decisions { audit, counts }
    }

    /// The audit line for `request` and its verdict; `approval`: the
    /// request that held it.
    pub(super) fn audit(
        &self,
        evaluator: &Evaluator,
        request: &Request<'_>,
        verdict: &Verdict,
        approval: Option<&str>,
    ) {
        let mut line = AuditRecord::for_request(evaluator, request, verdict, SystemTime::now());
        line.approval = approval.map(str::to_owned);
        self.audit.record(&line);
    }

    /// Audits and counts a decision on `message` made after the pipeline
    /// let go of it (an ask decided later, or ended with nobody waiting).
    pub(super) fn record(
        &self,
        evaluator: &Evaluator,
        message: &Message,
        verdict: &Verdict,
        known: bool,
        approval: Option<&str>,
    ) {
        if let Ok(request) = Request::from_value(&message.value) {
            self.audit(evaluator, &request, verdict, approval);
        }
        self.count(verdict, message, known);
    }

    /// Counts a decision; a `tools/call`'s tool is its label only when it
    /// is catalogued (`known`, from the edge's lookup).
    pub(super) fn count(&self, verdict: &Verdict, message: &Message, known: bool) {
        let called = (message.method() == Some("tools/call"))
            .then(|| {
                message
                    .params()
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
            })
            .flatten();
        // Only catalogued names become label values.
        let tool = match called {
            Some(t) if known => t.to_owned(),
            Some(_) => "other".to_owned(),
            None => String::new(),
        };
        let span = tracing::Span::current();
        span.record("aip.decision", verdict.audit_decision());
        if !tool.is_empty() {
            span.record("mcp.tool", tool.as_str());
        }
        let labels = DecisionLabels {
            decision: verdict.audit_decision(),
            tool,
            mode: verdict.mode.as_str(),
        };
        self.counts.get_or_create(&labels).inc();
    }
}

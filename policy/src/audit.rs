//! Audit records (spec §7): one JSON object per line. Arguments are redacted
//! with the policy's DLP patterns before they are recorded, and a record
//! holds at most [`MAX_AUDIT_ARGS_BYTES`] of them: larger arguments are
//! recorded by their size and the hash of the full value instead, so that
//! one large call cannot make a large audit line.

use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

use crate::compile::Evaluator;
use crate::dlp::DlpEvent;
use crate::evaluate::Verdict;
use crate::message::Request;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Agent to server.
    Upstream,
    /// Server to agent.
    Downstream,
}

/// The most argument data one record holds (compact JSON, after DLP).
pub const MAX_AUDIT_ARGS_BYTES: usize = 8 * 1024;

/// One decision about one message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    pub timestamp: String,
    pub direction: Direction,
    pub decision: &'static str,
    pub policy_mode: &'static str,
    pub violation: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<RecordedArgs>,
    /// When the arguments were too large to record: their size (compact
    /// JSON, after DLP) ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args_bytes: Option<usize>,
    /// ... and the hash of the arguments as the agent sent them
    /// (`sha256:` of their canonical JSON, as ApprovalRequests carry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_arg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why an ask ended undecided (`Withdrawal`'s word), for the
    /// APPROVAL_WITHDRAWN and GATEWAY_SHUTDOWN decisions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// The ApprovalRequest that held the call, when the gateway knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
}

/// Arguments as a record holds them: compact JSON after DLP, written once
/// (its size decides whether they are recorded) and put in the line as
/// written.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct RecordedArgs(Box<serde_json::value::RawValue>);

impl RecordedArgs {
    /// The arguments as JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The arguments as a value.
    pub fn value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for RecordedArgs {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

/// One DLP rule that fired on one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlpRecord {
    pub timestamp: String,
    pub direction: Direction,
    pub event: &'static str,
    pub dlp_rule: String,
    pub dlp_action: &'static str,
    pub dlp_match_count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// RFC 3339, UTC, millisecond precision.
pub fn timestamp(at: SystemTime) -> String {
    // Every record takes one: the text up to the second is written once a
    // second (per thread), the milliseconds each time.
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((0, String::new())) };
    }
    let Ok(since) = at.duration_since(std::time::UNIX_EPOCH) else {
        return humantime::format_rfc3339_millis(at).to_string();
    };
    SECOND.with_borrow_mut(|(second, prefix)| {
        if *second != since.as_secs() || prefix.is_empty() {
            let whole = humantime::format_rfc3339_seconds(at).to_string();
            *prefix = whole.trim_end_matches('Z').to_owned();
            *second = since.as_secs();
        }
        let millis = since.subsec_millis();
        let mut text = String::with_capacity(prefix.len() + 5);
        text.push_str(prefix);
        text.push('.');
        for digit in [millis / 100, millis / 10 % 10, millis % 10] {
            text.push(char::from(b'0' + digit as u8));
        }
        text.push('Z');
        text
    })
}

impl AuditRecord {
    /// The record for an agent message and the verdict it got.
    pub fn for_request(
        evaluator: &Evaluator,
        request: &Request<'_>,
        verdict: &Verdict,
        at: SystemTime,
    ) -> AuditRecord {
        let params = request.params.and_then(Value::as_object);
        let is_call = request_is_call(request);
        let tool = is_call
            .then(|| params.and_then(|p| p.get("name")).and_then(Value::as_str))
            .flatten()
            .map(str::to_owned);
        let arguments = is_call
            .then(|| params.and_then(|p| p.get("arguments")))
            .flatten();
        let (args, args_bytes, args_sha256) = match arguments.map(|a| (a, redacted(evaluator, a))) {
            None => (None, None, None),
            Some((full, args)) => {
                // Written once, not parsed again (serde_json checks only
                // a text it did not write).
                let written = serde_json::value::to_raw_value(&args).ok();
                let bytes = written.as_ref().map_or(0, |raw| raw.get().len());
                match written {
                    Some(raw) if bytes <= MAX_AUDIT_ARGS_BYTES => {
                        (Some(RecordedArgs(raw)), None, None)
                    }
                    _ => {
                        let hash = crate::hash::arguments_hash(full);
                        (None, Some(bytes), Some(hash))
                    }
                }
            }
        };
        AuditRecord {
            timestamp: timestamp(at),
            direction: Direction::Upstream,
            decision: verdict.audit_decision(),
            policy_mode: verdict.mode.as_str(),
            violation: verdict.violation,
            policy: evaluator.policy_name().map(str::to_owned),
            method: Some(request.method.to_owned()),
            tool,
            args,
            args_bytes,
            args_sha256,
            failed_arg: verdict.failed_arg().map(str::to_owned),
            failed_rule: verdict.failed_rule().map(str::to_owned),
            reason: verdict.reason().map(str::to_owned),
            cause: match verdict.cause {
                Some(crate::evaluate::Cause::ApprovalWithdrawn(w)) => Some(w.as_str()),
                _ => None,
            },
            approval: None,
        }
    }
}

impl DlpRecord {
    /// One record per rule that fired while redacting a response.
    pub fn for_events(events: &[DlpEvent], tool: Option<&str>, at: SystemTime) -> Vec<DlpRecord> {
        let ts = timestamp(at);
        events
            .iter()
            .map(|e| DlpRecord {
                timestamp: ts.clone(),
                direction: Direction::Downstream,
                event: "DLP_TRIGGERED",
                dlp_rule: e.rule.clone(),
                dlp_action: "REDACTED",
                dlp_match_count: e.count,
                tool: tool.map(str::to_owned),
            })
            .collect()
    }
}

fn request_is_call(request: &Request<'_>) -> bool {
    crate::normalize::normalize_name(request.method) == "tools/call"
}

/// The length of a value's compact JSON, counted without building it.
fn redacted<'a>(evaluator: &Evaluator, args: &'a Value) -> std::borrow::Cow<'a, Value> {
    match evaluator.redactor() {
        // Copied only when something in it is to be redacted.
        Some(r) if r.would_redact(args) => {
            let mut copy = args.clone();
            r.redact_strings(&mut copy, &mut Vec::new());
            std::borrow::Cow::Owned(copy)
        }
        _ => std::borrow::Cow::Borrowed(args),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    /// The timestamp written from its second's cached text says what the
    /// formatter says, across seconds and back and forth.
    #[test]
    fn timestamps_are_rfc3339_with_milliseconds() {
        let base = UNIX_EPOCH + Duration::from_secs(1_796_600_000);
        let mut times = vec![UNIX_EPOCH];
        for ms in [
            0, 1, 9, 10, 99, 100, 999, 1000, 1001, 59_999, 60_000, 86_400_123,
        ] {
            times.push(base + Duration::from_millis(ms));
        }
        times.push(base + Duration::from_micros(999_999));
        times.push(base);
        for at in times {
            let want = humantime::format_rfc3339_millis(at).to_string();
            assert_eq!(super::timestamp(at), want, "{at:?}");
        }
        let now = SystemTime::now();
        assert_eq!(
            super::timestamp(now),
            humantime::format_rfc3339_millis(now).to_string()
        );
    }
}

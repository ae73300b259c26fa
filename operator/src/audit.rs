//! The operator's audit records: one JSON object per line on stdout (its
//! diagnostics go to stderr), each written whole in one write. Today they
//! record what happens to a connection's tools: withheld because a
//! definition drifted or is new, and accepted, by whom.

use std::io::Write as _;
use std::time::SystemTime;

use serde::Serialize;

/// What happened to one tool of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolEvent {
    /// Agents stopped being served it: it drifted, or is new or unpinned.
    ToolWithheld,
    /// Accepted: by the operator on first use, or by a person.
    ToolAccepted,
}

/// One audit line about one tool. Hashes, names and reasons only: never a
/// definition (it may carry what its server put there).
#[derive(Debug, Clone, Serialize)]
pub struct ToolRecord<'a> {
    pub timestamp: String,
    pub event: ToolEvent,
    pub namespace: &'a str,
    pub connection: &'a str,
    pub tool: &'a str,
    /// The tool's schema hash as listed.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub schema_hash: &'a str,
    /// What it was accepted or pinned as, when that differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_schema_hash: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
}

/// RFC 3339, UTC, millisecond precision (as the sidecar's records).
pub fn now() -> String {
    aip_policy::audit::timestamp(SystemTime::now())
}

/// Writes one record as one line.
pub fn record(record: &impl Serialize) {
    let Ok(mut line) = serde_json::to_vec(record) else {
        return;
    };
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&line).and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "audit record not written");
    }
}

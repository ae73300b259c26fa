//! The CLI half's attempt log lines: the MCP log's family (`ts`, `seq`,
//! `session`, `response_index`, `step_index`, `steps_total`, `outcome`,
//! `delay_ms`, `latency_ms`, a SHA-256 of the canonical arguments) with what
//! a process adds: the invocation's number, its pid, its exit code.
//!
//! An invocation that plays a step writes two lines: `started` before any
//! delay, and one that ends it (`completed`, `canceled`, `deadline`). A
//! process killed outright leaves only the first, with `exit_code: null`:
//! the log never invents an outcome nobody saw.

use serde::Serialize;
use serde_json::json;

use crate::log::canonical_sha256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CliOutcome {
    /// A step was selected and consumed; its ending follows on a later line.
    Started,
    /// The step was played to the end: its output written (or offered to a
    /// reader that stopped draining) and its exit code returned.
    Completed,
    /// SIGTERM or SIGINT arrived first: exit 130.
    Canceled,
    /// The deadline (`--deadline` or the step's own) passed first: exit 124.
    Deadline,
    Unmatched,
    Exhausted,
    /// The shim names an executable the session's document does not declare.
    UnknownExecutable,
}

#[derive(Debug, Clone, Serialize)]
pub struct CliAttempt {
    pub ts: String,
    pub seq: u64,
    pub session: String,
    /// 1, 2, 3, ... per invocation; both lines of one invocation share it.
    pub attempt: u64,
    pub pid: u32,
    pub executable: String,
    pub response_index: Option<usize>,
    pub step_index: Option<usize>,
    pub steps_total: Option<usize>,
    pub outcome: CliOutcome,
    /// None on `started`: not exited (yet, or ever, if it was killed).
    pub exit_code: Option<u8>,
    /// The signal that canceled the attempt.
    pub signal: Option<&'static str>,
    pub delay_ms: u64,
    /// The deadline that applied, if any (the smaller of the session's and
    /// the step's).
    pub deadline_ms: Option<u64>,
    /// From the start of the process to this line.
    pub latency_ms: u64,
    /// SHA-256 of the RFC 8785 canonical JSON of the argument array.
    pub argv_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
}

impl CliAttempt {
    /// An attempt line not yet numbered (the session numbers it as it
    /// appends it).
    pub fn new(session: &str, executable: &str, argv: &[String], log_args: bool) -> CliAttempt {
        CliAttempt {
            ts: String::new(),
            seq: 0,
            session: session.to_owned(),
            attempt: 0,
            pid: std::process::id(),
            executable: executable.to_owned(),
            response_index: None,
            step_index: None,
            steps_total: None,
            outcome: CliOutcome::Started,
            exit_code: None,
            signal: None,
            delay_ms: 0,
            deadline_ms: None,
            latency_ms: 0,
            argv_sha256: canonical_sha256(&json!(argv)),
            argv: log_args.then(|| argv.to_vec()),
        }
    }
}

//! Audit lines: one JSON object per line (AIP spec §7), to stdout or a file.
//! Arguments are DLP-redacted before they get here; credentials never do.

use std::io::Write;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::{Value, json};

pub struct Audit {
    out: Mutex<Box<dyn Write + Send>>,
}

impl Audit {
    pub fn new(out: Box<dyn Write + Send>) -> Audit {
        Audit {
            out: Mutex::new(out),
        }
    }

    pub fn record(&self, line: &impl Serialize) {
        let mut text = Vec::with_capacity(256);
        if serde_json::to_writer(&mut text, line).is_err() {
            return;
        }
        text.push(b'\n');
        let mut out = aip_service::sync::lock(&self.out);
        // One write per line (never torn across writes); losing an audit
        // line must not take the data plane down.
        let _ = out.write_all(&text).and_then(|()| out.flush());
    }

    /// A failed upstream call: what the reference's Records section asks for.
    pub fn upstream_failure(&self, f: &UpstreamFailure<'_>) {
        self.record(&json!({
            "timestamp": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "event": "UPSTREAM_FAILURE",
            "direction": "downstream",
            "connection": f.connection,
            "tool": f.tool,
            "class": f.class,
            "reason": f.reason,
            "http_status": f.http_status,
            "upstream_code": f.upstream_code,
            "dispatched": f.dispatched,
            "duration_ms": f.duration_ms,
        }));
    }
}

pub struct UpstreamFailure<'a> {
    pub connection: &'a str,
    pub tool: &'a str,
    pub class: &'a str,
    pub reason: &'a str,
    pub http_status: Option<u16>,
    pub upstream_code: Option<i64>,
    /// Whether the request left the gateway (false: refused before sending).
    pub dispatched: bool,
    pub duration_ms: u64,
}

/// A refusal of a message that never reached policy evaluation.
pub fn refusal_line(reason: &str, id: Option<&Value>) -> Value {
    json!({
        "timestamp": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "direction": "upstream",
        "decision": "BLOCK",
        "event": "MALFORMED_MESSAGE",
        "violation": true,
        "reason": reason,
        "request_id": id,
    })
}

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

/// An audit file that never grows past `max_bytes`: when the next line would
/// take it over, it is renamed to `FILE.1` (replacing the previous one) and
/// a new `FILE` is started, so at most twice the bound is kept on disk.
///
/// Only a regular file is rotated. Anything else (`/dev/null`, a FIFO, a
/// terminal, `/dev/stdout`) is written to as it is: renaming `/dev/null`
/// to `/dev/null.1` and putting a regular file in its place, as an earlier
/// version did past the bound, broke every program on the machine that
/// reads `/dev/null`.
pub struct RotatingFile {
    path: std::path::PathBuf,
    /// u64::MAX for a path that is not a regular file: never rotated.
    max_bytes: u64,
    written: u64,
    file: std::fs::File,
}

impl RotatingFile {
    pub fn open(path: &std::path::Path, max_bytes: u64) -> std::io::Result<RotatingFile> {
        let file = append(path)?;
        let max_bytes = if regular(path) { max_bytes } else { u64::MAX };
        Ok(RotatingFile {
            path: path.to_owned(),
            max_bytes,
            written: file.metadata()?.len(),
            file,
        })
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        // Looked at again: the path may have been replaced since it was
        // opened (by a symlink, a device).
        if !regular(&self.path) {
            self.max_bytes = u64::MAX;
            return Ok(());
        }
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, old)?;
        self.file = append(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

/// Whether `path` itself (not what a symlink there points to) is a
/// regular file.
fn regular(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

fn append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len() as u64;
        if self.written > 0 && self.written + len > self.max_bytes {
            self.rotate()?;
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_audit_file_rotates_at_its_bound() {
        let tmp = tempfile::Builder::new()
            .prefix("aip-audit-rotate-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let path = dir.join("audit.jsonl");
        let audit = Audit::new(Box::new(RotatingFile::open(&path, 1000).unwrap()));
        for i in 0..100 {
            audit.record(&json!({"n": i, "pad": "x".repeat(80)}));
        }
        let current = std::fs::metadata(&path).unwrap().len();
        let previous = std::fs::metadata(dir.join("audit.jsonl.1")).unwrap().len();
        assert!(current <= 1000 && previous <= 1000, "{current} {previous}");
        let last = std::fs::read_to_string(&path).unwrap();
        assert!(last.lines().last().unwrap().contains("\"n\":99"), "{last}");
        assert!(
            last.lines()
                .all(|l| serde_json::from_str::<Value>(l).is_ok()),
            "lines are never torn across files"
        );
    }

    /// A FIFO stands for every path that is not a regular file (the
    /// machine's own `/dev/null` is not risked in a test): it is written
    /// through past the bound, never renamed or replaced.
    #[test]
    fn what_is_not_a_regular_file_is_never_rotated() {
        use std::io::Read;
        use std::os::unix::fs::FileTypeExt;
        let tmp = tempfile::Builder::new()
            .prefix("aip-audit-fifo-")
            .tempdir()
            .unwrap();
        let fifo = tmp.path().join("audit.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut all = String::new();
                std::fs::File::open(fifo)
                    .unwrap()
                    .read_to_string(&mut all)
                    .unwrap();
                all
            })
        };
        let audit = Audit::new(Box::new(RotatingFile::open(&fifo, 1000).unwrap()));
        for i in 0..100 {
            audit.record(&json!({"n": i, "pad": "x".repeat(80)}));
        }
        drop(audit);
        let read = reader.join().unwrap();
        assert_eq!(read.lines().count(), 100, "every line went through");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo(),
            "the FIFO is still there"
        );
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["audit.fifo"], "nothing was renamed or created");
    }
}

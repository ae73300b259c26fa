//! Text and JSON reports.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::compare::Mismatch;

pub struct FileReport {
    pub path: PathBuf,
    pub name: Option<String>,
    pub tests: Vec<TestReport>,
    /// The file itself could not be read or parsed.
    pub error: Option<String>,
}

pub struct TestReport {
    pub id: String,
    pub mismatches: Vec<Mismatch>,
    /// Why the runner could not interpret the vector (then it ran nothing).
    pub unsupported: Option<String>,
}

impl TestReport {
    fn passed(&self) -> bool {
        self.mismatches.is_empty() && self.unsupported.is_none()
    }
}

impl FileReport {
    pub fn passed(&self) -> usize {
        self.tests.iter().filter(|t| t.passed()).count()
    }

    /// Failed tests; an unreadable file counts as one failure.
    pub fn failed(&self) -> usize {
        let failed = self.tests.iter().filter(|t| !t.mismatches.is_empty());
        failed.count() + usize::from(self.error.is_some())
    }

    /// Vectors the runner could not interpret.
    pub fn unsupported(&self) -> usize {
        self.tests
            .iter()
            .filter(|t| t.unsupported.is_some())
            .count()
    }
}

pub fn text(reports: &[FileReport]) {
    for r in reports {
        if let Some(error) = &r.error {
            println!("ERROR {}: {error}", r.path.display());
        }
        for t in &r.tests {
            if let Some(why) = &t.unsupported {
                println!("UNSUPPORTED {} {}: {why}", r.path.display(), t.id);
            }
        }
        for t in r.tests.iter().filter(|t| !t.mismatches.is_empty()) {
            let details: Vec<String> = t
                .mismatches
                .iter()
                .map(|m| format!("{}: expected {}, got {}", m.field, m.expected, m.actual))
                .collect();
            println!("FAIL {} {}: {}", r.path.display(), t.id, details.join("; "));
        }
    }
    for r in reports {
        let name = r
            .name
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        println!(
            "{}{name}: {} passed, {} failed{}",
            r.path.display(),
            r.passed(),
            r.failed(),
            unsupported_note(r.unsupported())
        );
    }
    let passed: usize = reports.iter().map(FileReport::passed).sum();
    let failed: usize = reports.iter().map(FileReport::failed).sum();
    let unsupported: usize = reports.iter().map(FileReport::unsupported).sum();
    println!(
        "{passed} passed, {failed} failed{}",
        unsupported_note(unsupported)
    );
}

fn unsupported_note(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {n} unsupported")
    }
}

pub fn json(reports: &[FileReport]) -> Value {
    let files: Vec<Value> = reports
        .iter()
        .map(|r| {
            json!({
                "file": r.path.display().to_string(),
                "name": r.name,
                "error": r.error,
                "passed": r.passed(),
                "failed": r.failed(),
                "unsupported": r.unsupported(),
                "tests": r.tests.iter().map(|t| json!({
                    "id": t.id,
                    "passed": t.passed(),
                    "unsupported": t.unsupported,
                    "mismatches": t.mismatches,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "files": files,
        "passed": reports.iter().map(FileReport::passed).sum::<usize>(),
        "failed": reports.iter().map(FileReport::failed).sum::<usize>(),
        "unsupported": reports.iter().map(FileReport::unsupported).sum::<usize>(),
    })
}

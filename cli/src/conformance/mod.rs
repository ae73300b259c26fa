//! `aip conformance`: runs AIP conformance vector files (spec §8) against the
//! engine and reports expected-versus-actual for every failing test.

mod compare;
mod report;
mod run;
mod vector;

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use report::FileReport;

/// Runs every vector file under `paths`; true when all tests passed.
pub fn run(paths: &[PathBuf], as_json: bool) -> anyhow::Result<bool> {
    let files = collect(paths)?;
    if files.is_empty() {
        anyhow::bail!("no vector files (*.yaml, *.yml) found in the given paths");
    }
    let reports: Vec<FileReport> = files.iter().map(|f| run::file(f)).collect();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report::json(&reports))?);
    } else {
        report::text(&reports);
    }
    Ok(reports
        .iter()
        .all(|r| r.failed() == 0 && r.unsupported() == 0))
}

/// The vector files named, directories expanded recursively, in path order.
fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

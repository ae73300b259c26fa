//! What the `aip` binary's tests share: running it, reading what it said,
//! and scratch directories.

#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn aip(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aip"))
        .args(args)
        .current_dir(repo())
        .env("HOME", "/home/agent")
        .output()
        .expect("aip runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A directory of the test's own under cargo's target/tmp (so that a run
/// that is killed leaves nothing outside target/), removed when it drops.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("aip-cli-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

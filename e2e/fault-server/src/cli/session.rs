//! A mock session's shared state: `.aip-fault/` inside the shim directory.
//!
//! Every invocation is its own process, so sequence state lives in a file,
//! and each read-modify-write of it happens under an exclusive `flock` of
//! `.aip-fault/lock` (the kernel drops the lock when a holder dies, even by
//! SIGKILL). The state is replaced by rename, so a process killed mid-write
//! leaves the previous state whole; attempt lines are appended under the
//! same lock, so their `seq` is the order they were written in.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cli::attempt::CliAttempt;
use crate::log::humantime_now;

/// The session's own directory inside the shim directory. Executable names
/// may not start with '.', so it never collides with a shim.
pub const SESSION_DIR: &str = ".aip-fault";

/// Where a session keeps its files.
#[derive(Debug, Clone)]
pub struct SessionPaths {
    pub shims: PathBuf,
}

impl SessionPaths {
    pub fn new(shims: impl Into<PathBuf>) -> SessionPaths {
        SessionPaths {
            shims: shims.into(),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.shims.join(SESSION_DIR)
    }

    /// What the installer decided: see [`SessionInfo`].
    pub fn info(&self) -> PathBuf {
        self.dir().join("session.json")
    }

    /// The document as it was installed: later edits to the original do not
    /// change a running rehearsal.
    pub fn document(&self) -> PathBuf {
        self.dir().join("document.yaml")
    }

    pub fn state(&self) -> PathBuf {
        self.dir().join("state.json")
    }

    fn state_next(&self) -> PathBuf {
        self.dir().join("state.json.next")
    }

    pub fn lock(&self) -> PathBuf {
        self.dir().join("lock")
    }

    /// The attempt log when `--log` is not given.
    pub fn default_log(&self) -> PathBuf {
        self.dir().join("attempts.jsonl")
    }

    /// Whether `dir` holds a mock session (an installed shim directory).
    pub fn is_session(dir: &Path) -> bool {
        SessionPaths::new(dir).info().is_file()
    }
}

/// Fixed at install; read by every invocation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// Random, per install: a reinstall is a new session with fresh state.
    pub session: String,
    /// The document's `metadata.name`.
    pub name: String,
    /// Absolute path of the attempt log.
    pub log: PathBuf,
    pub log_args: bool,
    /// `--deadline` in milliseconds: the longest any invocation may take.
    pub deadline_ms: Option<u64>,
    /// The shims installed, by name.
    pub executables: Vec<String>,
}

/// The sequence state every invocation of a session shares.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// The last attempt-log line's `seq`.
    pub seq: u64,
    /// The last invocation's `attempt` number.
    pub attempts: u64,
    /// Next step per executable, per response index.
    pub cursors: BTreeMap<String, Vec<usize>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct SessionError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> SessionError + '_ {
    move |source| SessionError {
        path: path.to_owned(),
        source,
    }
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

pub struct Session {
    pub paths: SessionPaths,
    pub info: SessionInfo,
}

impl Session {
    pub fn open(shims: &Path) -> Result<Session, SessionError> {
        let paths = SessionPaths::new(shims);
        let file = paths.info();
        let text = std::fs::read_to_string(&file).map_err(at(&file))?;
        let info = serde_json::from_str(&text)
            .map_err(invalid)
            .map_err(at(&file))?;
        Ok(Session { paths, info })
    }

    pub fn read_document(&self) -> Result<String, SessionError> {
        let file = self.paths.document();
        std::fs::read_to_string(&file).map_err(at(&file))
    }

    /// Under the session lock: reads the state, lets `decide` change it and
    /// name the attempt line to append, writes the state back, then appends
    /// the line numbered with the next `seq`. Returns what `decide` returned.
    pub fn transact<T>(
        &self,
        decide: impl FnOnce(&mut State) -> (T, CliAttempt),
    ) -> Result<T, SessionError> {
        let lock_path = self.paths.lock();
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(at(&lock_path))?;
        lock.lock().map_err(at(&lock_path))?;
        let state_path = self.paths.state();
        let text = std::fs::read_to_string(&state_path).map_err(at(&state_path))?;
        let mut state: State = serde_json::from_str(&text)
            .map_err(invalid)
            .map_err(at(&state_path))?;
        let (value, mut line) = decide(&mut state);
        state.seq += 1;
        line.seq = state.seq;
        line.ts = humantime_now();
        // The step counts as consumed once the state says so; the line
        // follows at once, and both happen before the lock is released.
        write_state(&self.paths, &state)?;
        append_line(&self.info.log, &line)?;
        drop(lock);
        Ok(value)
    }
}

/// Replaces the state file whole (write, then rename over it).
pub fn write_state(paths: &SessionPaths, state: &State) -> Result<(), SessionError> {
    let next = paths.state_next();
    let text = serde_json::to_string(state)
        .map_err(invalid)
        .map_err(at(&next))?;
    std::fs::write(&next, text).map_err(at(&next))?;
    let state_path = paths.state();
    std::fs::rename(&next, &state_path).map_err(at(&state_path))
}

/// One JSON line, in one write, to a file opened for appending.
fn append_line(log: &Path, line: &CliAttempt) -> Result<(), SessionError> {
    let mut text = serde_json::to_string(line)
        .map_err(invalid)
        .map_err(at(log))?;
    text.push('\n');
    let mut file: File = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(at(log))?;
    file.write_all(text.as_bytes()).map_err(at(log))
}

//! Preparing a shim directory: one small `sh` script per declared
//! executable that execs this binary with the session and the name, and the
//! session's shared state beside them.
//!
//! A script rather than a symlink to the binary: invoked through PATH, a
//! program sees only the bare name it was called by, and `/proc/self/exe`
//! resolves the link to the real binary, so a link could not tell which
//! session it belongs to. `exec` keeps the shim's pid, so a signal sent to
//! the "kubectl" the agent started reaches the fault server itself.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cli::document::CliScript;
use crate::cli::session::{SessionInfo, SessionPaths, State, write_state};

/// The first two lines of every shim: how a reinstall recognises its own
/// files (and refuses to touch anything else).
pub const SHIM_HEADER: &str = "#!/bin/sh\n# aip-fault-server shim";

#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The shim directory; created if missing.
    pub dir: PathBuf,
    /// The attempt log (default: `.aip-fault/attempts.jsonl` in the directory).
    pub log: Option<PathBuf>,
    pub log_args: bool,
    pub deadline_ms: Option<u64>,
    /// The binary the shims exec (absolute).
    pub binary: PathBuf,
    /// The PATH the agent would otherwise inherit.
    pub inherited_path: Option<OsString>,
}

#[derive(Debug)]
pub struct Installed {
    /// Canonical path of the shim directory.
    pub dir: PathBuf,
    pub log: PathBuf,
    pub session: String,
    /// The shim directory first, then the inherited PATH without other shim
    /// directories (and without this one).
    pub path: OsString,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "{}: not an aip-fault-server shim directory ({} is neither a shim nor {}); choose an empty or new directory",
        dir.display(), entry, crate::cli::session::SESSION_DIR
    )]
    NotAShimDirectory { dir: PathBuf, entry: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("PATH: {0}")]
    Path(String),
    #[error(transparent)]
    Session(#[from] crate::cli::session::SessionError),
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Installs `script` (validated from `document`) as a fresh mock session.
/// Shims of an earlier session in the same directory are replaced; an
/// explicit empty list leaves none. The attempt log is appended to, never
/// truncated.
pub fn install(
    script: &CliScript,
    document: &str,
    options: &InstallOptions,
) -> Result<Installed, InstallError> {
    std::fs::create_dir_all(&options.dir).map_err(at(&options.dir))?;
    let dir = std::fs::canonicalize(&options.dir).map_err(at(&options.dir))?;
    let old_shims = earlier_shims(&dir)?;
    let paths = SessionPaths::new(&dir);
    for shim in old_shims {
        std::fs::remove_file(&shim).map_err(at(&shim))?;
    }
    let session_dir = paths.dir();
    std::fs::create_dir_all(&session_dir).map_err(at(&session_dir))?;
    let log = match &options.log {
        None => paths.default_log(),
        Some(log) => std::path::absolute(log).map_err(at(log))?,
    };
    // Fail now, not at the agent's first call, if the log cannot be written.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(at(&log))?;
    let session = hex::encode(rand::random::<[u8; 8]>());
    let names: Vec<String> = script.executables.iter().map(|e| e.name.clone()).collect();
    let info = SessionInfo {
        session: session.clone(),
        name: script.name.clone(),
        log: log.clone(),
        log_args: options.log_args,
        deadline_ms: options.deadline_ms,
        executables: names.clone(),
    };
    write_file(&paths.document(), document)?;
    std::fs::write(paths.lock(), "").map_err(at(&paths.lock()))?;
    let cursors = script
        .executables
        .iter()
        .map(|e| (e.name.clone(), vec![0; e.responses.len()]))
        .collect();
    write_state(
        &paths,
        &State {
            cursors,
            ..State::default()
        },
    )?;
    let info_text = serde_json::to_string_pretty(&info).unwrap_or_default();
    write_file(&paths.info(), &info_text)?;
    for name in &names {
        let text = shim(&options.binary, &dir, name, &session, &script.name);
        let staged = session_dir.join("shim.next");
        std::fs::write(&staged, text).map_err(at(&staged))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
            .map_err(at(&staged))?;
        let target = dir.join(name);
        std::fs::rename(&staged, &target).map_err(at(&target))?;
    }
    let path = agent_path(&dir, options.inherited_path.as_deref())?;
    Ok(Installed {
        dir,
        log,
        session,
        path,
    })
}

/// The shims an earlier install left in `dir`; anything else there (but the
/// session directory) refuses the install before a file is touched.
fn earlier_shims(dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut shims = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry.map_err(at(dir))?;
        let name = entry.file_name();
        if name == crate::cli::session::SESSION_DIR {
            continue;
        }
        let path = entry.path();
        let ours = path.is_file()
            && std::fs::read(&path)
                .map(|bytes| bytes.starts_with(SHIM_HEADER.as_bytes()))
                .unwrap_or(false);
        if !ours {
            return Err(InstallError::NotAShimDirectory {
                dir: dir.to_owned(),
                entry: name.to_string_lossy().into_owned(),
            });
        }
        shims.push(path);
    }
    Ok(shims)
}

fn write_file(path: &Path, text: &str) -> Result<(), InstallError> {
    std::fs::write(path, text).map_err(at(path))
}

/// The shim for `name`: execs the binary with the session and the name, the
/// caller's arguments after `--` untouched.
fn shim(binary: &Path, dir: &Path, name: &str, session: &str, document: &str) -> String {
    format!(
        "{SHIM_HEADER} for {name} (session {session}, document {document}).\n\
         # Generated by `aip-fault-server --shims`: reinstall rather than edit.\n\
         exec {} --mock-session {} --mock {} -- \"$@\"\n",
        sh_quote(&binary.to_string_lossy()),
        sh_quote(&dir.to_string_lossy()),
        sh_quote(name),
    )
}

/// Single-quoted for sh: nothing inside is expanded.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// PATH for the agent: this directory first, then `inherited` without any
/// other shim directory, so mocks of an outer session never leak in (that
/// is what an explicit empty list relies on).
pub fn agent_path(
    dir: &Path,
    inherited: Option<&std::ffi::OsStr>,
) -> Result<OsString, InstallError> {
    let rest = inherited
        .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
        .unwrap_or_default();
    let kept = rest.into_iter().filter(|entry| {
        let same = std::fs::canonicalize(entry).is_ok_and(|e| e == dir);
        !same && !SessionPaths::is_session(entry)
    });
    std::env::join_paths(std::iter::once(dir.to_owned()).chain(kept))
        .map_err(|e| InstallError::Path(e.to_string()))
}

//! A control-plane process that cannot outlive the test process.
//!
//! The shared control plane lives in a `static`, which never drops, so
//! `Drop` alone cannot stop it. `PR_SET_PDEATHSIG` would need `pre_exec`
//! (unsafe, forbidden here), and it fires when the *thread* that spawned
//! the child exits — a Tokio worker or blocking thread, which comes and
//! goes — not when the process does. Instead each binary runs under a
//! few lines of `sh` (the [`WATCHDOG`]) that hold the read end of a pipe
//! whose only write end is in the test process (std opens it close-on-exec,
//! so no other child inherits it). When the test process exits, however it
//! exits (even SIGKILL), the kernel closes the write end, the watchdog reads
//! end-of-file and kills the binary. Dropping the handle closes the pipe the
//! same way, then waits for the watchdog, so the binary is reaped before
//! `drop` returns.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// `sh -c WATCHDOG NAME RELEASED CLEANUP PROGRAM ARGS...`: runs PROGRAM,
/// exits with its status when it ends on its own; when stdin reaches
/// end-of-file, marks RELEASED, kills PROGRAM, removes CLEANUP (if not
/// empty) and exits. A background list's stdin is /dev/null in a
/// non-interactive shell, hence the pipe is handed to the watcher as fd 3.
const WATCHDOG: &str = r#"released=$1; cleanup=$2; shift 2
exec 3<&0 </dev/null
"$@" 3<&- &
child=$!
{ read -r _ <&3; : > "$released"; kill -KILL "$child" 2>/dev/null; } &
watcher=$!
exec 3<&-
wait "$child"; status=$?
if [ -e "$released" ]; then
  wait "$watcher"
  if [ -n "$cleanup" ]; then rm -rf -- "$cleanup"; fi
else
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
fi
exit "$status"
"#;

/// How long `stop` waits for the watchdog before killing its process group.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub(crate) struct Supervised {
    pub name: &'static str,
    pub log: PathBuf,
    child: Child,
    /// The write end of the watchdog's pipe: dropping it stops the process.
    lifeline: Option<ChildStdin>,
    stopped: bool,
}

impl Supervised {
    /// Starts `program` with its stdout and stderr appended to
    /// `DIR/NAME.log`. `cleanup` is removed once the program is dead after
    /// its lifeline closed (the control plane's directory, given to the
    /// process that stops last).
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        dir: &Path,
        cleanup: Option<&Path>,
    ) -> Result<Supervised, Error> {
        let log = dir.join(format!("{name}.log"));
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io("cannot open", &log))?;
        writeln!(
            file,
            "--- aip-kube-test: {} {}",
            program.display(),
            args.join(" ")
        )
        .map_err(Error::io("cannot write", &log))?;
        let released = dir.join(format!("{name}.released"));
        match std::fs::remove_file(&released) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io("cannot remove", &released)(e));
            }
            _ => {}
        }
        let stderr = file.try_clone().map_err(Error::io("cannot open", &log))?;
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(name)
            .arg(&released)
            .arg(cleanup.map_or_else(PathBuf::new, Path::to_path_buf))
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(stderr))
            // Its own process group: a terminal's Ctrl-C reaches the test
            // process, whose exit then stops this one; and `stop` has a
            // group to kill if the watchdog does not answer.
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                process: name,
                source,
            })?;
        let lifeline = child.stdin.take();
        Ok(Supervised {
            name,
            log,
            child,
            lifeline,
            stopped: false,
        })
    }

    /// The exit status, if the process has ended on its own.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of the process's log.
    pub fn tail(&self) -> String {
        tail(&self.log, 40)
    }

    pub fn exited_error(&self, status: ExitStatus) -> Error {
        Error::Exited {
            process: self.name,
            status: status.to_string(),
            log: self.log.clone(),
            tail: self.tail(),
        }
    }

    /// Stops the process and reaps it (and its watchdog).
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        drop(self.lifeline.take());
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let group = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (or why it cannot be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => return format!("(cannot read {}: {e})", path.display()),
    };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

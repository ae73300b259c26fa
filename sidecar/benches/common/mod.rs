//! What the benchmarks read of a process they measure, from /proc, and
//! how they start one so that it cannot outlive them.

use std::ffi::OsStr;
use std::process::Command;

/// Linux reports process CPU time in USER_HZ ticks, 100 a second on every
/// architecture it supports.
const USER_HZ: f64 = 100.0;

/// CPU time of process `pid` so far, all its threads: from the scheduler's
/// nanosecond counts (`/proc/PID/task/*/schedstat`) where the kernel keeps
/// them, else from the 10 ms ticks of `/proc/PID/stat`, too coarse for a
/// few thousand calls. (The per-thread counts miss threads that already
/// ended; the processes measured keep theirs.)
#[allow(dead_code)] // not every benchmark reads CPU time
pub fn cpu_seconds(pid: u32) -> f64 {
    scheduled_seconds(pid).unwrap_or_else(|| ticked_seconds(pid))
}

#[allow(dead_code)]
fn scheduled_seconds(pid: u32) -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

#[allow(dead_code)]
fn ticked_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is parenthesised and may hold
    // spaces: state is the first, utime and stime the 12th and 13th.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / USER_HZ
}

/// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`, ...), 0 if absent.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A command for `program` that is killed when this benchmark ends,
/// however it ends (SIGKILL included): run through util-linux's `setpriv
/// --pdeathsig KILL`, which sets the parent-death signal and execs the
/// program, so the process measured by its pid is still the program.
/// The kernel sends the signal when the *thread* that spawned it ends:
/// the benchmarks spawn from their main thread (a runtime's `block_on`
/// polls there), which ends only with the process. Where `setpriv` is
/// missing, the program runs as itself and is reaped on drop only.
pub fn dies_with_us(program: impl AsRef<OsStr>) -> Command {
    static SETPRIV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let setpriv = *SETPRIV.get_or_init(|| {
        Command::new("setpriv")
            .arg("--help")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--pdeathsig"))
    });
    if !setpriv {
        return Command::new(program);
    }
    let mut command = Command::new("setpriv");
    command.args(["--pdeathsig", "KILL", "--"]).arg(program);
    command
}

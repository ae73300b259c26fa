//! What the benchmarks read of a process they measure, from /proc.

/// Linux reports process CPU time in USER_HZ ticks, 100 a second on every
/// architecture it supports.
const USER_HZ: f64 = 100.0;

/// User plus system CPU time of process `pid` so far, all threads.
#[allow(dead_code)] // not every benchmark reads CPU time
pub fn cpu_seconds(pid: u32) -> f64 {
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

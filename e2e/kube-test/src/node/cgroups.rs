//! The node's cgroups: one subtree, `/aip-node`, in every hierarchy this
//! machine mounts under /sys/fs/cgroup. The node's own processes run in
//! `/aip-node/node`; the kubelet puts pods under `/aip-node/kubepods`
//! (its `cgroupRoot`). So "everything the node started" is "every process
//! in that subtree", whoever forked it (containerd's shims, runc's
//! containers), and cleaning up is freezing it, killing it and removing it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The subtree's name under each hierarchy's root.
pub const ROOT: &str = "aip-node";
/// Where the node's own processes run, under [`ROOT`].
const NODE: &str = "node";

/// How long the processes of a frozen subtree may take to die.
const KILL_GRACE: Duration = Duration::from_secs(20);

/// The cgroup hierarchies mounted under /sys/fs/cgroup (v1 controllers,
/// `name=systemd`, and the unified v2 mount of a hybrid machine).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let target = left.split(' ').nth(4)?;
            ((fstype == "cgroup" || fstype == "cgroup2") && target.starts_with("/sys/fs/cgroup"))
                .then(|| PathBuf::from(target))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Creates `/aip-node/node` in every hierarchy (cpuset's with the parent's
/// CPUs and memory nodes, without which nothing may join it).
pub fn create() -> std::io::Result<()> {
    for hierarchy in hierarchies() {
        let mut path = hierarchy.clone();
        for part in [ROOT, NODE] {
            let parent = path.clone();
            path.push(part);
            if !path.is_dir() {
                std::fs::create_dir(&path)?;
            }
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(parent.join(file)) {
                    std::fs::write(path.join(file), value.trim())?;
                }
            }
        }
    }
    Ok(())
}

/// Moves process `pid` (and so everything it starts) into `/aip-node/node`
/// of every hierarchy.
pub fn join(pid: u32) -> std::io::Result<()> {
    for hierarchy in hierarchies() {
        std::fs::write(
            hierarchy.join(ROOT).join(NODE).join("cgroup.procs"),
            pid.to_string(),
        )?;
    }
    Ok(())
}

/// Moves process `pid` back to the root of every hierarchy, out of the
/// subtree (so that the subtree can be removed while it runs).
pub fn leave(pid: u32) {
    for hierarchy in hierarchies() {
        let _ = std::fs::write(hierarchy.join("cgroup.procs"), pid.to_string());
    }
}

/// Every process in the subtree.
pub fn processes() -> Vec<u32> {
    let mut pids = Vec::new();
    for hierarchy in hierarchies() {
        walk(&hierarchy.join(ROOT), &mut |dir| {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        });
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills every process in the subtree but `spare`, and waits until they
/// are gone: the freezer holds the subtree still while the signals go
/// out, so nothing forks past them.
pub fn kill_all(spare: Option<u32>) -> Result<(), String> {
    let freezer = hierarchies()
        .into_iter()
        .find(|h| h.ends_with("freezer"))
        .map(|h| h.join(ROOT));
    let deadline = Instant::now() + KILL_GRACE;
    loop {
        let left: Vec<u32> = processes()
            .into_iter()
            .filter(|pid| Some(*pid) != spare)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "processes {left:?} in cgroup /{ROOT} outlived SIGKILL for {KILL_GRACE:?}"
            ));
        }
        // With `spare` inside the subtree the freezer would stop it too.
        let freeze = freezer.as_ref().filter(|_| spare.is_none());
        if let Some(freezer) = freeze {
            let _ = std::fs::write(freezer.join("freezer.state"), "FROZEN");
        }
        for pid in &left {
            if let Some(pid) = i32::try_from(*pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if let Some(freezer) = freeze {
            let _ = std::fs::write(freezer.join("freezer.state"), "THAWED");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes the subtree from every hierarchy, deepest first. A cgroup whose
/// last process just died may be busy for a moment: retried for a while.
pub fn remove() -> Result<(), String> {
    let deadline = Instant::now() + KILL_GRACE;
    loop {
        let mut left = Vec::new();
        for hierarchy in hierarchies() {
            let root = hierarchy.join(ROOT);
            if !root.exists() {
                continue;
            }
            let mut dirs = Vec::new();
            walk(&root, &mut |dir| dirs.push(dir.to_path_buf()));
            // Deepest first: a cgroup with children cannot go.
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in dirs {
                if let Err(e) = std::fs::remove_dir(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    left.push(format!("{}: {e}", dir.display()));
                }
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("cannot remove cgroups: {}", left.join("; ")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Calls `visit` for `dir` and every directory below it.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
    if !dir.is_dir() {
        return;
    }
    visit(dir);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&entry.path(), visit);
            }
        }
    }
}

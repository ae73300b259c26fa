//! What a node changes on the machine outside its own namespaces, kept and
//! put back; and a snapshot of the host to show that it was.
//!
//! The node runs in a network and a mount namespace of its own, so its
//! addresses, routes, iptables chains, netns-local sysctls and mounts go
//! away with its processes. What does not: global sysctls that the kubelet
//! sets at start (below), and cgroups (see `cgroups.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The global (not per network namespace) sysctls a kubelet sets when it
/// starts (`setupKernelTunables`): saved before the node starts and put
/// back when it stops, also by the next start after a run that was killed.
pub const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Reads [`KUBELET_SYSCTLS`] as `key=value` lines.
pub fn read_kubelet_sysctls() -> String {
    KUBELET_SYSCTLS
        .iter()
        .filter_map(|key| {
            let value = std::fs::read_to_string(Path::new("/proc/sys").join(key)).ok()?;
            Some(format!("{key}={}\n", value.trim()))
        })
        .collect()
}

/// Writes back `key=value` lines saved by [`read_kubelet_sysctls`]; a key
/// that is not in [`KUBELET_SYSCTLS`] is refused (the file is ours, but it
/// is read as root).
pub fn restore_sysctls(saved: &str) -> Result<(), String> {
    let mut failed = Vec::new();
    for line in saved.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !KUBELET_SYSCTLS.contains(&key) {
            failed.push(format!("{key}: not a sysctl the node changes"));
            continue;
        }
        if let Err(e) = std::fs::write(Path::new("/proc/sys").join(key), value) {
            failed.push(format!("{key}={value}: {e}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("cannot restore sysctls: {}", failed.join("; ")))
    }
}

/// Sysctls whose values move on their own (counters, entropy, the
/// kernel's own tuning): left out of the comparison.
const VOLATILE_SYSCTLS: &[&str] = &[
    "fs/dentry-state",
    "fs/file-nr",
    "fs/inode-nr",
    "fs/inode-state",
    "fs/aio-nr",
    "fs/quota/",
    "kernel/random/",
    "kernel/ns_last_pid",
    "kernel/pty/nr",
    "kernel/perf_event_max_sample_rate",
    "kernel/tainted",
    "net/netfilter/nf_conntrack_count",
    "vm/stat_refresh",
    "fs/binfmt_misc/",
];

/// The host as the node could change it.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// `iptables-save` of the host's network namespace, counters and
    /// comments stripped (or why it could not run).
    pub iptables: Vec<String>,
    pub sysctls: BTreeMap<String, String>,
    /// Mount point, type and source of every mount of the host's mount
    /// namespace.
    pub mounts: BTreeSet<String>,
    /// The directories at the top of every cgroup hierarchy, and anything
    /// named like the node's anywhere below.
    pub cgroups: BTreeSet<String>,
    /// Every file of the machine's CNI directories (/usr/lib/cni,
    /// /opt/cni/bin, /etc/cni/net.d) with its size and modification time:
    /// the node's plugin goes into directories of its own.
    pub cni: BTreeSet<String>,
}

/// The machine's CNI directories, which a node must leave alone.
pub const SYSTEM_CNI_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin", "/etc/cni/net.d"];

impl Snapshot {
    pub fn take() -> Snapshot {
        Snapshot {
            iptables: iptables(),
            sysctls: sysctls(),
            mounts: mounts(),
            cgroups: cgroups(),
            cni: cni_files(),
        }
    }

    /// What differs from `before`, one line per difference.
    pub fn differences(&self, before: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        if self.iptables != before.iptables {
            out.push(format!(
                "iptables-save differs: before {:?}, after {:?}",
                before.iptables, self.iptables
            ));
        }
        for (key, value) in &before.sysctls {
            match self.sysctls.get(key) {
                Some(now) if now == value => {}
                now => out.push(format!("sysctl {key}: was {value:?}, now {now:?}")),
            }
        }
        for key in self.sysctls.keys() {
            if !before.sysctls.contains_key(key) {
                out.push(format!("sysctl {key}: new"));
            }
        }
        set_difference(&mut out, "mount", &before.mounts, &self.mounts);
        set_difference(&mut out, "cgroup", &before.cgroups, &self.cgroups);
        set_difference(&mut out, "CNI file", &before.cni, &self.cni);
        out
    }

    /// One line saying what was compared.
    pub fn summary(&self) -> String {
        format!(
            "iptables-save ({} lines), {} sysctls, {} mounts, {} cgroup directories, {} CNI files",
            self.iptables.len(),
            self.sysctls.len(),
            self.mounts.len(),
            self.cgroups.len(),
            self.cni.len()
        )
    }
}

fn set_difference(
    out: &mut Vec<String>,
    what: &str,
    before: &BTreeSet<String>,
    after: &BTreeSet<String>,
) {
    for gone in before.difference(after) {
        out.push(format!("{what} gone: {gone}"));
    }
    for new in after.difference(before) {
        out.push(format!("{what} left behind: {new}"));
    }
}

fn iptables() -> Vec<String> {
    match std::process::Command::new("iptables-save").output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            // Chain counters `[packets:bytes]` move with traffic.
            .map(|l| match l.split_once(" [") {
                Some((chain, _)) if l.starts_with(':') => chain.to_owned(),
                _ => l.to_owned(),
            })
            .collect(),
        Err(e) => vec![format!("(iptables-save: {e})")],
    }
}

fn sysctls() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    read_sysctls(Path::new("/proc/sys"), "", &mut out);
    out
}

fn read_sysctls(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if VOLATILE_SYSCTLS.iter().any(|v| name.starts_with(v)) {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => read_sysctls(&entry.path(), &format!("{name}/"), out),
            Ok(_) => {
                if let Ok(value) = std::fs::read_to_string(entry.path()) {
                    out.insert(name, value.trim().to_owned());
                }
            }
            Err(_) => {}
        }
    }
}

fn mounts() -> BTreeSet<String> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return BTreeSet::new();
    };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let target = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let source = right.next()?;
            Some(format!("{target} {fstype} {source}"))
        })
        .collect()
}

fn cni_files() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for dir in SYSTEM_CNI_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            out.insert(format!("{dir} (absent)"));
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            out.insert(format!(
                "{} {} bytes, modified {modified}",
                entry.path().display(),
                meta.len()
            ));
        }
    }
    out
}

fn cgroups() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for hierarchy in super::cgroups::hierarchies() {
        let Ok(entries) = std::fs::read_dir(&hierarchy) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(entry.path().display().to_string());
            }
        }
        // kubepods (a kubelet without cgroupRoot) anywhere one level down.
        let kubepods = hierarchy.join("kubepods");
        if kubepods.exists() {
            out.insert(kubepods.display().to_string());
        }
    }
    out
}

//! The test node leaves the machine as it found it, however its run ends:
//! stopped by SIGTERM or SIGINT (also while it is starting), its launcher killed (the node cleans up
//! after itself), or the launcher and the node killed together (the next
//! `aip-node clean` or start does). Each compares the host's iptables-save,
//! sysctls, mounts and cgroup directories before and after, and finds no
//! process of the node left.
//!
//! Root, and one node per machine: `make node-test` runs these one at a
//! time before the stories (`cargo test --test node_lifecycle --
//! --test-threads=1`); a plain `cargo test` skips them.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use aip_kube_test::node::{self, cgroups, host::Snapshot};

fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aip-node"))
}

fn pause_image() -> PathBuf {
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/images/pause.tar");
    assert!(
        image.exists(),
        "{} is missing: run `make images`",
        image.display()
    );
    image
}

/// `aip-node run -- sleep 600`, once its node is ready.
fn start() -> Child {
    let mut child = Command::new(launcher())
        .arg("run")
        .arg("--image")
        .arg(pause_image())
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    let ready = node::base_dir().join("node/node.json");
    let deadline = Instant::now() + Duration::from_secs(180);
    while !ready.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "aip-node run exited before its node was ready"
        );
        assert!(Instant::now() < deadline, "the node was not ready in time");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

/// Waits until nothing of the node is left, then compares the host.
fn assert_gone(before: &Snapshot) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = cgroups::processes();
        let cgroups_left = cgroups::hierarchies()
            .iter()
            .any(|h| h.join(cgroups::ROOT).exists());
        if left.is_empty() && !cgroups_left && !node::base_dir().exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node left processes {left:?}, cgroups: {cgroups_left}, {}: {}",
            node::base_dir().display(),
            node::base_dir().exists()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let differences = Snapshot::take().differences(before);
    assert!(differences.is_empty(), "{differences:#?}");
}

#[test]
fn sigterm_and_sigint_stop_the_node_and_leave_the_host_as_it_was() {
    node::clean_leftovers().unwrap();
    let before = Snapshot::take();
    for stop in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let mut child = start();
        signal(&child, stop);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "{stop:?}: {status}");
        assert_gone(&before);
    }
}

/// A signal while the node starts is not fatal to the launcher: the node
/// comes up, the command is stopped at once, the node is stopped, 130.
#[test]
fn a_signal_while_the_node_starts_stops_it_like_any_other() {
    use std::io::{BufRead, BufReader};
    node::clean_leftovers().unwrap();
    let before = Snapshot::take();
    let mut child = Command::new(launcher())
        .arg("run")
        .arg("--image")
        .arg(pause_image())
        .args(["--", "sleep", "600"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The control plane is up; containerd and the kubelet are not yet.
    let starting = lines
        .by_ref()
        .map(Result::unwrap)
        .inspect(|line| eprintln!("{line}"))
        .any(|line| line.contains("control plane ready"));
    assert!(
        starting,
        "the launcher ended before its control plane was up"
    );
    signal(&child, rustix::process::Signal::TERM);
    // Read on, so that the launcher never blocks on a full pipe (to its
    // end: when the node's last process, which shares the pipe, is gone).
    let rest = std::thread::spawn(move || {
        lines
            .map(Result::unwrap)
            .inspect(|line| eprintln!("{line}"))
            .any(|line| line.contains("interrupted"))
    });
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    assert_gone(&before);
    assert!(rest.join().unwrap(), "the launcher said it was interrupted");
}

#[test]
fn a_killed_launchers_node_cleans_up_after_itself() {
    node::clean_leftovers().unwrap();
    let before = Snapshot::take();
    let mut child = start();
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    assert_gone(&before);
}

#[test]
fn a_node_killed_with_its_launcher_is_cleaned_up_by_the_next_clean() {
    node::clean_leftovers().unwrap();
    let before = Snapshot::take();
    let mut child = start();
    let info = node::NodeInfo::read(&node::base_dir().join("node")).unwrap();
    // The node first, so that nothing of it notices and cleans up.
    let inner = rustix::process::Pid::from_raw(i32::try_from(info.pid).unwrap()).unwrap();
    rustix::process::kill_process(inner, rustix::process::Signal::KILL).unwrap();
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    assert!(
        !cgroups::processes().is_empty(),
        "the node's containerd, kubelet and control plane outlived it"
    );
    let cleaned = Command::new(launcher()).arg("clean").status().unwrap();
    assert!(cleaned.success());
    assert_gone(&before);
}

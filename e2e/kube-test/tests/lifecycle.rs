//! A started control plane's processes never outlive their owner: dropping
//! it stops and reaps them and removes its directory, and a test process
//! killed outright takes them with it. Missing binaries say how to build
//! them. These start their own control planes, so they are skipped when
//! `AIP_TEST_KUBECONFIG` names a cluster.
//!
//! The second and third run this binary again as a child (an ignored
//! helper test picked by name and told what to do by `AIP_KUBE_TEST_HELPER`),
//! since neither a killed process nor another environment can be had in
//! this one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aip_kube_test::{ControlPlane, Error, KUBECONFIG_ENV, User};

const HELPER: &str = "AIP_KUBE_TEST_HELPER";

#[tokio::test]
async fn dropping_a_control_plane_stops_its_processes_and_removes_its_directory() {
    if given_a_cluster() {
        return;
    }
    let control_plane = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = control_plane
        .dir()
        .expect("a started control plane")
        .to_path_buf();
    let running = binaries_mentioning(&dir);
    assert_eq!(
        running,
        ["etcd", "kube-apiserver", "kube-controller-manager"],
        "the three binaries run"
    );
    control_plane
        .client(User::Admin)
        .await
        .apiserver_version()
        .await
        .expect("it answers");
    drop(control_plane);
    assert_eq!(
        processes_mentioning(&dir),
        Vec::<String>::new(),
        "nothing left running"
    );
    if !keeping() {
        assert!(!dir.exists(), "{} is removed", dir.display());
    }
}

#[test]
fn processes_die_with_a_killed_test_process() {
    if given_a_cluster() {
        return;
    }
    let mut helper = run_again_as("orphan")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the test binary runs again");
    let stdout = helper.stdout.take().expect("piped");
    let dir = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        // libtest has printed "test child_helper ... " on the same line.
        .find_map(|line| {
            line.split_once("DIR ")
                .map(|(_, dir)| PathBuf::from(dir.trim()))
        })
        .expect("the helper reports its control plane's directory");
    assert_eq!(
        binaries_mentioning(&dir),
        ["etcd", "kube-apiserver", "kube-controller-manager"]
    );
    helper.kill().expect("SIGKILL"); // no destructor, no atexit: only the kernel closes its pipes
    helper.wait().expect("reaped");

    let killed = Instant::now();
    while !processes_mentioning(&dir).is_empty() || (!keeping() && dir.exists()) {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "still there 15 s after the test process died: {:?} (directory exists: {})",
            processes_mentioning(&dir),
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "gone {:?} after the test process was killed",
        killed.elapsed()
    );
}

#[test]
fn missing_binaries_name_the_script_that_builds_them() {
    if given_a_cluster() {
        return;
    }
    let status = run_again_as("missing")
        .env("AIP_CONTROLPLANE_DIR", "/nonexistent/aip-controlplane")
        .status()
        .expect("the test binary runs again");
    assert!(status.success(), "the helper's assertions hold");
}

/// Runs in a child process only (see the module comment).
#[tokio::test]
#[ignore = "a helper the other tests run in a child process"]
async fn child_helper() {
    match std::env::var(HELPER).as_deref() {
        Ok("orphan") => {
            let control_plane = ControlPlane::start()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let dir = control_plane.dir().expect("started").display().to_string();
            println!("DIR {dir}");
            tokio::time::sleep(Duration::from_secs(300)).await;
        }
        Ok("missing") => {
            let error = ControlPlane::start()
                .await
                .err()
                .expect("no binaries, no control plane");
            assert!(
                matches!(error, Error::BinaryMissing { binary: "etcd", .. }),
                "{error:?}"
            );
            assert_eq!(
                error.to_string(),
                "etcd not found at /nonexistent/aip-controlplane/etcd: run scripts/ensure-controlplane.sh \
                 (it builds kube-apiserver, kube-controller-manager and etcd into target/controlplane/), \
                 or point AIP_CONTROLPLANE_DIR at a directory holding them"
            );
            let prefix = format!("aip-kube-test-{}-", std::process::id());
            let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
                .expect("the temp dir lists")
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect();
            assert!(
                left.is_empty() || keeping(),
                "the start that failed left {left:?}"
            );
        }
        _ => {}
    }
}

fn run_again_as(role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command
        .args([
            "--exact",
            "child_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER, role);
    command
}

fn given_a_cluster() -> bool {
    std::env::var_os(KUBECONFIG_ENV).is_some_and(|v| !v.is_empty())
}

fn keeping() -> bool {
    std::env::var_os("AIP_KUBE_TEST_KEEP").is_some_and(|v| !v.is_empty())
}

/// The command lines of every process (but this one) that mention `dir`:
/// each control-plane process and its watchdog name files in it.
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let own = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.bytes().all(|b| b.is_ascii_digit()) && name != own.as_str()
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle))
        .collect();
    found.sort();
    found
}

/// The names of the control-plane binaries running for `dir`.
fn binaries_mentioning(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = processes_mentioning(dir)
        .iter()
        .filter_map(|cmdline| cmdline.split(' ').next())
        .filter_map(|argv0| Path::new(argv0).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| name != "sh")
        .collect();
    names.sort();
    names
}

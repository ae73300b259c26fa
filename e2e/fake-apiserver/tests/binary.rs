//! The `aip-fake-apiserver` binary as scripts use it: a token file in, the
//! CA and a kubeconfig per user out, metrics and health for anyone, and a
//! prompt exit on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn writes_kubeconfigs_serves_metrics_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("aip-fake-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokens.csv"), "bob-token,bob,2001,\"viewers\"\n").unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_aip-fake-apiserver"))
        .arg("--token-file")
        .arg(dir.join("tokens.csv"))
        .arg("--out-dir")
        .arg(&dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(server.stderr.take().unwrap());
    let mut serving = false;
    for line in stderr.lines() {
        if line.unwrap().contains("serving on https://") {
            serving = true;
            break;
        }
    }
    assert!(serving, "the server says where it serves");
    let kubectl = |user: &str, args: &[&str]| {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", dir.join(format!("{user}.kubeconfig")))
            .env("HOME", &dir)
            .output()
            .expect("kubectl must be installed to run this test");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    assert!(dir.join("ca.crt").exists());
    let (ok, text) = kubectl("admin", &["get", "namespaces"]);
    assert!(ok && text.contains("kube-system"), "{text}");
    let (ok, text) = kubectl("bob", &["get", "namespaces"]);
    assert!(
        !ok && text.contains(r#"User "bob" cannot list resource "namespaces""#),
        "{text}"
    );
    let (ok, metrics) = kubectl("bob", &["get", "--raw", "/metrics"]);
    assert!(ok, "{metrics}");
    assert!(
        metrics.contains(r#"aip_fake_apiserver_requests_total{verb="GET",code="403"}"#),
        "{metrics}"
    );

    let pid = rustix::process::Pid::from_raw(server.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

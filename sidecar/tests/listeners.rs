//! The two admin listeners of `aip-sidecar run`: `--admin` serves every
//! route, `--metrics-listen` (what the injector puts on the pod's IP) only
//! /healthz, /readyz and /metrics. Real HTTP to the real binary on loopback,
//! each listener on an ephemeral port.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(30);

/// A directory of its own under cargo's target/tmp (so that a run that is
/// killed leaves nothing outside target/), removed when the guard drops.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

struct Sidecar {
    child: Child,
    admin: SocketAddr,
    metrics: SocketAddr,
    token: String,
    /// The configuration's directory, removed after the process is gone.
    _scratch: tempfile::TempDir,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the sidecar with a file policy and a ToolConnection (so
/// /connections has an upstream URL to give away), and reads the addresses
/// it bound from its start line.
fn start() -> Sidecar {
    let tmp = scratch("aip-sidecar-listeners-");
    let dir = tmp.path();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p}\nspec: {}\n---\n\
         apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {name: secret-upstream}\n\
         spec: {url: 'http://127.0.0.1:9/mcp'}\n",
    )
    .unwrap();
    let token_file = dir.join("token");
    let mut child = Command::new(env!("CARGO_BIN_EXE_aip-sidecar"))
        .args(["run", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0", "--audit", "/dev/null"])
        .arg("--approval-token-file")
        .arg(&token_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained for the process's life: a closed pipe would fail its writes.
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = loop {
        let line = lines
            .recv_timeout(PATIENCE)
            .expect("the sidecar prints where it listens");
        if line.contains("agents at http://") {
            break line;
        }
    };
    let addr = |label: &str| -> SocketAddr {
        let rest = line
            .split(&format!("{label} at http://"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {label} address in {line:?}"));
        rest.split([' ', '/']).next().unwrap().parse().unwrap()
    };
    let token = std::fs::read_to_string(&token_file).unwrap();
    Sidecar {
        admin: addr("admin"),
        metrics: addr("metrics"),
        token: token.trim().to_owned(),
        child,
        _scratch: tmp,
    }
}

/// The status code and body of `GET path`, with the approval token.
fn get(addr: SocketAddr, path: &str, token: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {out:?}"));
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

#[test]
fn the_metrics_listener_serves_probes_and_metrics_and_nothing_else() {
    let sidecar = start();
    let (admin, metrics, token) = (sidecar.admin, sidecar.metrics, &sidecar.token);
    assert_ne!(admin, metrics);

    // What the kubelet and Prometheus need, on both.
    for addr in [admin, metrics] {
        assert_eq!(get(addr, "/healthz", token).0, 200, "{addr}");
        assert_eq!(get(addr, "/readyz", token), (200, "ready\n".to_owned()));
        let (status, body) = get(addr, "/metrics", token);
        assert_eq!(status, 200, "{addr}");
        assert!(body.ends_with("# EOF\n"), "{addr}: {body}");
    }

    // What only the pod may see: on the admin listener, these exist (with
    // the token, even the approvals)...
    let (status, body) = get(admin, "/connections", token);
    assert_eq!(status, 200);
    assert!(body.contains("secret-upstream"), "{body}");
    assert_eq!(get(admin, "/approvals", token).0, 200);

    // ...and on the metrics listener they do not, token or not, nor under
    // another spelling.
    for path in [
        "/connections",
        "/approvals",
        "/approvals/ap-1",
        "/connections/",
        "/metrics/../connections",
        "/",
    ] {
        let (status, body) = get(metrics, path, token);
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("secret-upstream"), "{path}: {body}");
    }
}

#[test]
fn an_address_that_cannot_be_bound_is_named_with_its_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let tmp = scratch("aip-sidecar-taken-");
    let dir = tmp.path();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p}\nspec: {}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_aip-sidecar"))
        .args(["run", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--metrics-listen", &addr, "--audit", "/dev/null"])
        .arg("--approval-token-file")
        .arg(dir.join("token"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on --metrics-listen {addr}")),
        "{err}"
    );
}

//! The sidecar under hostile load, for docs/performance.md (`make bench`):
//! a flood of 1000 connections that trickle their headers, sixteen 4 MiB
//! requests at once, and a pipelining stdio client, while a legitimate
//! agent keeps calling. Reports the real binary's peak RSS during the load,
//! its RSS once the load has gone, how the large requests were answered
//! (served, 503), and the legitimate calls served meanwhile with their
//! latency. Results go to target/bench/resources.json.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::status_kib;

const FLOOD: usize = 1000;
const LARGE: usize = 16;
const LARGE_BYTES: usize = 4 * 1024 * 1024 - 300;
/// The bound docs/performance.md documents.
const BOUND_MB: f64 = 64.0;

fn sidecar_binary() -> PathBuf {
    std::env::var_os("AIP_BENCH_SIDECAR").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_aip-sidecar")),
        PathBuf::from,
    )
}

/// How close to idle RSS must come back after the load, and how soon.
const RETURNED_WITHIN_KIB: u64 = 4 * 1024;
const RETURN_DEADLINE: Duration = Duration::from_secs(10);

/// RSS once the allocator has handed the load's pages back, and how long
/// that took: sampled every 100 ms until it is within
/// `RETURNED_WITHIN_KIB` of idle, or the deadline (then `None`). The
/// kernel sends no event for it; the samples are the measurement.
fn returned(pid: u32, idle_kib: u64) -> (u64, Option<u64>) {
    let started = Instant::now();
    loop {
        let rss = status_kib(pid, "VmRSS:");
        if rss <= idle_kib + RETURNED_WITHIN_KIB {
            return (rss, Some(started.elapsed().as_millis() as u64));
        }
        if started.elapsed() >= RETURN_DEADLINE {
            return (rss, None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Sidecar {
    child: Child,
    addr: SocketAddr,
    /// The configuration's directory, under cargo's target/tmp; removed
    /// when this drops, after the process.
    _dir: tempfile::TempDir,
}

impl Sidecar {
    fn start() -> Sidecar {
        let tmp = tempfile::Builder::new()
            .prefix("aip-bench-res-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let dir = tmp.path();
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p}\nspec: {}\n",
        )
        .unwrap();
        let mut child = common::dies_with_us(sidecar_binary())
            .args(["run", "--config"])
            .arg(&config)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--audit",
                "/dev/null",
            ])
            .arg("--approval-token-file")
            .arg(dir.join("token"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "the sidecar starts"
            );
            if let Some(rest) = line.split("agents at http://").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Sidecar {
            child,
            addr,
            _dir: tmp,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One POST; the status code (0 if the connection failed). The reply is
/// read while the body is still being written: a server that refuses a
/// large request answers before reading it.
fn post(addr: SocketAddr, body: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let mut writer = s.try_clone().unwrap();
    let body = body.to_owned();
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(body.as_bytes());
    });
    let mut status = [0u8; 12];
    let code = match s.read_exact(&mut status) {
        Ok(()) => String::from_utf8_lossy(&status[9..12]).parse().unwrap_or(0),
        Err(_) => 0,
    };
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = sending.join();
    code
}

/// 1000 connections that never finish their headers and sixteen 4 MiB
/// requests at once: how the large ones were answered, and the peak RSS.
fn load(addr: SocketAddr, pid: u32) -> Value {
    let flood: Vec<TcpStream> = (0..FLOOD)
        .filter_map(|_| {
            let mut s = TcpStream::connect(addr).ok()?;
            s.write_all(b"POST /mcp HTTP/1.1\r\nhost: localhost\r\n")
                .ok()?;
            Some(s)
        })
        .collect();
    let pad = "a".repeat(LARGE_BYTES);
    let large = Arc::new(
        json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"},
            "pad": pad}})
        .to_string(),
    );
    let started = Instant::now();
    let senders: Vec<_> = (0..LARGE)
        .map(|_| {
            let large = large.clone();
            std::thread::spawn(move || post(addr, &large))
        })
        .collect();
    let statuses: Vec<u16> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    let peak_kib = status_kib(pid, "VmHWM:");
    let open = flood.len();
    drop(flood);
    let count = |code: u16| statuses.iter().filter(|s| **s == code).count();
    json!({
        "flood_connections": open,
        "large_requests": LARGE,
        "large_served": count(200),
        "large_refused_503": count(503),
        "large_other": LARGE - count(200) - count(503),
        "large_wall_ms": (wall_ms * 10.0).round() / 10.0,
        "peak_kib": peak_kib,
    })
}

fn main() {
    let sidecar = Sidecar::start();
    let addr = sidecar.addr;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}})
    .to_string();
    assert_eq!(post(addr, &init), 200);
    let idle_kib = status_kib(sidecar.pid(), "VmRSS:");

    // The legitimate agent, calling throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let failures = Arc::new(Mutex::new(0usize));
    let agent = {
        let (stop, latencies, failures, init) = (
            stop.clone(),
            latencies.clone(),
            failures.clone(),
            init.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                if post(addr, &init) == 200 {
                    latencies
                        .lock()
                        .unwrap()
                        .push(started.elapsed().as_secs_f64() * 1e3);
                } else {
                    *failures.lock().unwrap() += 1;
                }
            }
        })
    };

    // The load, twice: the second peak shows whether the first left
    // anything behind that grows.
    let first = load(addr, sidecar.pid());
    let second = load(addr, sidecar.pid());
    stop.store(true, Ordering::Relaxed);
    agent.join().unwrap();

    // Memory once the load has gone: the flood's connections are closed by
    // the client (above) and every request has been answered.
    assert_eq!(post(addr, &init), 200);
    let after_kib = status_kib(sidecar.pid(), "VmRSS:");
    let (returned_kib, returned_ms) = returned(sidecar.pid(), idle_kib);

    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let figures = json!({
        "first": first,
        "second": second,
        "legit_calls_served": lat.len(),
        "legit_calls_failed": *failures.lock().unwrap(),
        "legit_p50_ms": (pct(0.5) * 100.0).round() / 100.0,
        "legit_p99_ms": (pct(0.99) * 100.0).round() / 100.0,
        "idle_kib": idle_kib,
        "after_kib": after_kib,
        "returned_kib": returned_kib,
        "returned_ms": returned_ms,
        "returned_within_kib": RETURNED_WITHIN_KIB,
        "bound_mb": BOUND_MB,
    });
    let text = serde_json::to_string_pretty(&figures).unwrap();
    println!("{text}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("resources.json"), text).unwrap();
    let _: Value = figures;
}

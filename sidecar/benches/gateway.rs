//! End-to-end gateway figures for docs/performance.md (`make bench`):
//! per-call latency p50/p99 and pipelined throughput, directly to an upstream
//! and through the real `aip-sidecar` binary, over Streamable HTTP and over
//! the stdio wrap; the sidecar's peak RSS idle and under load.
//!
//! The upstreams are minimal MCP responders (in this process for HTTP; this
//! executable re-run with `--null-stdio-server` for stdio), the same on both
//! sides of each comparison, so the numbers measure the gateway. Over HTTP
//! each figure is taken four ways: direct; through a TCP relay (this
//! executable re-run with `--tcp-relay`: bytes copied, none read — the
//! least any hop can cost on this machine); through the floor (re-run with
//! `--floor-proxy`: a pass-through proxy from the sidecar's own stack,
//! hyper on tokio, parsing no body — what an HTTP hop costs); and through
//! the sidecar; in both protocol eras: 2025-11-25 (a
//! session per client) and 2026-07-28 (no session, `_meta` and routing
//! headers on every request, the upstream probed and spoken to in that era).
//! Beside them, the gateways users would pick instead, where built
//! (`peers`: mcp-proxy and ToolHive, scripts/ensure-bench-peers.sh), on the
//! same upstream and load. Every HTTP figure is taken `REPS` times with the
//! ways alternating; the medians and the sidecar's paired ratios go, with
//! the rest, to target/bench/sidecar.json for scripts/bench-table.py.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

mod common;
mod peers;
use common::{cpu_seconds, dies_with_us, status_kib};

const SEQUENTIAL_CALLS: usize = 3000;
const CONCURRENT_CLIENTS: usize = 32;
/// The client counts throughput is measured at, each client its own session.
const CLIENT_COUNTS: [usize; 3] = [1, 8, 32];
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(3);
const STDIO_CALLS: usize = 2000;

/// The sidecar measured: this workspace's, or `AIP_BENCH_SIDECAR` (to
/// compare two builds in one run).
fn sidecar_binary() -> PathBuf {
    std::env::var_os("AIP_BENCH_SIDECAR").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_aip-sidecar")),
        PathBuf::from,
    )
}

fn main() {
    if std::env::args().any(|a| a == "--null-stdio-server") {
        return null_stdio_server();
    }
    if std::env::args().any(|a| a == "--relay") {
        return line_relay();
    }
    if let Some(upstream) = std::env::args().skip_while(|a| a != "--floor-proxy").nth(1) {
        return floor_proxy(&upstream);
    }
    if let Some(upstream) = std::env::args().skip_while(|a| a != "--tcp-relay").nth(1) {
        return tcp_relay(&upstream);
    }
    if let Some(calls) = std::env::args().skip_while(|a| a != "--profile").nth(1) {
        return profile(calls.parse().unwrap());
    }
    raise_open_file_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let results = runtime.block_on(run());
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("sidecar.json"),
        serde_json::to_string_pretty(&results).unwrap(),
    )
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&results).unwrap());
}

/// The soft limit on open files raised to the hard one, as Go's runtime
/// does for every Go program (ToolHive's among them): the upstream here
/// serves every way's connections, a peer's idle ones included.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            eprintln!("cannot raise the limit on open files: {e}");
        }
    }
}

async fn run() -> Value {
    let (http, rss) = http_figures(Era::Legacy).await;
    let (http_modern, _) = http_figures(Era::Modern).await;
    let token = token_figures().await;
    let stdio = stdio_figures();
    json!({
        "http": http,
        "http_modern": http_modern,
        "token": token,
        "stdio": stdio,
        "rss": rss,
    })
}

/// The lifetime the benchmark's token endpoint gives its tokens: the
/// gateway asks again after four fifths of it.
const TOKEN_LIFETIME: Duration = Duration::from_secs(10);

/// A call through a connection whose token comes from an authorization
/// server (client credentials, cached) against one through a static
/// bearer token, same upstream, same load, interleaved; and how many token
/// requests the run made against how many expiries it spanned.
async fn token_figures() -> Value {
    let upstream = null_upstream(Era::Legacy).await;
    let url = format!("http://{upstream}/mcp");
    let (endpoint, requests) = token_endpoint().await;
    let started = Instant::now();
    let bearer = Gateway::start_with(
        &url,
        Era::Legacy,
        "  bearerToken: {valueFrom: {file: SECRET}}\n",
    )
    .await;
    let oauth = Gateway::start_with(
        &url,
        Era::Legacy,
        &format!(
            "  auth:\n    clientCredentials:\n      tokenEndpoint: {endpoint}\n      clientId: bench\n      clientSecret: {{valueFrom: {{file: SECRET}}}}\n"
        ),
    )
    .await;
    let ways = [&bearer, &oauth];
    let urls: Vec<String> = ways
        .iter()
        .map(|g| format!("http://{}/mcp", g.agent))
        .collect();
    let mut reps = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let targets: Vec<(&str, &str)> = urls.iter().map(|u| (u.as_str(), "up_read")).collect();
        let p50: Vec<f64> = latencies(&targets, Era::Legacy)
            .await
            .into_iter()
            .map(|(p50, _)| p50)
            .collect();
        let mut cpu = Vec::new();
        let mut rate = Vec::new();
        for (g, u) in ways.iter().zip(&urls) {
            let (r, seconds) = measured(
                g.child.id(),
                throughput(u, "up_read", CONCURRENT_CLIENTS, Era::Legacy),
            )
            .await;
            cpu.push(seconds * 1e6 / (r * THROUGHPUT_WINDOW.as_secs_f64()));
            rate.push(r);
        }
        reps.push(TokenRep { p50, cpu, rate });
    }
    let elapsed = started.elapsed();
    let made = requests.load(std::sync::atomic::Ordering::Relaxed);
    drop(oauth);
    drop(bearer);
    let med = |f: &dyn Fn(&TokenRep) -> f64| median(reps.iter().map(f).collect());
    let way = |i: usize| {
        json!({
            "p50_us": med(&|r| r.p50[i]),
            "cpu_us_per_call": round1(med(&|r| r.cpu[i])),
            "calls_per_s_32": med(&|r| r.rate[i]),
        })
    };
    // A refresh every four fifths of a lifetime, and the first request.
    let refresh = TOKEN_LIFETIME.as_secs_f64() * 0.8;
    json!({
        "reps": REPS,
        "bearer": way(0),
        "oauth": way(1),
        // Paired within each repetition: oauth / bearer.
        "oauth_vs_bearer": {
            "p50": med(&|r| ratio(r.p50[1], r.p50[0])),
            "cpu_per_call": med(&|r| ratio(r.cpu[1], r.cpu[0])),
            "calls_per_s_32": med(&|r| ratio(r.rate[1], r.rate[0])),
        },
        "token_lifetime_s": TOKEN_LIFETIME.as_secs(),
        "seconds": round1(elapsed.as_secs_f64()),
        "token_requests": made,
        "token_requests_expected": (elapsed.as_secs_f64() / refresh).floor() + 1.0,
    })
}

/// One repetition of the token figures: p50 at one client, CPU per call
/// and calls per second at 32, for the static bearer then the token.
struct TokenRep {
    p50: Vec<f64>,
    cpu: Vec<f64>,
    rate: Vec<f64>,
}

/// A token endpoint on loopback: every request gets a new opaque token of
/// TOKEN_LIFETIME; the count of requests it answered.
async fn token_endpoint() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let count = std::sync::Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let addr = aip_kube_test::keycloak::serve_loopback(
        move |_req: Request<Incoming>| {
            let n = counted.fetch_add(1, Ordering::Relaxed);
            // About the size of a real JWT access token.
            let token = format!("bench-{n}-{}", "x".repeat(900));
            let body = json!({"access_token": token, "token_type": "Bearer",
                              "expires_in": TOKEN_LIFETIME.as_secs()});
            let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            async move { r }
        },
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    (format!("http://{addr}/token"), count)
}

/// The protocol era the HTTP figures are taken in: the client, the
/// upstream and so the sidecar on both sides speak it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Era {
    /// 2025-11-25: a session per client, opened with initialize.
    Legacy,
    /// 2026-07-28: no session; version and capabilities in every request's
    /// `_meta`, its method and name mirrored in headers.
    Modern,
}

/// How many times each HTTP figure is taken, the ways through alternating;
/// the table reports the medians, and ratios between two ways paired
/// within a repetition (a busy moment of the machine falls on both). Five:
/// the median of three paired CPU ratios moved by 0.2 between runs of one
/// build on this machine (docs/performance.md).
const REPS: usize = 5;

/// One way from the benchmark's clients to the upstream.
struct Hop {
    /// Its figures' key in target/bench/sidecar.json.
    key: String,
    url: String,
    /// The name the upstream's tool has on this way.
    tool: String,
    /// The process in the way, whose CPU time and memory are read; none
    /// when the clients reach the upstream directly.
    pid: Option<u32>,
    /// From the process's start to its first answered tools/call.
    startup_ms: Option<f64>,
    /// A peer's release.
    version: Option<String>,
}

/// What one repetition measured of one way.
#[derive(Clone, Copy, Default)]
struct Taken {
    p50_us: f64,
    p99_us: f64,
    /// Calls per second at each of `CLIENT_COUNTS`.
    calls_per_s: [f64; CLIENT_COUNTS.len()],
    /// CPU time of the process per call at `CONCURRENT_CLIENTS`.
    cpu_us_per_call: f64,
}

/// Direct, relay, floor, sidecar and each peer that speaks `era`: latency
/// at one client, throughput at each client count, CPU per call, memory,
/// start-up; `REPS` times, every way in turn within each.
async fn http_figures(era: Era) -> (Value, Value) {
    let upstream = null_upstream(era).await;
    let direct_url = format!("http://{upstream}/mcp");
    let started = Instant::now();
    let floor = Floor::start("--floor-proxy", &format!("http://{upstream}"));
    let floor_url = format!("http://{}/mcp", floor.agent);
    let floor_startup = first_answer(&floor_url, "read", era, started).await.ok();
    let started = Instant::now();
    let relay = Floor::start("--tcp-relay", &upstream.to_string());
    let relay_url = format!("http://{}/mcp", relay.agent);
    let relay_startup = first_answer(&relay_url, "read", era, started).await.ok();
    let gateway = Gateway::start(&direct_url, era).await;
    let gateway_url = format!("http://{}/mcp", gateway.agent);
    let idle_rss = gateway.rss_kib();
    let (peers, left_out) = peers::start_all(upstream, era).await;

    let hop = |key: &str, url: &str, tool: &str, pid, startup_ms| Hop {
        key: key.to_owned(),
        url: url.to_owned(),
        tool: tool.to_owned(),
        pid,
        startup_ms,
        version: None,
    };
    let mut hops = vec![
        hop("direct", &direct_url, "read", None, None),
        hop(
            "relay",
            &relay_url,
            "read",
            Some(relay.child.id()),
            relay_startup,
        ),
        hop(
            "floor",
            &floor_url,
            "read",
            Some(floor.child.id()),
            floor_startup,
        ),
        hop(
            "gateway",
            &gateway_url,
            "up_read",
            Some(gateway.child.id()),
            Some(gateway.startup_ms),
        ),
    ];
    for peer in &peers {
        hops.push(Hop {
            version: Some(peer.version.clone()),
            ..hop(
                &peer.key,
                &peer.url,
                &peer.tool,
                Some(peer.child.id()),
                Some(peer.startup_ms),
            )
        });
    }

    let mut reps: Vec<Vec<Taken>> = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let targets: Vec<(&str, &str)> = hops
            .iter()
            .map(|h| (h.url.as_str(), h.tool.as_str()))
            .collect();
        let mut taken: Vec<Taken> = latencies(&targets, era)
            .await
            .into_iter()
            .map(|(p50_us, p99_us)| Taken {
                p50_us,
                p99_us,
                ..Taken::default()
            })
            .collect();
        for (c, clients) in CLIENT_COUNTS.into_iter().enumerate() {
            for (h, hop) in hops.iter().enumerate() {
                let load = throughput(&hop.url, &hop.tool, clients, era);
                let (rate, cpu) = match hop.pid {
                    Some(pid) => measured(pid, load).await,
                    None => (load.await, 0.0),
                };
                taken[h].calls_per_s[c] = rate;
                if clients == CONCURRENT_CLIENTS {
                    taken[h].cpu_us_per_call =
                        round1(cpu * 1e6 / (rate * THROUGHPUT_WINDOW.as_secs_f64()));
                }
            }
        }
        reps.push(taken);
    }
    let peak_rss: Vec<Option<u64>> = hops
        .iter()
        .map(|h| h.pid.map(|pid| status_kib(pid, "VmHWM:")))
        .collect();
    // Resident memory after the load, split: the process's own (anonymous)
    // and file-backed pages (the binary's code and the shared libraries,
    // which the kernel maps around each touched page).
    let (anon, file) = (
        gateway.status_kib("RssAnon:"),
        gateway.status_kib("RssFile:"),
    );
    drop(peers);
    drop(gateway);
    drop(floor);
    drop(relay);

    // The median over the repetitions of what `f` takes of way `h` (and of
    // the direct way, the first).
    let over_reps = |f: &dyn Fn(&[Taken]) -> f64| median(reps.iter().map(|t| f(t)).collect());
    let at32 = CLIENT_COUNTS
        .iter()
        .position(|&c| c == CONCURRENT_CLIENTS)
        .unwrap();
    let mut ways = serde_json::Map::new();
    for (h, hop) in hops.iter().enumerate() {
        let mut by_clients = serde_json::Map::new();
        for (c, clients) in CLIENT_COUNTS.into_iter().enumerate() {
            by_clients.insert(
                clients.to_string(),
                json!(over_reps(&|t| t[h].calls_per_s[c])),
            );
        }
        ways.insert(
            hop.key.clone(),
            json!({
                "p50_us": over_reps(&|t| t[h].p50_us),
                "p99_us": over_reps(&|t| t[h].p99_us),
                "added_p50_us": over_reps(&|t| t[h].p50_us - t[0].p50_us),
                "calls_per_s": by_clients,
                "cpu_us_per_call": hop.pid.map(|_| over_reps(&|t| t[h].cpu_us_per_call)),
                "peak_rss_kib": peak_rss[h],
                "startup_ms": hop.startup_ms,
                "version": hop.version,
            }),
        );
    }
    // The sidecar against each other way, as ratios paired within each
    // repetition (sidecar / other: below 1 is the sidecar ahead on added
    // p50 and CPU, above 1 on calls per second).
    let g = 3;
    let mut paired = serde_json::Map::new();
    for (h, hop) in hops.iter().enumerate().skip(2).filter(|(h, _)| *h != g) {
        paired.insert(hop.key.clone(), json!({
            "added_p50": over_reps(&|t| ratio(t[g].p50_us - t[0].p50_us, t[h].p50_us - t[0].p50_us)),
            "cpu_per_call": over_reps(&|t| ratio(t[g].cpu_us_per_call, t[h].cpu_us_per_call)),
            "calls_per_s_32": over_reps(&|t| ratio(t[g].calls_per_s[at32], t[h].calls_per_s[at32])),
        }));
    }
    let way = |key: &str, field: &str| ways[key][field].clone();
    let mut by_clients = serde_json::Map::new();
    for clients in CLIENT_COUNTS {
        let rate = |key: &str| ways[key]["calls_per_s"][clients.to_string()].clone();
        by_clients.insert(
            clients.to_string(),
            json!({"direct_calls_per_s": rate("direct"), "relay_calls_per_s": rate("relay"),
                   "floor_calls_per_s": rate("floor"), "gateway_calls_per_s": rate("gateway")}),
        );
    }
    let rate32 = |key: &str| ways[key]["calls_per_s"][CONCURRENT_CLIENTS.to_string()].clone();
    let http = json!({
        "reps": REPS,
        "direct_p50_us": way("direct", "p50_us"), "direct_p99_us": way("direct", "p99_us"),
        "relay_p50_us": way("relay", "p50_us"), "relay_p99_us": way("relay", "p99_us"),
        "relay_added_p50_us": way("relay", "added_p50_us"),
        "floor_p50_us": way("floor", "p50_us"), "floor_p99_us": way("floor", "p99_us"),
        "gateway_p50_us": way("gateway", "p50_us"), "gateway_p99_us": way("gateway", "p99_us"),
        "added_p50_us": way("gateway", "added_p50_us"),
        "floor_added_p50_us": way("floor", "added_p50_us"),
        "direct_calls_per_s": rate32("direct"),
        "relay_calls_per_s": rate32("relay"),
        "floor_calls_per_s": rate32("floor"),
        "gateway_calls_per_s": rate32("gateway"),
        "relay_cpu_us_per_call": way("relay", "cpu_us_per_call"),
        "floor_cpu_us_per_call": way("floor", "cpu_us_per_call"),
        "gateway_cpu_us_per_call": way("gateway", "cpu_us_per_call"),
        "gateway_cpu_vs_floor": over_reps(&|t| ratio(t[g].cpu_us_per_call, t[2].cpu_us_per_call)),
        "floor_peak_rss_kib": way("floor", "peak_rss_kib"),
        "gateway_peak_rss_kib": way("gateway", "peak_rss_kib"),
        "by_clients": by_clients,
        "ways": ways,
        "sidecar_vs": paired,
        "peers_left_out": left_out,
    });
    let rss = json!({"idle_kib": idle_rss, "peak_under_load_kib": way("gateway", "peak_rss_kib"),
                     "after_load_anon_kib": anon, "after_load_file_kib": file});
    (http, rss)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// `a / b` to three places; NaN-free (0 when `b` is not positive).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        (a / b * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let m = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    (m * 1000.0).round() / 1000.0
}

/// Milliseconds from `since` (a process's start) to the first tools/call
/// through `url` answered with the tool's result. Asked again at once while
/// the process refuses connections (not listening yet), for at most 30 s
/// (a start under a profiler is slow); once it answers otherwise, for 3 s
/// more (a gateway still connecting upstream). The last refusal or answer
/// when the result never comes.
async fn first_answer(url: &str, tool: &str, era: Era, since: Instant) -> Result<f64, String> {
    let mut limit = since + Duration::from_secs(30);
    let mut answered = false;
    loop {
        let attempt = match McpClient::try_connect(url, era).await {
            Ok(client) => client.try_call(0, tool).await,
            Err(e) => Err(e),
        };
        let last = match attempt {
            Ok(()) => return Ok(round1(since.elapsed().as_secs_f64() * 1e3)),
            Err(Failed::Refused(e)) => e,
            Err(Failed::Answered(e)) => {
                if !answered {
                    answered = true;
                    limit = limit.min(Instant::now() + Duration::from_secs(3));
                }
                e
            }
        };
        if Instant::now() >= limit {
            return Err(last);
        }
        // A foreign process says nothing when it is ready: ask again soon.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Why a client's request came to nothing.
enum Failed {
    /// No answer: the connection was refused or broke.
    Refused(String),
    /// An answer that is not the one asked for: an HTTP error status, or
    /// a body without the tool's result.
    Answered(String),
}

impl std::fmt::Debug for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Refused(e) => write!(f, "refused: {e}"),
            Failed::Answered(e) => write!(f, "answered: {e}"),
        }
    }
}

/// `--profile N` (scripts/profile-hop.py): N sequential calls through the
/// floor and through the sidecar, each process run under `AIP_BENCH_WRAP`
/// (a profiler's command line), then both stopped with SIGTERM so the
/// profiler writes its counts. Two runs with different N give the cost of a
/// call as their difference, start-up and warm-up cancelled out.
fn profile(calls: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The legacy era, or the modern with AIP_BENCH_PROFILE_ERA=modern.
    let era = match std::env::var("AIP_BENCH_PROFILE_ERA").as_deref() {
        Ok("modern") => Era::Modern,
        _ => Era::Legacy,
    };
    runtime.block_on(async move {
        let upstream = null_upstream(era).await;
        let mut floor = Floor::start("--floor-proxy", &format!("http://{upstream}"));
        let mut gateway = Gateway::start(&format!("http://{upstream}/mcp"), era).await;
        for (url, tool) in [
            (format!("http://{}/mcp", floor.agent), "read"),
            (format!("http://{}/mcp", gateway.agent), "up_read"),
        ] {
            let client = McpClient::connect(&url, era).await;
            for i in 0..calls {
                client.call(i, tool).await;
            }
        }
        terminate(&mut floor.child);
        terminate(&mut gateway.child);
    });
    println!("{}", json!({ "calls": calls }));
}

/// Stops a child with SIGTERM and waits for it (a profiler writes its
/// output as its process ends; SIGKILL would lose it). A wrapper that runs
/// the program as its own child (strace) has the signal sent to that child,
/// and ends with it.
fn terminate(child: &mut Child) {
    let pid = child.id().to_string();
    let children = Command::new("pkill").args(["-TERM", "-P", &pid]).status();
    if !children.is_ok_and(|s| s.success()) {
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    }
    child.wait().unwrap();
}

/// `program` run under `AIP_BENCH_WRAP` when it is set (words split on
/// whitespace, `{role}` in them replaced by `role`, so that each process
/// gets its own output file), as itself otherwise; either way killed when
/// this benchmark ends ([`dies_with_us`]).
fn wrapped(program: &Path, role: &str) -> Command {
    match std::env::var("AIP_BENCH_WRAP") {
        Ok(wrap) if !wrap.trim().is_empty() => {
            let mut words = wrap.split_whitespace().map(|w| w.replace("{role}", role));
            let mut command = dies_with_us(words.next().unwrap());
            command.args(words).arg(program);
            command
        }
        _ => dies_with_us(program),
    }
}

// ------------------------------------------------------------ upstream --

/// Answers initialize with a session, notifications with 202, and every
/// tools/call with a small result, as fast as it can. In the modern era it
/// also answers server/discover with 2026-07-28, so the sidecar speaks that
/// era to it, and gives its results a `resultType`.
///
/// A connection idle for [`UPSTREAM_IDLE`] is closed, as servers close
/// idle keep-alive connections: ToolHive's vMCP (v0.47.0) opens a new
/// connection to its backend for about every 2025-11-25 call, and its Go
/// transport keeps each one idle for 90 s, which held some 15,000 of them
/// open here and ran this process out of file descriptors (its limit was
/// 20,000).
async fn null_upstream(era: Era) -> SocketAddr {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap_or_else(|e| {
                let open = open.load(Ordering::Relaxed);
                panic!("the null upstream cannot accept a connection with {open} open: {e}")
            });
            let open = Arc::clone(&open);
            open.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                serve_until_idle(stream, era).await;
                open.fetch_sub(1, Ordering::Relaxed);
            });
        }
    });
    addr
}

/// Between its turns in `http_figures` a way waits either under a second
/// (the latency batches, the warm-up) or six other ways' throughput
/// windows (18 s). Closing at neither, the upstream closes a connection a
/// way keeps in its pool while that way is not calling, never as it picks
/// the connection up.
const UPSTREAM_IDLE: Duration = Duration::from_secs(10);

/// Serves one connection until the client closes it or sends no request
/// for [`UPSTREAM_IDLE`]: hyper's header read timeout runs from the moment
/// it waits for a request's head, an idle keep-alive connection's included.
async fn serve_until_idle(stream: tokio::net::TcpStream, era: Era) {
    let service = hyper::service::service_fn(move |req| answer(req, era));
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(UPSTREAM_IDLE)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn answer(req: Request<Incoming>, era: Era) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(id) = message.get("id") else {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = hyper::StatusCode::ACCEPTED;
        return Ok(r);
    };
    let mut result = match message["method"].as_str() {
        Some("server/discover") if era == Era::Modern => {
            json!({"supportedVersions": [aip_mcp::modern::VERSION], "capabilities": {"tools": {}},
                   "serverInfo": {"name": "null", "version": "1"}})
        }
        Some("initialize") => {
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "null", "version": "1"}})
        }
        Some("tools/list") => {
            json!({"tools": [{"name": "read", "inputSchema": {"type": "object"}}]})
        }
        _ => json!({"content": [{"type": "text", "text": "ok"}], "isError": false}),
    };
    if aip_mcp::modern::claims_modern(&message) {
        result["resultType"] = json!("complete");
    } else if era == Era::Modern && message["method"] == "tools/call" {
        // The modern figures are the modern era's end to end: a legacy call
        // here fails the benchmark's call.
        result = json!({"content": "a legacy call to a modern-only upstream"});
    }
    let mut r = Response::new(Full::new(Bytes::from(
        json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
    )));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r.headers_mut()
        .insert("mcp-session-id", "bench".parse().unwrap());
    Ok(r)
}

// --------------------------------------------------------------- floor --

/// The floor: forwards every request to `upstream` and every response back,
/// bodies streamed, on pooled keep-alive connections, parsing no body. Its
/// runtime is the sidecar's: lanes (`aip_service::lanes`, one
/// single-threaded runtime per CPU, each connection served to its end on
/// one), each lane with its own upstream pool. Prints its address on
/// stdout.
fn floor_proxy(upstream: &str) {
    use aip_service::lanes::{self, ServeFn, Spread};
    let upstream: hyper::Uri = upstream.parse().unwrap();
    lanes::declare(lanes::default_count());
    serve_on_loopback(|listener| async move {
        // A pool per lane: a connection dialled on a lane is driven there.
        let pools: std::sync::Arc<Vec<Client<HttpConnector, Incoming>>> = std::sync::Arc::new(
            (0..lanes::count())
                .map(|_| {
                    Client::builder(TokioExecutor::new())
                        .pool_max_idle_per_host(256)
                        .build_http()
                })
                .collect(),
        );
        let serve: ServeFn = std::sync::Arc::new(move |stream| {
            let (pools, upstream) = (pools.clone(), upstream.clone());
            Box::pin(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (client, upstream) = (pools[lanes::current()].clone(), upstream.clone());
                    async move {
                        let (mut parts, body) = req.into_parts();
                        let mut uri = upstream.into_parts();
                        uri.path_and_query = parts.uri.path_and_query().cloned();
                        parts.uri = hyper::Uri::from_parts(uri).unwrap();
                        client.request(Request::from_parts(parts, body)).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            })
        });
        let spread = Spread::start(serve).unwrap();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(spread.dispatch(stream));
        }
    });
}

/// The floor of the floor: a TCP relay that copies bytes between each
/// agent connection and a connection of its own to `upstream` (host:port),
/// reading nothing of them, on one single-threaded runtime (no hand-off
/// between threads). No HTTP proxy can cost less; what it adds is what
/// this machine charges for one more process on the path. Prints its
/// address on stdout.
fn tcp_relay(upstream: &str) {
    let upstream: SocketAddr = upstream.parse().unwrap();
    serve_on_loopback(|listener| async move {
        loop {
            let (mut agent, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = (agent.set_nodelay(true), server.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional(&mut agent, &mut server).await;
            });
        }
    });
}

/// Runs `serve` on a listener of loopback, on a single-threaded runtime
/// (lane 0, for the floor), once the listener's address is printed.
fn serve_on_loopback<F: std::future::Future<Output = ()>>(
    serve: impl FnOnce(tokio::net::TcpListener) -> F,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        serve(listener).await;
    });
}

/// What `work` returns and the CPU seconds process `pid` spent meanwhile.
async fn measured<T>(pid: u32, work: impl std::future::Future<Output = T>) -> (T, f64) {
    let before = cpu_seconds(pid);
    let out = work.await;
    (out, cpu_seconds(pid) - before)
}

/// A floor's process: the HTTP floor proxy or the TCP relay.
struct Floor {
    child: Child,
    agent: SocketAddr,
}

impl Floor {
    /// This executable re-run as `mode` (`--floor-proxy`, `--tcp-relay`)
    /// in front of `upstream`.
    fn start(mode: &str, upstream: &str) -> Floor {
        let mut child = wrapped(&std::env::current_exe().unwrap(), "floor")
            .args([mode, upstream])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let agent = line.trim().parse().unwrap();
        Floor { child, agent }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------- gateway --

struct Gateway {
    child: Child,
    agent: SocketAddr,
    /// From its start to its first answered tools/call.
    startup_ms: f64,
    /// The configuration's directory, under cargo's target/tmp; removed
    /// when this drops, after the process.
    _dir: tempfile::TempDir,
}

impl Gateway {
    async fn start(upstream: &str, era: Era) -> Gateway {
        Gateway::start_with(upstream, era, "").await
    }

    /// With `connection` (spec lines; `SECRET` stands for a file holding a
    /// secret) added to its connection.
    async fn start_with(upstream: &str, era: Era, connection: &str) -> Gateway {
        let tmp = tempfile::Builder::new()
            .prefix("aip-bench-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let dir = tmp.path();
        let config = dir.join("gateway.yaml");
        let secret = dir.join("secret");
        std::fs::write(&secret, "bench-s3cret").unwrap();
        let connection = connection.replace("SECRET", &secret.display().to_string());
        std::fs::write(&config, format!(
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: bench}}\nspec:\n  allowed_tools: [up_read]\n  dlp:\n    patterns:\n      - {{name: Email, regex: '[a-z]+@[a-z]+\\.[a-z]{{2,}}'}}\n---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: up}}\nspec:\n  url: {upstream}\n  toolPrefix: up_\n{connection}"
        )).unwrap();
        let spawned = Instant::now();
        let mut child = wrapped(&sidecar_binary(), "sidecar")
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--audit",
                "/dev/null",
            ])
            .arg("--config")
            .arg(&config)
            .arg("--approval-token-file")
            .arg(dir.join("token"))
            .env("RUST_LOG", "error")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "aip-sidecar: agents at http://ADDR/mcp ; admin at http://ADDR ; ..."
        let agent: SocketAddr = line
            .split("http://")
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // From here on the guard reaps the child on every path, panics included.
        let mut gateway = Gateway {
            child,
            agent,
            startup_ms: 0.0,
            _dir: tmp,
        };
        gateway.startup_ms = first_answer(&format!("http://{agent}/mcp"), "up_read", era, spawned)
            .await
            .unwrap_or_else(|last| panic!("the gateway never answered a call: {last}"));
        gateway
    }

    fn status_kib(&self, field: &str) -> u64 {
        status_kib(self.child.id(), field)
    }

    fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// -------------------------------------------------------------- client --

struct McpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: hyper::Uri,
    session: String,
    era: Era,
}

impl McpClient {
    async fn connect(url: &str, era: Era) -> McpClient {
        McpClient::try_connect(url, era).await.unwrap()
    }

    /// A client of `url`, with its session open in the legacy era; the
    /// refusal or answer that stopped it otherwise.
    async fn try_connect(url: &str, era: Era) -> Result<McpClient, Failed> {
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| Failed::Refused(format!("{url}: {e}")))?;
        let mut c = McpClient {
            client,
            uri,
            session: String::new(),
            era,
        };
        if era == Era::Modern {
            return Ok(c); // no session to open
        }
        let (_, session) = c.try_post(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})).await?;
        c.session = session.unwrap_or_default();
        c.try_post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(c)
    }

    /// The body and session header of the answer to `message`, which must
    /// have a 2xx status; the refusal or the status and body otherwise.
    async fn try_post(&self, message: &Value) -> Result<(Bytes, Option<String>), Failed> {
        let mut request = Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if !self.session.is_empty() {
            request = request
                .header("mcp-session-id", &self.session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        if self.era == Era::Modern {
            request = request
                .header("mcp-protocol-version", aip_mcp::modern::VERSION)
                .header("mcp-method", message["method"].as_str().unwrap());
            if let Some(name) = message["params"]["name"].as_str() {
                request = request.header("mcp-name", name);
            }
        }
        let response = self
            .client
            .request(
                request
                    .body(Full::new(Bytes::from(message.to_string())))
                    .unwrap(),
            )
            .await
            .map_err(|e| Failed::Refused(format!("{}: {e:?}", self.uri)))?;
        let status = response.status();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Failed::Refused(format!("{}: {e}", self.uri)))?
            .to_bytes();
        if !status.is_success() {
            return Err(Failed::Answered(format!(
                "{}: {status}: {}",
                self.uri,
                String::from_utf8_lossy(&body)
            )));
        }
        Ok((body, session))
    }

    async fn call(&self, id: u64, tool: &str) {
        self.try_call(id, tool).await.unwrap()
    }

    /// Calls `tool`; Ok when the answer is the upstream's result (its
    /// text, `ok`, in it: a gateway may reshape the rest), the answer
    /// otherwise.
    async fn try_call(&self, id: u64, tool: &str) -> Result<(), Failed> {
        let mut call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"path": "/workspace/readme.md"}}});
        if !padding().is_empty() {
            call["params"]["arguments"]["text"] = json!(padding());
        }
        if self.era == Era::Modern {
            call["params"]["_meta"] = json!({
                (aip_mcp::modern::META_VERSION): aip_mcp::modern::VERSION,
                (aip_mcp::modern::META_CAPABILITIES): {},
            });
        }
        let (body, _) = self.try_post(&call).await?;
        let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        if has(b"\"result\"") && has(b"\"ok\"") {
            Ok(())
        } else {
            Err(Failed::Answered(
                String::from_utf8_lossy(&body).into_owned(),
            ))
        }
    }
}

/// Text of `AIP_BENCH_ARG_BYTES` bytes each call carries as an argument
/// (none unless set): to see how a cost grows with the message.
fn padding() -> &'static str {
    static PADDING: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PADDING.get_or_init(|| {
        let n: usize = std::env::var("AIP_BENCH_ARG_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        "the quick brown fox jumps over the lazy dog; "
            .repeat(n / 45 + 1)
            .chars()
            .take(n)
            .collect()
    })
}

/// (p50, p99) in microseconds of sequential calls to each `(url, tool)`,
/// one client each on one keep-alive connection. The calls alternate in
/// batches, so a busy moment of this machine falls on every target alike
/// instead of on whichever ran then.
async fn latencies(targets: &[(&str, &str)], era: Era) -> Vec<(f64, f64)> {
    const BATCH: usize = 100;
    let n = targets.len();
    let mut clients = Vec::with_capacity(n);
    for &(url, tool) in targets {
        let client = McpClient::connect(url, era).await;
        for i in 0..200 {
            client.call(i, tool).await; // warm up
        }
        clients.push((client, tool));
    }
    let mut samples = vec![Vec::with_capacity(SEQUENTIAL_CALLS); n];
    for batch in 0..SEQUENTIAL_CALLS / BATCH {
        for ((client, tool), samples) in clients.iter().zip(&mut samples) {
            for i in 0..BATCH {
                let start = Instant::now();
                client.call((batch * BATCH + i) as u64, tool).await;
                samples.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    samples.into_iter().map(percentiles).collect()
}

fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
    (
        (at(0.50) * 10.0).round() / 10.0,
        (at(0.99) * 10.0).round() / 10.0,
    )
}

/// Calls per second with `clients` concurrent clients (each its own
/// session), each keeping its calls in flight back to back.
async fn throughput(url: &str, tool: &str, clients: usize, era: Era) -> f64 {
    let deadline = Instant::now() + THROUGHPUT_WINDOW;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, tool) = (url.to_owned(), tool.to_owned());
        tasks.push(tokio::spawn(async move {
            let client = McpClient::connect(&url, era).await;
            let mut n = 0u64;
            while Instant::now() < deadline {
                client.call(n, &tool).await;
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    (total as f64 / THROUGHPUT_WINDOW.as_secs_f64()).round()
}

// --------------------------------------------------------------- stdio --

/// A stdio MCP server that answers every request at once.
fn null_stdio_server() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = message.get("id") else {
            continue;
        };
        let result = match message["method"].as_str() {
            Some("initialize") => {
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "null", "version": "1"}})
            }
            Some("tools/list") => {
                json!({"tools": [{"name": "read", "inputSchema": {"type": "object"}}]})
            }
            _ => json!({"content": [{"type": "text", "text": "ok"}], "isError": false}),
        };
        let _ = writeln!(
            out,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        );
        let _ = out.flush();
    }
}

/// The floor for any stdio proxy on this machine: a process that copies
/// lines between its stdio and the null server's and does nothing else (a
/// thread per direction, blocking reads, a flush per line).
fn line_relay() {
    let me = std::env::current_exe().unwrap();
    let mut server = Command::new(me)
        .arg("--null-stdio-server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_server = server.stdin.take().unwrap();
    let from_server = BufReader::new(server.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if writeln!(to_server, "{line}")
                .and(to_server.flush())
                .is_err()
            {
                return;
            }
        }
    });
    let mut out = std::io::stdout().lock();
    for line in from_server.lines() {
        let Ok(line) = line else { break };
        if writeln!(out, "{line}").and(out.flush()).is_err() {
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
}

/// Per-call round trip and pipelined throughput over stdio, directly to the
/// null server, through a do-nothing line relay, and through
/// `aip-sidecar stdio` (as shipped, and with busy polling off).
fn stdio_figures() -> Value {
    let tmp = tempfile::Builder::new()
        .prefix("aip-bench-stdio-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let policy = tmp.path().join("policy.yaml");
    std::fs::write(&policy, "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: s}\nspec:\n  allowed_tools: [read]\n").unwrap();
    let me = std::env::current_exe().unwrap();
    let mut direct = Command::new(&me);
    direct.arg("--null-stdio-server");
    let wrap = |extra: &[&str]| {
        let mut command = Command::new(sidecar_binary());
        command
            .arg("stdio")
            .args(extra)
            .arg("--policy")
            .arg(&policy)
            .args(["--audit", "/dev/null", "--"])
            .arg(&me)
            .arg("--null-stdio-server");
        command
    };
    let mut wrapped = wrap(&[]);
    // The wrap as shipped polls briefly after each line it writes; the same
    // wrap sleeping at once shows what that buys.
    let mut sleeping = wrap(&["--busy-poll-us", "0"]);
    let mut relay = Command::new(&me);
    relay.arg("--relay");
    // This machine is noisy: alternate the four, three rounds, keep medians.
    let mut runs = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        runs.0.push(stdio_run(&mut direct));
        runs.1.push(stdio_run(&mut wrapped));
        runs.2.push(stdio_run(&mut relay));
        runs.3.push(stdio_run(&mut sleeping));
    }
    let [direct, wrapped, relay, sleeping] =
        [runs.0, runs.1, runs.2, runs.3].map(|r| median_run(&r));
    drop(tmp);
    let tenth = |x: f64| (x * 10.0).round() / 10.0;
    let added = |r: &StdioRun| tenth(r.p50 - direct.p50);
    json!({
        "direct_p50_us": direct.p50, "direct_p99_us": direct.p99,
        "wrapped_p50_us": wrapped.p50, "wrapped_p99_us": wrapped.p99,
        "added_p50_us": added(&wrapped),
        "direct_calls_per_s": direct.tput, "wrapped_calls_per_s": wrapped.tput,
        "relay_added_p50_us": added(&relay), "relay_calls_per_s": relay.tput,
        "no_busy_poll_added_p50_us": added(&sleeping), "no_busy_poll_calls_per_s": sleeping.tput,
        "wrapped_cpu_us_per_call": tenth(wrapped.cpu_us),
        "no_busy_poll_cpu_us_per_call": tenth(sleeping.cpu_us),
        "relay_cpu_us_per_call": tenth(relay.cpu_us),
        "wrapped_peak_rss_kib": wrapped.peak_kib,
        "no_busy_poll_peak_rss_kib": sleeping.peak_kib,
    })
}

/// One run of [`stdio_run`]: sequential p50/p99 (us), pipelined calls/s,
/// the proxy's CPU per sequential call (us) and its peak RSS (KiB) after
/// the pipelined batch.
#[derive(Clone, Copy)]
struct StdioRun {
    p50: f64,
    p99: f64,
    tput: f64,
    cpu_us: f64,
    peak_kib: f64,
}

/// Each figure's median over the runs.
fn median_run(runs: &[StdioRun]) -> StdioRun {
    let median = |figure: fn(&StdioRun) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(figure).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    StdioRun {
        p50: median(|r| r.p50),
        p99: median(|r| r.p99),
        tput: median(|r| r.tput),
        cpu_us: median(|r| r.cpu_us),
        peak_kib: median(|r| r.peak_kib),
    }
}

fn stdio_run(command: &mut Command) -> StdioRun {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut roundtrip = |input: &mut std::process::ChildStdin,
                         output: &mut BufReader<std::process::ChildStdout>,
                         msg: &str| {
        writeln!(input, "{msg}").unwrap();
        input.flush().unwrap();
        // Notices (a changed tool list) are not answers.
        loop {
            line.clear();
            output.read_line(&mut line).unwrap();
            if !line.contains(r#""method":"notifications/"#) {
                break;
            }
        }
        // Every figure is of calls the server answered: an error from the
        // proxy itself would be a much faster, meaningless round trip.
        line.contains(r#""text":"ok""#)
            .then_some(())
            .ok_or_else(|| line.clone())
    };
    let _ = roundtrip(
        &mut input,
        &mut output,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"b","version":"1"}}}"#,
    );
    writeln!(
        input,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    let call = |id: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"read","arguments":{{"path":"/workspace/readme.md"}}}}}}"#
        )
    };
    let mut samples = Vec::with_capacity(STDIO_CALLS);
    let cpu_before = cpu_seconds(child.id());
    for i in 1..=STDIO_CALLS {
        let start = Instant::now();
        let served = roundtrip(&mut input, &mut output, &call(i));
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        if let Err(reply) = served {
            panic!("call {i} was not served: {reply}");
        }
    }
    // The proxy's own CPU per sequential call (its server's is not counted;
    // the direct run's "proxy" is the server itself).
    let cpu_us = (cpu_seconds(child.id()) - cpu_before) * 1e6 / STDIO_CALLS as f64;
    // Pipelined: write a batch of calls, then read all their answers.
    let batch = 20_000;
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        for i in 0..batch {
            writeln!(input, "{}", call(STDIO_CALLS + 1 + i)).unwrap();
        }
        input.flush().unwrap();
        input
    });
    let (mut answered, mut served) = (0, 0);
    while answered < batch {
        line.clear();
        if output.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.contains(r#""method":"notifications/"#) {
            continue;
        }
        answered += 1;
        served += usize::from(line.contains(r#""text":"ok""#));
    }
    let tput = (batch as f64 / start.elapsed().as_secs_f64()).round();
    assert_eq!(served, batch, "every pipelined call was served");
    drop(writer.join().unwrap());
    let peak_kib = status_kib(child.id(), "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let (p50, p99) = percentiles(samples);
    StdioRun {
        p50,
        p99,
        tput,
        cpu_us,
        peak_kib: peak_kib as f64,
    }
}

//! The operator at scale, against the genuine kube-apiserver (a control
//! plane of its own per measurement, from aip-kube-test), with the real
//! aip-operator binary and the real kubectl:
//!
//! - propagation: from `kubectl apply` of an AgentPolicy change to the acks
//!   of N simulated sidecars (real gRPC clients over TLS on loopback, each
//!   with its own pod-bound token), p50/p90/p99 over several changes;
//! - memory: the operator's RSS with 10,000 AgentPolicies and 10,000 pods,
//!   once every policy's status is written;
//! - capacity: 10,000 simulated sidecars against two replicas capped at
//!   6,000 each (`--max-sidecars`), each sidecar dialling a replica at
//!   random as a Service does and, refused (RESOURCE_EXHAUSTED), dialling
//!   again after a jittered wait: how long until every one is served, how
//!   many refusals that took, propagation p50/p99 at that size;
//! - against the previous build: with AIP_BENCH_BASELINE_OPERATOR naming an
//!   aip-operator binary of an earlier commit (`make bench` builds one,
//!   scripts/bench-baseline.sh), propagation at 1000 sidecars for both
//!   binaries in the same run, on the same control plane, alternating.
//!
//! Results go to target/bench/operator.json for scripts/bench-table.py.
//! AIP_BENCH_SIDECARS (default 1000), AIP_BENCH_ROUNDS (default 5),
//! AIP_BENCH_OBJECTS (default 10000) and AIP_BENCH_FLEET (default 10000;
//! 0 leaves the capacity stage out) scale it down for a quick look.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aip_kube_test::{ControlPlane, User};
use aip_proto::v1::config_client::ConfigClient;
use aip_proto::v1::{ReportRequest, WatchRequest};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

#[path = "../tests/common/kubectl.rs"]
mod kubectl;
#[path = "../tests/common/local.rs"]
mod local;

use kubectl::Kubectl;
use local::{TlsFiles, free_port};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let sidecars = env_usize("AIP_BENCH_SIDECARS", 1000);
    let rounds = env_usize("AIP_BENCH_ROUNDS", 5);
    let objects = env_usize("AIP_BENCH_OBJECTS", 10_000);
    let fleet = env_usize("AIP_BENCH_FLEET", 10_000);
    let baseline = std::env::var_os("AIP_BENCH_BASELINE_OPERATOR").map(PathBuf::from);
    let propagation = if sidecars == 0 {
        Value::Null
    } else {
        runtime.block_on(propagation(sidecars, rounds, baseline.as_deref()))
    };
    let capacity = if fleet == 0 {
        Value::Null
    } else {
        runtime.block_on(capacity(fleet, 2, fleet * 3 / 5, 3))
    };
    let memory = runtime.block_on(memory(objects));
    let out = json!({"propagation": propagation, "capacity": capacity, "memory": memory});
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("operator.json"),
        serde_json::to_string_pretty(&out).unwrap(),
    )
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}

struct Cluster {
    // Keeps the control plane up; dropping it stops it.
    plane: ControlPlane,
    admin: Client,
    /// Scratch files, under cargo's target/tmp; removed when this drops.
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(name: &str) -> Cluster {
        let plane = ControlPlane::start()
            .await
            .unwrap_or_else(|e| panic!("the control plane: {e}"));
        eprintln!(
            "{name}: {} {} ready in {:.1} s",
            plane.url(),
            plane.version(),
            plane.started_in().as_secs_f64()
        );
        let admin = plane.client(User::Admin).await;
        let dir = tempfile::Builder::new()
            .prefix(&format!("aip-bench-{name}-"))
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let cluster = Cluster { plane, admin, dir };
        let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/aip.io.yaml");
        cluster.kubectl().ok(&["apply", "-f", crds], None);
        cluster.namespace("aip-system").await;
        cluster
    }

    fn kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig_file(User::Admin)
    }

    fn kubectl(&self) -> Kubectl {
        Kubectl {
            kubeconfig: self.kubeconfig(),
            namespace: "agents".to_owned(),
        }
    }

    async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.admin.clone());
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    }

    async fn service_account(&self, ns: &str, name: &str) {
        let api: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    }

    /// Creates `names` pods in `ns` (50 at a time), as the injector leaves
    /// them (annotated: they run the gateway, so no NoSidecar report); their
    /// uids.
    async fn pods(&self, ns: &str, names: Vec<(String, Value)>) -> Vec<(String, String)> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        futures::stream::iter(names)
            .map(|(name, labels)| {
                let api = api.clone();
                async move {
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": name, "labels": labels,
                                     "annotations": {"aip.io/sidecar": "injected"}},
                        "spec": {"serviceAccountName": "agent", "containers": [{"name": "agent", "image": "agent"}]}}))
                    .unwrap();
                    let created = api.create(&PostParams::default(), &pod).await.unwrap();
                    (name, created.metadata.uid.unwrap())
                }
            })
            .buffer_unordered(50)
            .collect()
            .await
    }

    async fn token(&self, ns: &str, pod: &str, uid: &str) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        let request: TokenRequest = serde_json::from_value(json!({"spec": {
            "audiences": [aip_proto::TOKEN_AUDIENCE], "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}}}))
        .unwrap();
        let minted = api
            .create_token_request("agent", &PostParams::default(), &request)
            .await
            .unwrap();
        minted.status.unwrap().token.unwrap()
    }
}

/// The operator binary, killed on drop; its stderr lines collected.
struct Operator {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    cert_pem: String,
    grpc_port: u16,
    admin_port: u16,
}

impl Operator {
    fn start(cluster: &Cluster) -> Operator {
        Operator::start_as(
            cluster,
            Path::new(env!("CARGO_BIN_EXE_aip-operator")),
            "bench",
            &[],
        )
    }

    /// `binary` as replica `name`, with `extra` arguments.
    fn start_as(cluster: &Cluster, binary: &Path, name: &str, extra: &[&str]) -> Operator {
        // A certificate of its own: each replica reads its files again
        // every 10 s, and a second replica's must not replace the first's.
        let dir = cluster.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let tls = TlsFiles::new(&dir);
        let (grpc_port, admin_port) = (free_port(), free_port());
        let mut child = Command::new(binary)
            .env("KUBECONFIG", cluster.kubeconfig())
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc_port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .args(["--webhook-listen", "127.0.0.1:0", "--log-format", "json"])
            .args(["--namespace", "aip-system", "--pod-name", name])
            .arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Operator {
            child,
            lines,
            cert_pem: tls.cert_pem,
            grpc_port,
            admin_port,
        }
    }

    async fn said(&self, needle: &str, patience: Duration) {
        let deadline = Instant::now() + patience;
        while !self
            .lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
        {
            assert!(
                Instant::now() < deadline,
                "the operator never said {needle:?}:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Resident and peak resident memory (KiB) from /proc.
    fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    async fn metric(&self, name: &str) -> f64 {
        let body = http_get(self.admin_port, "/metrics").await;
        body.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Pushes the operator has made, from its own metrics.
    async fn pushes(&self) -> f64 {
        self.metric("aip_operator_config_pushes_total").await
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn policy(tools: &[String]) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: fleet, namespace: agents}}\nspec:\n  allowed_tools: {}\n  podSelector: {{matchLabels: {{app: agent}}}}\n",
        json!(tools)
    )
}

/// What one simulated sidecar has acked: the policy documents, and when.
type Acks = watch::Sender<Vec<(String, Instant)>>;

/// Pods with their sidecars' tokens, and the policy that governs them.
struct Fleet {
    cluster: Cluster,
    tokens: Vec<String>,
    /// The policy's tools so far: each change adds one.
    tools: Vec<String>,
}

impl Fleet {
    async fn new(name: &str, sidecars: usize) -> Fleet {
        let cluster = Cluster::start(name).await;
        cluster.namespace("agents").await;
        cluster.service_account("agents", "agent").await;
        let names = (0..sidecars)
            .map(|i| (format!("agent-{i}"), json!({"app": "agent"})))
            .collect();
        let pods = cluster.pods("agents", names).await;
        let mut tokens = Vec::new();
        for chunk in pods.chunks(50) {
            let minted = futures::future::join_all(
                chunk.iter().map(|(p, uid)| cluster.token("agents", p, uid)),
            )
            .await;
            tokens.extend(minted);
        }
        // kubectl's first applies to a fresh API server take seconds (2.2
        // s, 0.9 s, then about 0.2 s: it fills its discovery and OpenAPI
        // caches); those are not the operator's. The same document again
        // changes nothing.
        let tools = vec!["tool_0".to_owned()];
        for _ in 0..3 {
            cluster.kubectl().apply(&policy(&tools));
        }
        Fleet {
            cluster,
            tokens,
            tools,
        }
    }

    /// Every sidecar dials one of `replicas` at random (as a Service does)
    /// and retries refusals with jitter; once all are served, `rounds`
    /// policy changes, each timed from `kubectl apply` to every sidecar's
    /// ack. The sidecars are gone when this returns.
    async fn measure(&mut self, replicas: &[&Operator], rounds: usize) -> (Value, Vec<f64>) {
        let endpoints: Arc<Vec<Endpoint>> = Arc::new(
            replicas
                .iter()
                .map(|operator| {
                    Endpoint::from_shared(format!("https://127.0.0.1:{}", operator.grpc_port))
                        .unwrap()
                        .tls_config(
                            ClientTlsConfig::new()
                                .ca_certificate(Certificate::from_pem(&operator.cert_pem))
                                .domain_name("localhost"),
                        )
                        .unwrap()
                })
                .collect(),
        );
        let (acks_tx, mut acks) = watch::channel(0usize);
        let acks_tx = Arc::new(acks_tx);
        let refusals = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        // Handshakes at once, at most: a burst of thousands would only
        // time out at the operator and be dialled again.
        let dialling = Arc::new(tokio::sync::Semaphore::new(200));
        let mut recorders = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        let started = Instant::now();
        for token in &self.tokens {
            let (tx, rx): (Acks, _) = watch::channel(Vec::new());
            recorders.push(rx);
            tasks.spawn(simulated_sidecar(Sidecar {
                endpoints: endpoints.clone(),
                token: token.clone(),
                acks: tx,
                counter: acks_tx.clone(),
                refusals: refusals.clone(),
                failures: failures.clone(),
                dialling: dialling.clone(),
            }));
        }
        let current = format!("\"{}\"", self.tools.last().unwrap());
        let all_have = |needle: &str, recorders: &[watch::Receiver<Vec<(String, Instant)>>]| {
            recorders
                .iter()
                .all(|r| r.borrow().iter().any(|(doc, _)| doc.contains(needle)))
        };
        while !all_have(&current, &recorders) {
            let progress = tokio::time::timeout(Duration::from_secs(120), acks.changed()).await;
            if progress.is_err() {
                let served = recorders
                    .iter()
                    .filter(|r| r.borrow().iter().any(|(doc, _)| doc.contains(&current)))
                    .count();
                let mut replicas_said = Vec::new();
                for operator in replicas {
                    let mut said = Vec::new();
                    for metric in [
                        "aip_operator_grpc_connections",
                        "aip_operator_connected_sidecars",
                        "aip_operator_capacity_refusals_total",
                    ] {
                        said.push(format!("{metric} {}", operator.metric(metric).await));
                    }
                    replicas_said.push(said.join(", "));
                }
                let failed = failures.lock().unwrap();
                panic!(
                    "{served} of {} sidecars served after {:.0} s, {} refusals, {} other failures (the last: {:?}); replicas: {replicas_said:?}",
                    recorders.len(),
                    started.elapsed().as_secs_f64(),
                    refusals.load(Ordering::Relaxed),
                    failed.len(),
                    failed.iter().rev().take(5).collect::<Vec<_>>()
                );
            }
        }
        let served_s = started.elapsed().as_secs_f64();

        let mut latencies: Vec<f64> = Vec::new();
        // From kubectl's exit: what is the operator's (and the sidecars') own.
        let mut after_kubectl: Vec<f64> = Vec::new();
        let mut kubectl_ms: Vec<f64> = Vec::new();
        for _ in 0..rounds {
            let tool = format!("tool_{}", self.tools.len());
            self.tools.push(tool.clone());
            let text = policy(&self.tools);
            let start = Instant::now();
            let kubectl = self.cluster.kubectl();
            tokio::task::spawn_blocking(move || kubectl.apply(&text))
                .await
                .unwrap();
            let applied = Instant::now();
            kubectl_ms.push(applied.duration_since(start).as_secs_f64() * 1000.0);
            let needle = format!("\"{tool}\"");
            while !all_have(&needle, &recorders) {
                tokio::time::timeout(Duration::from_secs(60), acks.changed())
                    .await
                    .expect("every sidecar acks the change")
                    .unwrap();
            }
            for r in &recorders {
                let at = r
                    .borrow()
                    .iter()
                    .find(|(doc, _)| doc.contains(&needle))
                    .map(|(_, at)| *at)
                    .unwrap();
                latencies.push(at.duration_since(start).as_secs_f64() * 1000.0);
                // An ack can come before kubectl has exited: zero, then.
                after_kubectl.push(at.saturating_duration_since(applied).as_secs_f64() * 1000.0);
            }
        }
        tasks.shutdown().await;
        let pct = |samples: &mut Vec<f64>, p: f64| quantile(samples, p);
        let samples = latencies.clone();
        let mut l = latencies;
        let mut a = after_kubectl;
        let mut pushes = 0.0;
        let mut rss = 0;
        let mut peak = 0;
        for operator in replicas {
            pushes += operator.pushes().await;
            let (r, p) = operator.rss_kib();
            rss = rss.max(r);
            peak = peak.max(p);
        }
        let summary = json!({
            "pushes": pushes,
            "sidecars": self.tokens.len(), "rounds": rounds, "replicas": replicas.len(),
            "served_s": served_s, "refusals": refusals.load(Ordering::Relaxed),
            "other_failures": failures.lock().unwrap().len(),
            "p50_ms": pct(&mut l, 0.50), "p90_ms": pct(&mut l, 0.90),
            "p99_ms": pct(&mut l, 0.99), "max_ms": pct(&mut l, 1.0),
            "kubectl_p50_ms": pct(&mut kubectl_ms, 0.50),
            "after_kubectl_p50_ms": pct(&mut a, 0.50), "after_kubectl_p99_ms": pct(&mut a, 0.99),
            "operator_rss_kib": rss, "operator_peak_kib": peak,
        });
        (summary, samples)
    }
}

/// The `p` quantile of `samples` (sorted here).
fn quantile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(samples.len() - 1)]
}

/// Propagation to `sidecars` sidecars of one replica over `rounds`
/// changes; with `baseline` (an earlier build's aip-operator), both builds
/// on the same control plane, alternating three times (this, previous,
/// this, ...), each build's samples pooled, and the ratio of the pooled
/// p99s: one run's p99 moves by more than a tenth between runs of one
/// build on this machine (`kubectl apply`, inside every sample, most).
async fn propagation(sidecars: usize, rounds: usize, baseline: Option<&Path>) -> Value {
    let mut fleet = Fleet::new("propagation", sidecars).await;
    let current = Path::new(env!("CARGO_BIN_EXE_aip-operator"));
    let Some(baseline) = baseline else {
        let operator = Operator::start_as(&fleet.cluster, current, "bench", &[]);
        operator
            .said("cluster state loaded", Duration::from_secs(60))
            .await;
        return fleet.measure(&[&operator], rounds).await.0;
    };
    let mut this: (Vec<Value>, Vec<f64>) = (Vec::new(), Vec::new());
    let mut before: (Vec<Value>, Vec<f64>) = (Vec::new(), Vec::new());
    for i in 0..6 {
        let is_this = i % 2 == 0;
        let binary = if is_this { current } else { baseline };
        let operator = Operator::start_as(&fleet.cluster, binary, &format!("bench-{i}"), &[]);
        operator
            .said("cluster state loaded", Duration::from_secs(60))
            .await;
        let (summary, samples) = fleet.measure(&[&operator], rounds).await;
        eprintln!(
            "propagation, {} build: p99 {:.0} ms",
            if is_this { "this" } else { "the previous" },
            summary["p99_ms"].as_f64().unwrap_or(0.0)
        );
        let into = if is_this { &mut this } else { &mut before };
        into.0.push(summary);
        into.1.extend(samples);
        drop(operator);
    }
    let pooled = |runs: &mut (Vec<Value>, Vec<f64>)| {
        let mut first = runs.0[0].clone();
        first["p50_ms"] = json!(quantile(&mut runs.1, 0.50));
        first["p90_ms"] = json!(quantile(&mut runs.1, 0.90));
        first["p99_ms"] = json!(quantile(&mut runs.1, 0.99));
        first["max_ms"] = json!(quantile(&mut runs.1, 1.0));
        first["rounds"] = json!(runs.0.len() * rounds);
        first["runs_p99_ms"] = json!(
            runs.0
                .iter()
                .map(|v| v["p99_ms"].clone())
                .collect::<Vec<_>>()
        );
        first
    };
    let mut out = pooled(&mut this);
    let previous = pooled(&mut before);
    let ratio = out["p99_ms"].as_f64().unwrap_or(0.0) / previous["p99_ms"].as_f64().unwrap_or(1.0);
    out["baseline"] = previous;
    out["p99_over_baseline"] = json!(ratio);
    out
}

/// `sidecars` sidecars against `replicas` replicas capped at `cap` each:
/// how long until all are served, the refusals on the way, and
/// propagation at that size over `rounds` changes.
async fn capacity(sidecars: usize, replicas: usize, cap: usize, rounds: usize) -> Value {
    let mut fleet = Fleet::new("capacity", sidecars).await;
    let cap_arg = cap.to_string();
    let current = Path::new(env!("CARGO_BIN_EXE_aip-operator"));
    let operators: Vec<Operator> = (0..replicas)
        .map(|i| {
            Operator::start_as(
                &fleet.cluster,
                current,
                &format!("replica-{i}"),
                &["--max-sidecars", &cap_arg],
            )
        })
        .collect();
    for operator in &operators {
        operator
            .said("cluster state loaded", Duration::from_secs(120))
            .await;
    }
    let refs: Vec<&Operator> = operators.iter().collect();
    let (mut out, _) = fleet.measure(&refs, rounds).await;
    out["cap_per_replica"] = json!(cap);
    let mut served = Vec::new();
    for operator in &operators {
        served.push(
            operator
                .metric("aip_operator_capacity_refusals_total")
                .await,
        );
    }
    out["refusals_by_replica"] = json!(served);
    out
}

/// One simulated sidecar's world: where the Service leads, its token, and
/// where it records.
struct Sidecar {
    endpoints: Arc<Vec<Endpoint>>,
    token: String,
    acks: Acks,
    counter: Arc<watch::Sender<usize>>,
    refusals: Arc<AtomicUsize>,
    /// Other failed attempts, each once.
    failures: Arc<Mutex<Vec<String>>>,
    dialling: Arc<tokio::sync::Semaphore>,
}

/// Dials a replica at random until one serves it (a refusal, or a failed
/// dial, is tried again after a jittered wait that doubles up to 5 s, as
/// the sidecar does), then watches its pod's config and acks every
/// snapshot, recording when the ack completed for which policy document.
async fn simulated_sidecar(s: Sidecar) {
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {}", s.token).parse().unwrap();
    let mut wait = Duration::from_millis(200);
    let (mut client, mut stream) = loop {
        let endpoint = &s.endpoints[rand::random_range(0..s.endpoints.len())];
        let dialled = {
            let _turn = s.dialling.acquire().await.unwrap();
            endpoint.connect().await
        };
        let refused = match dialled {
            Ok(channel) => {
                let mut client = ConfigClient::new(channel);
                let mut request = tonic::Request::new(WatchRequest {
                    sidecar_version: "bench".to_owned(),
                    ..WatchRequest::default()
                });
                request
                    .metadata_mut()
                    .insert("authorization", bearer.clone());
                match client.watch(request).await {
                    Ok(stream) => break (client, stream.into_inner()),
                    Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                        s.refusals.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    // As the sidecar does: anything else (an operator still
                    // loading, a review that failed under load) is tried
                    // again too, and counted.
                    Err(e) => {
                        s.failures
                            .lock()
                            .unwrap()
                            .push(format!("{:?}: {}", e.code(), e.message()));
                        false
                    }
                }
            }
            Err(e) => {
                s.failures.lock().unwrap().push(format!("dial: {e}"));
                false
            }
        };
        let _ = refused;
        let jitter = wait.mul_f64(rand::random::<f64>() / 4.0);
        tokio::time::sleep(wait + jitter).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    };
    while let Ok(Some(snapshot)) = stream.message().await {
        let mut report = tonic::Request::new(ReportRequest {
            applied_version: snapshot.version,
            ..ReportRequest::default()
        });
        report
            .metadata_mut()
            .insert("authorization", bearer.clone());
        client.report(report).await.unwrap();
        let doc = snapshot.policy.map(|p| p.document_json).unwrap_or_default();
        s.acks.send_modify(|v| v.push((doc, Instant::now())));
        s.counter.send_modify(|n| *n += 1);
    }
}

async fn memory(objects: usize) -> Value {
    let cluster = Cluster::start("memory").await;
    let namespaces = (objects / 100).max(1);
    let per = objects / namespaces;
    for n in 0..namespaces {
        let ns = format!("team-{n}");
        cluster.namespace(&ns).await;
        cluster.service_account(&ns, "agent").await;
        let api: Api<aip_api::AgentPolicy> = Api::namespaced(cluster.admin.clone(), &ns);
        futures::stream::iter(0..per)
            .map(|i| {
                let api = api.clone();
                async move {
                    let p: aip_api::AgentPolicy = serde_json::from_value(json!({
                        "apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
                        "metadata": {"name": format!("agent-{i}")},
                        "spec": {"allowed_tools": ["read_file", "list_dir"],
                                 "tool_rules": [{"tool": "write_file", "action": "ask"}, {"tool": "fetch", "rate_limit": "10/minute", "allow_args": {"url": "^https://example\\.com/"}}],
                                 "podSelector": {"matchLabels": {"agent": format!("a{i}")}}}}))
                    .unwrap();
                    api.create(&PostParams::default(), &p).await.unwrap();
                }
            })
            .buffer_unordered(50)
            .collect::<Vec<()>>()
            .await;
        let names = (0..per)
            .map(|i| (format!("agent-{i}"), json!({"agent": format!("a{i}")})))
            .collect();
        cluster.pods(&ns, names).await;
    }
    let total = namespaces * per;
    let started = Instant::now();
    let operator = Operator::start(&cluster);
    operator
        .said("cluster state loaded", Duration::from_secs(300))
        .await;
    let loaded_after = started.elapsed();
    // Every policy's status written: the operator has done its work.
    let deadline = Instant::now() + Duration::from_secs(600);
    let all: Api<aip_api::AgentPolicy> = Api::all(cluster.admin.clone());
    loop {
        let listed = all.list(&Default::default()).await.unwrap();
        let written = listed
            .items
            .iter()
            .filter(|p| p.status.as_ref().is_some_and(|s| s.synced.is_some()))
            .count();
        if written >= total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "statuses not written in time ({written} of {total})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_after = started.elapsed();
    let (rss, peak) = operator.rss_kib();
    json!({
        "policies": total, "pods": total,
        "rss_kib": rss, "peak_kib": peak,
        "loaded_s": loaded_after.as_secs_f64(), "statuses_written_s": settled_after.as_secs_f64(),
    })
}

//! What the system costs on a real node (the test node of `aip-node`, as
//! `make bench` runs it: `aip-node run -- cargo bench --bench node`):
//!
//! - pod created → its injected sidecar Ready, and → its agent container
//!   running, p50/p99 over 20 pods (each created alone, times as this
//!   process observes them, polled every 20 ms);
//! - AgentPolicy applied → enforced in a running pod (the gateway's answer
//!   to the same call flips), p50/p99 over 20 changes;
//! - the example Job's wall time: `kubectl apply -k examples/cluster` →
//!   Job Complete, the held call approved as soon as it is pending;
//! - memory as the kubelet reports it (`/stats/summary`, working set):
//!   each sidecar container and each operator pod;
//! - the egress lock's cost, each measure paired with the same unlocked
//!   (`node/egress.rs`).
//!
//! Results go to target/bench/node.json and are printed as a table.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use aip_kube_test::User;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{Value, json};

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "node/egress.rs"]
mod egress;
#[path = "../tests/node/support.rs"]
mod support;

use support::*;

const PODS: usize = 20;
const CHANGES: usize = 20;
const POLL: Duration = Duration::from_millis(20);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cluster = cluster_alone().await;
    let story = Story::new(&cluster, "bench").await;
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");

    let (to_ready, to_agent) = pod_start(&story, &cluster).await;
    let enforced = policy_changes(&story).await;
    let job = example_job(&cluster).await;
    let (sidecars, operators) = memory(&cluster);
    let lock = egress::measure(&cluster).await;

    let report = json!({
        "pods": PODS,
        "pod_created_to_sidecar_ready_ms": percentiles(&to_ready),
        "pod_created_to_agent_running_ms": percentiles(&to_agent),
        "changes": CHANGES,
        "policy_applied_to_enforced_ms": percentiles(&enforced),
        "example_job_wall_s": job.as_secs_f64(),
        "sidecar_working_set_mib": sidecars,
        "operator_working_set_mib": operators,
        "egress_lock": lock,
    });
    let path = repo().join("target/bench/node.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!(
        "\nOn the node ({}), {}:",
        cluster.plane.version(),
        path.display()
    );
    let row = |what: &str, v: &Value, unit: &str| {
        println!(
            "  {what:<44} p50 {:>7.0} {unit}  p99 {:>7.0} {unit}",
            v["p50"].as_f64().unwrap(),
            v["p99"].as_f64().unwrap()
        );
    };
    row(
        "pod created -> sidecar Ready",
        &report["pod_created_to_sidecar_ready_ms"],
        "ms",
    );
    row(
        "pod created -> agent container running",
        &report["pod_created_to_agent_running_ms"],
        "ms",
    );
    row(
        "AgentPolicy applied -> enforced in the pod",
        &report["policy_applied_to_enforced_ms"],
        "ms",
    );
    println!(
        "  {:<44} {:.1} s",
        "examples/cluster: apply -> Job Complete",
        job.as_secs_f64()
    );
    println!(
        "  {:<44} {}",
        "sidecar container working set (MiB)", report["sidecar_working_set_mib"]
    );
    println!(
        "  {:<44} {}",
        "operator pod working set (MiB)", report["operator_working_set_mib"]
    );
    let lock = &report["egress_lock"];
    let call = &lock["governed_call_p50_us"];
    println!(
        "  {:<44} locked {:.0} µs, unlocked {:.0} µs: ratio {:.3} (median of {} rounds)",
        "governed call through the gateway, p50",
        call["locked"].as_f64().unwrap(),
        call["unlocked"].as_f64().unwrap(),
        call["ratio"].as_f64().unwrap(),
        call["rounds"]
    );
    for (what, key) in [
        (
            "pod created -> agent running",
            "pod_created_to_agent_running_ms",
        ),
        (
            "aip-cni ADD (the plugin's work per sandbox)",
            "plugin_add_ms",
        ),
    ] {
        println!(
            "  {what:<44} locked p50 {:.0} ms p99 {:.0} ms; unlocked p50 {:.0} ms p99 {:.0} ms",
            lock[key]["locked"]["p50"].as_f64().unwrap(),
            lock[key]["locked"]["p99"].as_f64().unwrap(),
            lock[key]["unlocked"]["p50"].as_f64().unwrap(),
            lock[key]["unlocked"]["p99"].as_f64().unwrap(),
        );
    }
}

/// p50 and p99 (nearest rank) of `samples`, in milliseconds.
fn percentiles(samples: &[Duration]) -> Value {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    json!({"p50": rank(0.50), "p99": rank(0.99), "n": ms.len(), "samples": ms})
}

async fn pod_start(story: &Story, cluster: &common::Cluster) -> (Vec<Duration>, Vec<Duration>) {
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &story.namespace);
    let (mut ready, mut running) = (Vec::new(), Vec::new());
    for i in 0..PODS {
        let name = format!("start-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "agent", "image": PAUSE}]}
        }))
        .unwrap();
        let created = Instant::now();
        pods.create(&Default::default(), &pod).await.unwrap();
        let (mut sidecar, mut agent) = (None, None);
        while sidecar.is_none() || agent.is_none() {
            assert!(created.elapsed() < POD_PATIENCE, "pod {name} did not start");
            let status = pods.get(&name).await.unwrap().status.unwrap_or_default();
            let sidecar_ready = status
                .init_container_statuses
                .as_deref()
                .and_then(|s| s.first())
                .is_some_and(|s| s.ready);
            let agent_running = status
                .container_statuses
                .as_deref()
                .and_then(|s| s.first())
                .and_then(|s| s.state.as_ref())
                .is_some_and(|s| s.running.is_some());
            if sidecar_ready && sidecar.is_none() {
                sidecar = Some(created.elapsed());
            }
            if agent_running && agent.is_none() {
                agent = Some(created.elapsed());
            }
            tokio::time::sleep(POLL).await;
        }
        ready.push(sidecar.unwrap());
        running.push(agent.unwrap());
        pods.delete(&name, &Default::default()).await.unwrap();
    }
    (ready, running)
}

async fn policy_changes(story: &Story) -> Vec<Duration> {
    story.agent_pod("agent-1");
    let (forward, agent) = story.agent_session("agent-1", "fs_read_file").await;
    let mut samples = Vec::new();
    for i in 0..CHANGES {
        let allow = i % 2 == 0;
        let tools: &[&str] = if allow {
            &["fs_read_file", "fs_delete_file"]
        } else {
            &["fs_read_file"]
        };
        let applied = Instant::now();
        story.policy(tools, "");
        loop {
            let mut agent = common::agent::Agent::resume(forward.addr, &agent.session);
            let answer = agent.call("fs_delete_file", json!({"path": "/old"})).await;
            if answer.get("result").is_some() == allow {
                break;
            }
            assert!(
                applied.elapsed() < Duration::from_secs(60),
                "change {i} never enforced"
            );
            tokio::time::sleep(POLL).await;
        }
        samples.push(applied.elapsed());
    }
    samples
}

async fn example_job(cluster: &common::Cluster) -> Duration {
    let admin = cluster.kubectl(User::Admin, "agents");
    let alice = cluster.kubectl(User::Alice, "agents");
    let example = repo().join("examples/cluster");
    let started = Instant::now();
    admin.ok(&["apply", "-k", example.to_str().unwrap()], None);
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");
    let request = pending_request(&alice, POD_PATIENCE).await;
    let (ok, out, err) = alice.aip(&["approve", &request, "-n", "agents"]);
    assert!(ok, "{out}{err}");
    wait_for(&admin, "job/agent", "condition=Complete", POD_PATIENCE);
    started.elapsed()
}

/// Working sets in MiB from the kubelet's summary: every aip-sidecar
/// container, every operator pod.
fn memory(cluster: &common::Cluster) -> (Vec<f64>, Vec<f64>) {
    let admin = cluster.kubectl(User::Admin, "default");
    let summary: Value = serde_json::from_str(&admin.ok(
        &["get", "--raw", "/api/v1/nodes/aip-node/proxy/stats/summary"],
        None,
    ))
    .unwrap();
    let mib = |v: &Value| {
        (v["memory"]["workingSetBytes"].as_f64().unwrap_or(0.0) / 1048576.0 * 10.0).round() / 10.0
    };
    let (mut sidecars, mut operators) = (Vec::new(), Vec::new());
    for pod in summary["pods"].as_array().into_iter().flatten() {
        // The operator's own pods (the chart's aip-cni DaemonSet runs
        // beside them, and is not the operator).
        let name = pod["podRef"]["name"].as_str().unwrap_or_default();
        if pod["podRef"]["namespace"] == OPERATOR_NAMESPACE && name.starts_with("aip-operator-") {
            operators.push(mib(pod));
        }
        for container in pod["containers"].as_array().into_iter().flatten() {
            if container["name"] == "aip-sidecar" {
                sidecars.push(mib(container));
            }
        }
    }
    (sidecars, operators)
}

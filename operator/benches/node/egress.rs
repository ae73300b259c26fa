//! What the egress lock costs, on the test node, each locked measure paired
//! with the same measure unlocked in one run (alternating, so that drift
//! falls on both):
//!
//! - a governed call through the gateway, made from inside the agent's
//!   container (`aip-probe mcp-bench`: one session, 200 calls, p50), a
//!   locked pod and an unlocked one in turn, 5 rounds;
//! - pod created → agent container running, a locked pod and an unlocked
//!   one in turn (the lock adds the plugin's work at sandbox creation and
//!   the pod's proof, `aip-lock-check`);
//! - the plugin's own work per sandbox: the installed `aip-cni` run as the
//!   runtime runs it (ADD, the pod looked up in the API server), for a
//!   locked pod (rules programmed into a fresh network namespace) and an
//!   unlocked one (lookup only).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{Value, json};

use super::support::*;
use super::{POLL, common, percentiles};

const ROUNDS: usize = 5;
const CALLS: usize = 200;
const PODS: usize = 10;
const INVOCATIONS: usize = 20;
const PROBE: &str = "localhost/aip-node/aip-probe:1.0";

/// The tool server answering every call, for as many calls as asked.
const SCRIPT: &str = "apiVersion: aip.io/v1alpha1
kind: FaultServer
metadata: {name: files}
spec:
  requireBearer: {sha256: SHA}
  tools:
    - name: read_file
      description: Read a file.
      inputSchema: {type: object, properties: {path: {type: string}}, required: [path]}
      responses: [{repeat: true, sequence: [{return: \"Q3: revenue up 12%\"}]}]
";

async fn namespace(cluster: &common::Cluster, prefix: &str, locked: bool) -> Story {
    use sha2::Digest;
    let story = Story::new(cluster, prefix).await;
    let sha = hex::encode(sha2::Sha256::digest(b"tok-lock"));
    story.tools_scripted(&SCRIPT.replace("SHA", &sha), "tok-lock", "");
    story.policy(&["fs_read_file"], "");
    if locked {
        story.admin.apply(&format!(
            "apiVersion: aip.io/v1alpha1\nkind: EgressLock\nmetadata: {{name: default, namespace: {}}}\nspec: {{allow: []}}\n",
            story.namespace
        ));
    }
    story
}

fn agent_spec(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "agent"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [{"name": "agent", "image": PROBE, "args": ["idle"],
                "securityContext": {"allowPrivilegeEscalation": false}}]
        }
    }))
    .unwrap()
}

/// Creates pod `name` and waits for its agent container to run: how long
/// that took.
async fn start(story: &Story, cluster: &common::Cluster, name: &str) -> Duration {
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &story.namespace);
    let created = Instant::now();
    pods.create(&Default::default(), &agent_spec(name))
        .await
        .unwrap();
    loop {
        assert!(created.elapsed() < POD_PATIENCE, "pod {name} did not start");
        let status = pods.get(name).await.unwrap().status.unwrap_or_default();
        let running = status
            .container_statuses
            .as_deref()
            .and_then(|s| s.first())
            .and_then(|s| s.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        if running {
            return created.elapsed();
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `aip-probe mcp-bench` in pod `name`'s agent container: the p50 in µs.
fn call_p50(story: &Story, name: &str) -> f64 {
    let calls = CALLS.to_string();
    let out = story.admin.ok(
        &[
            "exec",
            name,
            "-n",
            &story.namespace,
            "-c",
            "agent",
            "--",
            "/usr/local/bin/aip-probe",
            "mcp-bench",
            "http://127.0.0.1:15001/mcp",
            "fs_read_file",
            &calls,
        ],
        None,
    );
    let said: Value = serde_json::from_str(out.trim()).unwrap();
    said["p50_us"].as_f64().unwrap()
}

/// The installed plugin's ADD for pod `namespace/name` into a fresh network
/// namespace, as the runtime runs it: how long it took, and whether it
/// succeeded.
fn plugin_add(namespace: &str, name: &str) -> Duration {
    let node = std::path::PathBuf::from(std::env::var_os(aip_kube_test::node::ENV).unwrap());
    let bin = node.join(aip_kube_test::node::CNI_BIN).join("aip-cni");
    let kubeconfig = node
        .join(aip_kube_test::node::CNI_CONF)
        .join("aip-cni.d/kubeconfig");
    // It says so once it is in its namespace, then becomes `cat`.
    let mut holder = Command::new("unshare")
        .args(["--net", "sh", "-c", "echo ready; exec cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "ready");
    let netns = format!("/proc/{}/ns/net", holder.id());
    let config = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "aip-cni",
        "kubeconfig": kubeconfig,
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]}
    });
    let started = Instant::now();
    let mut plugin = Command::new(&bin)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "bench")
        .env("CNI_NETNS", &netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin.parent().unwrap())
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    plugin
        .stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let out = plugin.wait_with_output().unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "aip-cni ADD: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = holder.kill();
    let _ = holder.wait();
    took
}

/// Every measure, as the report's `egress_lock` object.
pub async fn measure(cluster: &common::Cluster) -> Value {
    let locked = namespace(cluster, "bench-locked", true).await;
    let open = namespace(cluster, "bench-open", false).await;

    let (mut start_locked, mut start_open) = (Vec::new(), Vec::new());
    for i in 0..PODS {
        for (story, samples) in [(&open, &mut start_open), (&locked, &mut start_locked)] {
            let name = format!("start-{i}");
            samples.push(start(story, cluster, &name).await);
            story.admin.ok(
                &[
                    "delete",
                    "pod",
                    &name,
                    "-n",
                    &story.namespace,
                    "--wait=false",
                ],
                None,
            );
        }
    }

    for story in [&open, &locked] {
        start(story, cluster, "caller").await;
        // The gateway lists the tool once its connection is up.
        story.agent_session("caller", "fs_read_file").await;
    }
    let (mut call_locked, mut call_open) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        call_open.push(call_p50(&open, "caller"));
        call_locked.push(call_p50(&locked, "caller"));
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };

    let (mut add_locked, mut add_open) = (Vec::new(), Vec::new());
    for _ in 0..INVOCATIONS {
        add_open.push(plugin_add(&open.namespace, "caller"));
        add_locked.push(plugin_add(&locked.namespace, "caller"));
    }
    json!({
        "governed_call_p50_us": {
            "locked": median(&call_locked),
            "unlocked": median(&call_open),
            "ratio": median(&call_locked) / median(&call_open),
            "rounds": ROUNDS, "calls_per_round": CALLS,
            "locked_rounds": call_locked, "unlocked_rounds": call_open,
        },
        "pod_created_to_agent_running_ms": {
            "locked": percentiles(&start_locked),
            "unlocked": percentiles(&start_open),
        },
        "plugin_add_ms": {
            "locked": percentiles(&add_locked),
            "unlocked": percentiles(&add_open),
        },
    })
}

//! Failures on a real node: the sidecar container killed under a running
//! agent pod.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::agent::Agent;
use crate::support::*;

/// The kubelet restarts a killed sidecar container; calls made while it is
/// down fail and none reaches the tool server; the restarted gateway
/// enforces the same policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sidecar_is_restarted_and_nothing_passes_unenforced_meanwhile() {
    let cluster = cluster().await;
    let story = Story::new(&cluster, "sidecar-kill").await;
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");
    story.agent_pod("agent-1");
    let (forward, mut agent) = story.agent_session("agent-1", "fs_read_file").await;
    reads(&mut agent).await;

    let pod = story.pod_json("agent-1");
    let id = pod["status"]["initContainerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("no sidecar container id: {pod}"))
        .to_owned();
    kill_container(&id);

    drop(forward);
    // Until the kubelet has it back, the agent's calls meet no gateway.
    // (kubectl port-forward ends at the first connection the pod refuses:
    // a new one for each try.)
    let mut refused = 0;
    while story.sidecar_restarts("agent-1") == 0 {
        let forward = Forward::to(&story.admin, "agent-1", 15001);
        if raw_call(forward.addr, "fs_delete_file").await.is_none() {
            refused += 1;
        }
    }
    wait_for(&story.admin, "pod/agent-1", "condition=Ready", POD_PATIENCE);
    let forward = Forward::to(&story.admin, "agent-1", 15001);
    let mut agent = Agent::connect(forward.addr).await;
    reads(&mut agent).await;
    let blocked = agent.call("fs_delete_file", json!({"path": "/old"})).await;
    assert_eq!(blocked["error"]["code"], -32001, "{blocked}");
    assert!(
        story.upstream_calls("delete_file").is_empty(),
        "a delete reached the tool server ({refused} calls were made in the gap)"
    );
    let pod = story.pod_json("agent-1");
    assert_eq!(
        pod["status"]["initContainerStatuses"][0]["restartCount"], 1,
        "{pod}"
    );
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{pod}"
    );
}

/// SIGKILL to a container's task, as an OOM kill or a crash would end it.
fn kill_container(id: &str) {
    let node = aip_kube_test::node::NodeInfo::read(std::path::Path::new(
        &std::env::var_os(aip_kube_test::node::ENV).unwrap(),
    ))
    .unwrap();
    let out = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&node.containerd_socket)
        .args(["-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr tasks kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A session-less tools/call on a fresh connection; the response, if any
/// came.
async fn raw_call(addr: std::net::SocketAddr, tool: &str) -> Option<String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": {"path": "/old"}}})
    .to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    stream.write_all(body.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    (!raw.is_empty()).then(|| String::from_utf8_lossy(&raw).into_owned())
}

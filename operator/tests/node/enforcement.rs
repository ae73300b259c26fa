//! A running pod's gateway follows the cluster: a changed AgentPolicy is
//! enforced by the sidecar already running in the pod, and a rotated
//! Secret is the credential its next call upstream carries, neither with a
//! restart.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::agent::Agent;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_policy_is_enforced_by_the_running_pod() {
    let cluster = cluster().await;
    let story = Story::new(&cluster, "policy-change").await;
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");
    story.agent_pod("agent-1");
    let (forward, mut agent) = story.agent_session("agent-1", "fs_read_file").await;

    reads(&mut agent).await;
    let refused = agent.call("fs_delete_file", json!({"path": "/old"})).await;
    assert_eq!(refused["error"]["code"], -32001, "{refused}");

    // The policy now allows the delete: the same session, the same pod.
    let applied = Instant::now();
    story.policy(&["fs_read_file", "fs_delete_file"], "");
    let enforced = until_allowed(&forward, &agent, "fs_delete_file", Duration::from_secs(60)).await;
    let took = applied.elapsed();
    assert_eq!(
        enforced["result"]["content"][0]["text"], "deleted",
        "{enforced}"
    );
    eprintln!(
        "node-measure: AgentPolicy applied -> enforced in the running pod: {} ms",
        took.as_millis()
    );
    assert_eq!(story.upstream_calls("delete_file").len(), 1);

    assert_eq!(story.sidecar_restarts("agent-1"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_is_the_credential_of_the_next_call_without_a_restart() {
    use sha2::Digest;
    let cluster = cluster().await;
    let story = Story::new(&cluster, "rotation").await;
    // The server takes only the new token; the Secret still has the old.
    story.tools("tok-new", "tok-old");
    story.policy(&["fs_read_file"], "");
    story.agent_pod("agent-1");
    let forward = Forward::to(&story.admin, "agent-1", 15001);
    let mut agent = Agent::connect(forward.addr).await;
    let refused = agent.call("fs_read_file", json!({"path": "/q3"})).await;
    assert!(
        refused.get("result").is_none_or(|r| r["isError"] == true),
        "{refused}"
    );
    assert!(story.upstream_calls("read_file").is_empty());

    story.admin.ok(
        &[
            "patch",
            "secret",
            "fs-token",
            "-n",
            &story.namespace,
            "--type=merge",
            "-p",
            r#"{"stringData":{"token":"tok-new"}}"#,
        ],
        None,
    );
    let read = eventually(
        "a call with the rotated token",
        Duration::from_secs(60),
        || {
            let mut agent = Agent::resume(forward.addr, &agent.session);
            async move {
                let answer = agent.call("fs_read_file", json!({"path": "/q3"})).await;
                (answer["result"]["content"][0]["text"] == "Q3: revenue up 12%").then_some(answer)
            }
        },
    )
    .await;
    assert_ne!(read["result"]["isError"], true, "{read}");
    let calls = story.upstream_calls("read_file");
    // The whole Authorization header, hashed.
    let new = hex::encode(sha2::Sha256::digest(b"Bearer tok-new"));
    assert!(!calls.is_empty());
    for call in &calls {
        assert_eq!(call["auth_sha256"], new, "{call}");
    }
    assert_eq!(story.sidecar_restarts("agent-1"), 0);
}

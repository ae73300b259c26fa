//! What reaches the agent outside a plain request/response: progress while
//! an ask waits (on the call's own SSE stream), the session's GET stream
//! with `notifications/tools/list_changed`, and the transport rules around
//! both.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{PATIENCE, Setup, Sse, Stack, raw};
use serde_json::{Value, json};

const TOOLS: &str = "  tools:
    - name: read
      responses: [{sequence: [{return: one}, {return: two}]}]
    - name: deploy
      responses: [{sequence: [{return: deployed}]}]
";

const POLICY: &str = "  allowed_tools: [up_read]
  tool_rules:
    - {tool: up_deploy, action: ask}
";

async fn stack() -> Stack {
    Stack::start(Setup {
        faults: TOOLS,
        policy: POLICY,
        ask_progress_interval: Duration::from_millis(50),
        ..Setup::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_ask_sends_progress_then_the_approved_result() {
    let s = stack().await;
    let session = s.session().await;
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "up_deploy", "arguments": {}, "_meta": {"progressToken": "tok-1"}}});
    let mut stream = s.stream(&session, &call).await;
    let mut last = 0.0;
    for _ in 0..2 {
        let note = stream.next().await.unwrap();
        assert_eq!(note["method"], "notifications/progress", "{note}");
        assert_eq!(note["params"]["progressToken"], "tok-1");
        assert!(
            note["params"]["message"]
                .as_str()
                .unwrap()
                .contains("approval")
        );
        let progress = note["params"]["progress"].as_f64().unwrap();
        assert!(progress > last, "progress increases: {note}");
        last = progress;
    }
    assert!(
        s.attempts().is_empty(),
        "nothing is forwarded while it waits"
    );
    let pending = s.gateway.approvals.list();
    s.gateway.approvals.decide(&pending[0].id, true).unwrap();
    let response = loop {
        let message = stream.next().await.unwrap();
        if message.get("method").is_none() {
            break message;
        }
    };
    assert_eq!(response["id"], 5);
    assert_eq!(response["result"]["content"][0]["text"], "deployed");
    assert!(stream.next().await.is_none(), "the stream ends");
    assert_eq!(s.attempts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_progress_token_or_sse_the_answer_is_plain_json() {
    let s = stack().await;
    let session = s.session().await;
    // A client that accepts SSE, with nothing to say before the response.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "up_read", "arguments": {}}});
    let plain = Sse::open(
        s.addr,
        "POST",
        &[("mcp-session-id", &session)],
        &call.to_string(),
    )
    .await;
    assert_eq!(plain.content_type, "application/json");
    let body: Value = serde_json::from_str(&plain.text().await).unwrap();
    assert_eq!(body["result"]["content"][0]["text"], "one");
    // A JSON-only client asking for progress still gets one JSON answer.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "up_read", "arguments": {}, "_meta": {"progressToken": 1}}});
    let r = raw(
        s.addr,
        "POST",
        &[("mcp-session-id", &session), ("accept", "application/json")],
        &call.to_string(),
    )
    .await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["result"]["content"][0]["text"], "two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_get_stream_announces_tool_list_changes() {
    let s = stack().await;
    let session = s.session().await;
    let h = [("mcp-session-id", session.as_str())];
    let mut stream = Sse::open(s.addr, "GET", &h, "").await;
    assert_eq!(stream.status, 200);
    assert_eq!(stream.content_type, "text/event-stream");
    let second = Sse::open(s.addr, "GET", &h, "").await;
    assert_eq!(second.status, 409, "one stream per session");
    let json_only = raw(
        s.addr,
        "GET",
        &[("mcp-session-id", &session), ("accept", "application/json")],
        "",
    )
    .await;
    assert_eq!(json_only.status, 406);
    let unknown = raw(s.addr, "GET", &[("mcp-session-id", "nope")], "").await;
    assert_eq!(unknown.status, 404);

    // A new policy hides a tool the agent could see.
    s.reload(&s.config_text.replace("[up_read]", "[]")).await;
    let note = stream.next().await.unwrap();
    assert_eq!(
        note,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    );
    let list = s.request(&session, json!(3), "tools/list").await;
    let names: Vec<&Value> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["name"])
        .collect();
    assert_eq!(names, vec![&json!("up_deploy")]);

    // Ending the session ends its stream (after any announcement still
    // queued: the connection's first health check may have been announced
    // late).
    let deleted = raw(s.addr, "DELETE", &h, "").await;
    assert_eq!(deleted.status, 204);
    while let Some(note) = tokio::time::timeout(PATIENCE, stream.next()).await.unwrap() {
        assert_eq!(note["method"], "notifications/tools/list_changed");
    }
}

/// A reply is accepted (202) even when nothing waits for it: the agent is
/// told nothing it could take for an error of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_no_relayed_request_is_accepted_and_dropped() {
    let s = stack().await;
    let session = s.session().await;
    let reply = json!({"jsonrpc": "2.0", "id": "aip-s-1", "result": {"role": "assistant"}});
    let r = s
        .post(&[("mcp-session-id", &session)], &reply.to_string())
        .await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty(), "{r:?}");
}

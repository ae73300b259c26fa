//! The agent endpoint in MCP 2026-07-28: a modern request's mirrored
//! headers and `_meta` checked before anything acts on them, with the
//! revision's statuses and codes; and approvals answered as tasks for an
//! agent that declares the tasks extension — the call returns a task at
//! once, the person's approval runs it exactly once and completes the task,
//! a denial fails it, another agent cannot read it, and it can be
//! cancelled. (The official conformance suite covers the rest of the
//! revision, `make mcp-conformance`.)

#![allow(clippy::unwrap_used)]

mod common;

use common::{PATIENCE, RawResponse, Setup, Stack};
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

fn meta(agent: &str, tasks: bool) -> Value {
    let mut capabilities = json!({});
    if tasks {
        capabilities["extensions"] = json!({TASKS: {}});
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": agent, "version": "1"},
    })
}

/// A modern request with its mirrored headers, as a conforming client
/// sends it; `agent` is its clientInfo name.
async fn modern(
    s: &Stack,
    agent: &str,
    tasks: bool,
    method: &str,
    mut params: Value,
) -> RawResponse {
    params["_meta"] = meta(agent, tasks);
    let name = ["name", "uri", "taskId"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str))
        .map(str::to_owned);
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let mut headers = vec![
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    s.post(&headers, &body.to_string()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_requests_are_checked_before_anything_reads_them() {
    let s = Stack::start(Setup {
        faults: "  tools: [{name: echo, responses: [{sequence: [{return: hi}]}]}]\n",
        policy: "  allowed_tools: [up_echo]\n",
        ..Setup::default()
    })
    .await;
    let call = |meta: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "up_echo", "arguments": {}, "_meta": meta}})
        .to_string()
    };
    let good = meta("a", false);
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "up_echo"),
    ];
    let refused = |r: &RawResponse, status: u16, code: i64| {
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(r.json()["error"]["code"], code, "{r:?}");
        assert_eq!(r.json()["id"], 3, "the request's id: {r:?}");
    };
    let ok = s.post(&headers, &call(good.clone())).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["result"]["resultType"], "complete");
    assert_eq!(
        ok.json()["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "aip-sidecar"
    );

    let mut no_caps = good.clone();
    no_caps
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    refused(&s.post(&headers, &call(no_caps)).await, 400, -32602);
    let other_name = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "up_other"),
    ];
    refused(&s.post(&other_name, &call(good.clone())).await, 400, -32020);
    let no_name = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
    ];
    refused(&s.post(&no_name, &call(good.clone())).await, 400, -32020);
    let mut future = good.clone();
    future["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let future_headers = [
        ("mcp-protocol-version", "2099-01-01"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "up_echo"),
    ];
    let r = s.post(&future_headers, &call(future)).await;
    refused(&r, 400, -32022);
    assert_eq!(
        r.json()["error"]["data"],
        json!({"supported": ["2026-07-28"], "requested": "2099-01-01"})
    );
    // A modern header on a body that claims no era is not served as legacy.
    let legacy_body =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "up_echo"}});
    refused(
        &s.post(&headers, &legacy_body.to_string()).await,
        400,
        -32602,
    );
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"_meta": good}});
    let ping_headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "ping"),
    ];
    refused(&s.post(&ping_headers, &ping.to_string()).await, 404, -32601);
    // Nothing refused reached the server.
    assert_eq!(s.attempts().len(), 1, "{:?}", s.attempts());
}

const ASKING: &str =
    "  allowed_tools: [up_deploy]\n  tool_rules: [{tool: up_deploy, action: ask}]\n";
const DEPLOY: &str =
    "  tools: [{name: deploy, responses: [{sequence: [{return: deployed}, {return: again}]}]}]\n";

/// The id of the ask waiting for a person, once there is one.
async fn pending(s: &Stack) -> String {
    let mut changes = s.gateway.approvals.subscribe();
    loop {
        if let Some(p) = s.gateway.approvals.list().first() {
            return p.id.clone();
        }
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
}

/// Polls `tasks/get` (as the extension has agents do) until the task ends.
async fn ended(s: &Stack, agent: &str, task: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = modern(s, agent, true, "tasks/get", json!({"taskId": task})).await;
        assert_eq!(r.status, 200, "{r:?}");
        let view = r.json()["result"].clone();
        assert_eq!(view["resultType"], "complete");
        if view["status"] != "working" {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task never ended: {view}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_a_task_for_an_agent_that_declares_tasks() {
    let s = Stack::start(Setup {
        faults: DEPLOY,
        policy: ASKING,
        ..Setup::default()
    })
    .await;
    let discover = modern(&s, "a", true, "server/discover", json!({})).await;
    assert_eq!(
        discover.json()["result"]["capabilities"]["extensions"][TASKS],
        json!({}),
        "{discover:?}"
    );

    // The call returns at once with a task; the ask waits for a person.
    let created = modern(
        &s,
        "a",
        true,
        "tools/call",
        json!({"name": "up_deploy", "arguments": {}}),
    )
    .await;
    assert_eq!(created.status, 200, "{created:?}");
    let task = created.json()["result"].clone();
    assert_eq!(task["resultType"], "task", "{task}");
    assert_eq!(task["status"], "working");
    let id = task["taskId"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "128 random bits");
    let ask = pending(&s).await;
    assert!(
        s.attempts().is_empty(),
        "nothing is sent while the ask waits"
    );
    let still = modern(&s, "a", true, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(still.json()["result"]["status"], "working");

    // Another agent cannot read it; an agent without the extension is told
    // what it lacks.
    let other = modern(&s, "b", true, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(other.json()["error"]["code"], -32602, "{other:?}");
    let undeclared = modern(&s, "a", false, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(
        (
            undeclared.status,
            undeclared.json()["error"]["code"].clone()
        ),
        (400, json!(-32021))
    );

    // Approved: the call runs once, and the task completes with its result.
    s.gateway.approvals.decide(&ask, true).unwrap();
    let done = ended(&s, "a", &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "deployed", "{done}");
    assert_eq!(s.attempts().len(), 1, "exactly one upstream call");
    let again = ended(&s, "a", &id).await;
    assert_eq!(again, done, "reading it again runs nothing");
    assert_eq!(s.attempts().len(), 1);

    // Denied: the task fails with the AIP error; nothing is sent.
    let created = modern(
        &s,
        "a",
        true,
        "tools/call",
        json!({"name": "up_deploy", "arguments": {}}),
    )
    .await;
    let id = created.json()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    s.gateway
        .approvals
        .decide(&pending(&s).await, false)
        .unwrap();
    let denied = ended(&s, "a", &id).await;
    assert_eq!(denied["status"], "failed", "{denied}");
    assert_eq!(denied["error"]["code"], -32004, "{denied}");
    assert_eq!(s.attempts().len(), 1);

    // Cancelled: the ask is withdrawn.
    let created = modern(
        &s,
        "a",
        true,
        "tools/call",
        json!({"name": "up_deploy", "arguments": {}}),
    )
    .await;
    let id = created.json()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    pending(&s).await;
    let cancel = modern(&s, "a", true, "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(
        cancel.json()["result"]["resultType"],
        "complete",
        "{cancel:?}"
    );
    assert_eq!(ended(&s, "a", &id).await["status"], "cancelled");
    let mut changes = s.gateway.approvals.subscribe();
    while !s.gateway.approvals.list().is_empty() {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(s.attempts().len(), 1, "a cancelled task sends nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_the_extension_keeps_the_held_call() {
    let s = Stack::start(Setup {
        faults: DEPLOY,
        policy: ASKING,
        ..Setup::default()
    })
    .await;
    let addr = s.addr;
    let call = tokio::spawn(async move {
        let s = common::raw;
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "up_deploy", "arguments": {}, "_meta": meta("a", false)}});
        let headers = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "up_deploy"),
        ];
        s(addr, "POST", &headers, &body.to_string()).await
    });
    s.gateway
        .approvals
        .decide(&pending(&s).await, true)
        .unwrap();
    let answered = call.await.unwrap();
    assert_eq!(
        answered.json()["result"]["content"][0]["text"],
        "deployed",
        "{answered:?}"
    );
    assert_eq!(s.attempts().len(), 1);
}

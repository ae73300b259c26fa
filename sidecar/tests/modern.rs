//! The agent endpoint in MCP 2026-07-28: a modern request's mirrored
//! headers and `_meta` checked before anything acts on them, with the
//! revision's statuses and codes; and approvals answered as tasks for an
//! agent that declares the tasks extension — the call returns a task at
//! once, the person's approval runs it exactly once and completes the task,
//! a denial fails it, another agent cannot read it, and it can be
//! cancelled; and a server's own tasks relayed under gateway ids. (The
//! official conformance suite covers the rest of the revision, `make
//! mcp-conformance`.)

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{PATIENCE, RawResponse, Setup, Stack, TASKS, meta, modern, modern_with};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

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

/// A task id is the only thing that lets its agent read the task: a
/// refusal for an `Mcp-Name` that disagrees with the body is audited
/// without either value (the header's, the body's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_task_request_audits_no_task_id() {
    let s = Stack::start(Setup::default()).await;
    let (in_body, in_header) = (
        "0123456789abcdef0123456789abcdef",
        "fedcba9876543210fedcba9876543210",
    );
    for method in ["tasks/get", "tasks/cancel"] {
        let body = json!({"jsonrpc": "2.0", "id": 3, "method": method,
            "params": {"taskId": in_body, "_meta": meta("a", true)}});
        let headers = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
            ("mcp-name", in_header),
        ];
        let r = s.post(&headers, &body.to_string()).await;
        assert_eq!(r.json()["error"]["code"], -32020, "{r:?}");
    }
    let refusals: Vec<Value> = s
        .audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "MALFORMED_MESSAGE")
        .collect();
    assert_eq!(refusals.len(), 2, "each refusal is audited: {refusals:?}");
    for line in refusals {
        let text = line.to_string();
        assert!(
            !text.contains(in_body) && !text.contains(in_header),
            "a task id in the audit: {text}"
        );
        assert!(
            line["reason"].as_str().unwrap().contains("Mcp-Name"),
            "{text}"
        );
    }
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

/// A modern server with the tasks extension: `slow` answers a call that
/// declares the extension with a task, which asks for a name, then
/// completes with a greeting carrying an e-mail address; `odd` answers with
/// a task of a status the extension does not have; a listen stream asking
/// about the task tells it completed. Every request is kept.
async fn tasking_server(seen: Arc<Mutex<Vec<Value>>>, shutdown: CancellationToken) -> String {
    let answered = Arc::new(AtomicBool::new(false));
    let task = |status: &str| {
        json!({"taskId": "srv-1", "status": status, "createdAt": "2026-12-03T10:00:00Z",
            "lastUpdatedAt": "2026-12-03T10:00:00Z", "ttlMs": 60000, "pollIntervalMs": 50})
    };
    common::scripted_server(
        move |m| {
            seen.lock().unwrap().push(m.clone());
            let declares = m.pointer(&format!(
                "/params/_meta/io.modelcontextprotocol~1clientCapabilities/extensions/{}",
                TASKS.replace('/', "~1")
            ));
            let mut result = match m["method"].as_str().unwrap_or_default() {
                "server/discover" => json!({"supportedVersions": ["2026-07-28"],
                    "capabilities": {"tools": {}, "extensions": {TASKS: {}}},
                    "serverInfo": {"name": "tasking", "version": "1"}}),
                "tools/list" => json!({"tools": [
                    {"name": "slow", "inputSchema": {"type": "object"}},
                    {"name": "odd", "inputSchema": {"type": "object"}}]}),
                "tools/call" if declares.is_none() => {
                    json!({"content": [{"type": "text", "text": "at once"}]})
                }
                "tools/call" if m["params"]["name"] == "odd" => task("running"),
                "tools/call" => task("working"),
                "tasks/get" if m["params"]["taskId"] != "srv-1" => {
                    json!({"__error": {"code": -32602, "message": "Task not found"}})
                }
                "tasks/get" if answered.load(Ordering::SeqCst) => {
                    let mut done = task("completed");
                    done["result"] = json!({"content": [{"type": "text",
                        "text": "hello Luca, write to luca@example.com"}]});
                    done
                }
                "tasks/get" => {
                    let mut asking = task("input_required");
                    asking["inputRequests"] = json!({"name": {"method": "elicitation/create",
                        "params": {"mode": "form", "message": "Your name?",
                            "requestedSchema": {"type": "object"}}}});
                    asking
                }
                "tasks/update" => {
                    answered.store(true, Ordering::SeqCst);
                    json!({})
                }
                // Asked about its task, the stream tells it is done (and
                // ends: the gateway comes back).
                "subscriptions/listen" if m["params"]["notifications"]["taskIds"] == json!(["srv-1"]) => {
                    let mut done = task("completed");
                    done["result"] = json!({"content": [{"type": "text", "text": "done, mail luca@example.com"}]});
                    let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                        "params": {"notifications": {"taskIds": ["srv-1"]}}});
                    let note = json!({"jsonrpc": "2.0", "method": "notifications/tasks", "params": done});
                    return (200, json!({"__sse": [ack, note], "__result": {"resultType": "complete"}}));
                }
                _ => json!({}),
            };
            if result.get("__error").is_none() {
                let created = result["status"].is_string() && m["method"] == "tools/call";
                result["resultType"] = json!(if created { "task" } else { "complete" });
            }
            (200, result)
        },
        shutdown,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_task_is_relayed_under_a_gateway_id() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let url = tasking_server(seen.clone(), shutdown.clone()).await;
    let policy = "  allowed_tools: [up_slow, up_odd]\n  dlp:\n    patterns:\n      - {name: Email, regex: '[a-z]+@[a-z]+\\.com'}\n";
    let s = Stack::start(Setup {
        url: Some(url),
        policy,
        connection: "  clientCapabilities: {elicitation: true}\n",
        ..Setup::default()
    })
    .await;
    let sent = |method: &str| -> Vec<Value> {
        let seen = seen.lock().unwrap();
        seen.iter()
            .filter(|m| m["method"] == method)
            .cloned()
            .collect()
    };
    let mut asking = meta("a", true);
    asking["io.modelcontextprotocol/clientCapabilities"]["elicitation"] = json!({});

    // The call: the server makes a task, the agent gets it under the
    // gateway's id; the server was offered the extension.
    let created = modern_with(
        &s,
        asking.clone(),
        "tools/call",
        json!({"name": "up_slow", "arguments": {}}),
    )
    .await;
    let task = created.json()["result"].clone();
    assert_eq!(
        (task["resultType"].clone(), task["status"].clone()),
        (json!("task"), json!("working")),
        "{created:?}"
    );
    let id = task["taskId"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "{task}");
    assert!(
        !created.body.contains("srv-1"),
        "the server's id stays in the gateway: {created:?}"
    );
    let offered =
        &sent("tools/call")[0]["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"];
    assert_eq!(offered["extensions"], json!({TASKS: {}}), "{offered}");

    // Another agent cannot read it, and the server is not asked.
    let other = modern(&s, "b", true, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(other.json()["error"]["code"], -32602, "{other:?}");
    assert!(sent("tasks/get").is_empty());

    // Polled: the server's question reaches the agent; its answer reaches
    // the server, under the server's id.
    let polled = modern_with(&s, asking.clone(), "tasks/get", json!({"taskId": id})).await;
    let view = polled.json()["result"].clone();
    assert_eq!(view["status"], "input_required", "{polled:?}");
    assert_eq!(
        (view["taskId"].as_str(), view["resultType"].as_str()),
        (Some(id.as_str()), Some("complete"))
    );
    assert_eq!(
        view["inputRequests"]["name"]["method"],
        "elicitation/create"
    );
    assert_eq!(sent("tasks/get")[0]["params"]["taskId"], "srv-1");
    let update = modern_with(&s, asking.clone(), "tasks/update",
        json!({"taskId": id, "inputResponses": {"name": {"action": "accept", "content": {"name": "Luca"}}}})).await;
    assert_eq!(
        update.json()["result"]["resultType"],
        "complete",
        "{update:?}"
    );
    let updated = &sent("tasks/update")[0]["params"];
    assert_eq!(
        (
            updated["taskId"].as_str(),
            updated["inputResponses"]["name"]["content"]["name"].as_str()
        ),
        (Some("srv-1"), Some("Luca"))
    );

    // Completed: the result is redacted as a direct result would be.
    let done = modern_with(&s, asking.clone(), "tasks/get", json!({"taskId": id})).await;
    let view = done.json()["result"].clone();
    assert_eq!(view["status"], "completed", "{done:?}");
    let text = view["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("hello Luca") && !text.contains("luca@example.com"),
        "{text}"
    );
    assert!(!done.body.contains("srv-1"));

    // Cancelling is relayed too.
    let cancel = modern(&s, "a", true, "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(
        cancel.json()["result"]["resultType"],
        "complete",
        "{cancel:?}"
    );
    assert_eq!(sent("tasks/cancel")[0]["params"]["taskId"], "srv-1");

    // A task the extension does not describe is refused, not relayed.
    let odd = modern(
        &s,
        "a",
        true,
        "tools/call",
        json!({"name": "up_odd", "arguments": {}}),
    )
    .await;
    assert_eq!(
        odd.json()["error"]["data"]["reason"],
        "upstream_malformed",
        "{odd:?}"
    );

    // An agent without the extension: the server is not offered it.
    let plain = modern(
        &s,
        "a",
        false,
        "tools/call",
        json!({"name": "up_slow", "arguments": {}}),
    )
    .await;
    assert_eq!(
        plain.json()["result"]["content"][0]["text"],
        "at once",
        "{plain:?}"
    );

    // Authorized again on every request: once the policy no longer allows
    // the tool, the task cannot be read, and the server is not asked.
    let polls = sent("tasks/get").len();
    let hiding = s.config_text.replace(
        "allowed_tools: [up_slow, up_odd]",
        "allowed_tools: [up_odd]",
    );
    s.reload(&hiding).await;
    let refused = modern(&s, "a", true, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(refused.json()["error"]["code"], -32001, "{refused:?}");
    assert_eq!(sent("tasks/get").len(), polls);
    shutdown.cancel();
}

/// A `subscriptions/listen` of agent `agent` for the tasks `ids`.
async fn listen_tasks(s: &Stack, agent: &str, declared: bool, ids: &[&str]) -> common::Sse {
    let body = json!({"jsonrpc": "2.0", "id": "t", "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": ids}, "_meta": meta(agent, declared)}});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "subscriptions/listen"),
    ];
    common::Sse::open(s.addr, "POST", &headers, &body.to_string()).await
}

/// The task notifications on `stream` until one shows the task ended.
async fn until_ended(stream: &mut common::Sse) -> Value {
    loop {
        let note = stream.next().await.unwrap();
        assert_eq!(note["method"], "notifications/tasks", "{note}");
        assert_eq!(
            note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            "t"
        );
        if !matches!(
            note["params"]["status"].as_str(),
            Some("working" | "input_required")
        ) {
            return note["params"].clone();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_its_approval_task_on_a_listen_stream() {
    let s = Stack::start(Setup {
        faults: DEPLOY,
        policy: ASKING,
        ..Setup::default()
    })
    .await;
    let call = json!({"name": "up_deploy", "arguments": {}});
    let created = modern(&s, "a", true, "tools/call", call).await;
    let id = created.json()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();

    // Without the extension declared: refused, as the extension has it.
    let undeclared = listen_tasks(&s, "a", false, &[&id]).await;
    assert_eq!(undeclared.status, 400);
    assert!(undeclared.text().await.contains("-32021"));
    // Another agent's listen does not follow it.
    let mut other = listen_tasks(&s, "b", true, &[&id]).await;
    let ack = other.next().await.unwrap();
    assert_eq!(ack["params"]["notifications"], json!({}), "{ack}");

    let mut stream = listen_tasks(&s, "a", true, &[&id, "made-up"]).await;
    let ack = stream.next().await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    s.gateway
        .approvals
        .decide(&pending(&s).await, true)
        .unwrap();
    let done = until_ended(&mut stream).await;
    assert_eq!(done["taskId"], json!(id));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "deployed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_task_notifications_reach_the_agent_that_follows_it() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let url = tasking_server(seen.clone(), shutdown.clone()).await;
    let policy = "  allowed_tools: [up_slow]\n  dlp:\n    patterns:\n      - {name: Email, regex: '[a-z]+@[a-z]+\\.com'}\n";
    let s = Stack::start(Setup {
        url: Some(url),
        policy,
        ..Setup::default()
    })
    .await;
    let call = json!({"name": "up_slow", "arguments": {}});
    let created = modern(&s, "a", true, "tools/call", call).await;
    let id = created.json()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stream = listen_tasks(&s, "a", true, &[&id]).await;
    let ack = stream.next().await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let done = until_ended(&mut stream).await;
    assert_eq!(done["taskId"], json!(id), "under the gateway's id: {done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("done") && !text.contains("luca@example.com"),
        "{text}"
    );
    // The server was asked on the gateway's stream, with the extension
    // declared and its own id.
    let listens: Vec<Value> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m["method"] == "subscriptions/listen")
        .cloned()
        .collect();
    let asked = listens
        .iter()
        .find(|m| m["params"]["notifications"]["taskIds"] == json!(["srv-1"]))
        .expect("the gateway asked the server about its task");
    let declared = &asked["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"];
    assert_eq!(declared["extensions"], json!({TASKS: {}}), "{asked}");
    shutdown.cancel();
}

/// A legacy server that asks for the agent's name (`q1`) while serving the
/// prompt `greet`; every message kept.
async fn asking_server(seen: Arc<Mutex<Vec<Value>>>, shutdown: CancellationToken) -> Stack {
    let url = common::scripted_server(
        move |m| {
            seen.lock().unwrap().push(m.clone());
            match m["method"].as_str() {
                Some("initialize") => (200, json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}, "prompts": {}},
                    "serverInfo": {"name": "asking", "version": "1"}})),
                Some("server/discover") => (404, Value::Null),
                Some("tools/list") => (200, json!({"tools": []})),
                Some("prompts/list") => (200, json!({"prompts": [{"name": "greet"}]})),
                Some("prompts/get") => (200, json!({
                    "__sse": [{"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create",
                        "params": {"message": "Your name?", "requestedSchema": {"type": "object"}}}],
                    "__result": {"messages": [{"role": "user",
                        "content": {"type": "text", "text": "hello"}}]}})),
                _ => (202, Value::Null), // the agent's answer, notifications
            }
        },
        shutdown,
    )
    .await;
    Stack::start(Setup {
        url: Some(url),
        prefix: "",
        policy: "  allowed_methods: [initialize, notifications/initialized, server/discover, prompts/list, prompts/get]\n",
        connection: "  clientCapabilities: {elicitation: true}\n",
        ..Setup::default()
    })
    .await
}

/// A modern agent that can answer an elicitation.
fn answering() -> Value {
    let mut asking = meta("a", false);
    asking["io.modelcontextprotocol/clientCapabilities"]["elicitation"] = json!({});
    asking
}

/// A legacy server asking for input while serving a prompt: the modern
/// agent gets `input_required`, and its retry answers the server's open
/// request — the server serves the prompt once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_servers_question_during_a_prompt_is_answered_by_the_retry() {
    let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
    let shutdown = CancellationToken::new();
    let s = asking_server(seen.clone(), shutdown.clone()).await;
    let asking = answering();
    let first = modern_with(&s, asking.clone(), "prompts/get", json!({"name": "greet"})).await;
    let asked = first.json()["result"].clone();
    assert_eq!(asked["resultType"], "input_required", "{first:?}");
    assert_eq!(
        asked["inputRequests"]["aip"]["method"],
        "elicitation/create"
    );
    let retry = json!({"name": "greet", "requestState": asked["requestState"],
        "inputResponses": {"aip": {"action": "accept", "content": {"name": "Luca"}}}});
    let second = modern_with(&s, asking, "prompts/get", retry).await;
    let served = second.json()["result"].clone();
    assert_eq!(
        served["messages"][0]["content"]["text"], "hello",
        "{second:?}"
    );
    let seen = seen.lock().unwrap();
    let gets = seen.iter().filter(|m| m["method"] == "prompts/get").count();
    assert_eq!(gets, 1, "the server served the prompt once");
    let answer = seen
        .iter()
        .find(|m| m["id"] == "q1" && m.get("method").is_none());
    assert_eq!(
        answer.map(|a| a["result"]["content"]["name"].clone()),
        Some(json!("Luca")),
        "the server's question was answered"
    );
    shutdown.cancel();
}

/// Toward a legacy server a `requestState` can only be one of the
/// gateway's handles: one spelled otherwise (another case, a missing dash,
/// a space, anything foreign) is refused -32602 and sends nothing upstream
/// — it neither runs the prompt a second time nor spends the parked call,
/// which the agent's proper retry still resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_state_not_of_the_gateway_is_refused_without_an_upstream_call() {
    let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
    let shutdown = CancellationToken::new();
    let s = asking_server(seen.clone(), shutdown.clone()).await;
    let gets = || {
        let seen = seen.lock().unwrap();
        seen.iter().filter(|m| m["method"] == "prompts/get").count()
    };
    let first = modern_with(&s, answering(), "prompts/get", json!({"name": "greet"})).await;
    let state = first.json()["result"]["requestState"]
        .as_str()
        .unwrap()
        .to_owned();
    let handle = state.strip_prefix("aip-parked-").unwrap();
    let answer = json!({"aip": {"action": "accept", "content": {"name": "Luca"}}});
    for foreign in [
        format!("AIP-PARKED-{handle}"),
        format!("aip-parked{handle}"),
        format!(" {state}"),
        format!("{state} "),
        "opaque-state-of-some-server".to_owned(),
    ] {
        let retry = json!({"name": "greet", "requestState": foreign, "inputResponses": answer});
        let r = modern_with(&s, answering(), "prompts/get", retry).await;
        let error = &r.json()["error"];
        assert_eq!(error["code"], -32602, "{foreign:?}: {r:?}");
        assert!(
            error["message"].as_str().unwrap().contains("requestState"),
            "{r:?}"
        );
        assert_eq!(gets(), 1, "{foreign:?} reached the server");
    }
    // A legacy agent has no requestState to give.
    let session = s.session().await;
    let legacy = json!({"jsonrpc": "2.0", "id": 4, "method": "prompts/get",
        "params": {"name": "greet", "requestState": state}});
    let r = s
        .post(&[("mcp-session-id", &session)], &legacy.to_string())
        .await;
    assert_eq!(r.json()["error"]["code"], -32602, "{r:?}");
    assert_eq!(gets(), 1);

    let retry = json!({"name": "greet", "requestState": state, "inputResponses": answer});
    let resumed = modern_with(&s, answering(), "prompts/get", retry).await;
    assert_eq!(
        resumed.json()["result"]["messages"][0]["content"]["text"],
        "hello",
        "{resumed:?}"
    );
    assert_eq!(gets(), 1, "the server served the prompt once");
    shutdown.cancel();
}

/// A modern server whose task notification (on the gateway's listen
/// stream to it) echoes the connection's bearer token, in the task's
/// status message and in its result: the agent following the task hears
/// neither, as it would not in a direct result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_task_notification_echoing_the_credential_is_redacted() {
    let token = "tok-t4sk-n0te-ref1ected";
    let tmp = common::scratch("aip-task-note-");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, token).unwrap();
    let shutdown = CancellationToken::new();
    let task = |status: &str| {
        json!({"taskId": "srv-1", "status": status, "createdAt": "2026-12-03T10:00:00Z",
            "lastUpdatedAt": "2026-12-03T10:00:00Z", "ttlMs": 60000, "pollIntervalMs": 50})
    };
    let url = common::scripted_server(
        move |m| {
            let mut result = match m["method"].as_str().unwrap_or_default() {
                "server/discover" => json!({"supportedVersions": ["2026-07-28"],
                    "capabilities": {"tools": {}, "extensions": {TASKS: {}}},
                    "serverInfo": {"name": "tasking", "version": "1"}}),
                "tools/list" => json!({"tools": [{"name": "slow", "inputSchema": {"type": "object"}}]}),
                "tools/call" => task("working"),
                "subscriptions/listen" if m["params"]["notifications"]["taskIds"] == json!(["srv-1"]) => {
                    let mut done = task("completed");
                    done["statusMessage"] = json!(format!("done as Bearer {token}"));
                    done["result"] = json!({"content": [{"type": "text", "text": format!("your token: {token}")}]});
                    let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                        "params": {"notifications": {"taskIds": ["srv-1"]}}});
                    let note = json!({"jsonrpc": "2.0", "method": "notifications/tasks", "params": done});
                    return (200, json!({"__sse": [ack, note], "__result": {"resultType": "complete"}}));
                }
                _ => json!({}),
            };
            let created = result["status"].is_string() && m["method"] == "tools/call";
            result["resultType"] = json!(if created { "task" } else { "complete" });
            (200, result)
        },
        shutdown.clone(),
    )
    .await;
    let connection = format!(
        "  bearerToken:\n    valueFrom: {{file: {}}}\n",
        token_file.display()
    );
    let s = Stack::start(Setup {
        url: Some(url),
        policy: "  allowed_tools: [up_slow]\n",
        connection: &connection,
        ..Setup::default()
    })
    .await;
    let call = json!({"name": "up_slow", "arguments": {}});
    let created = modern(&s, "a", true, "tools/call", call).await;
    let id = created.json()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stream = listen_tasks(&s, "a", true, &[&id]).await;
    let ack = stream.next().await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let done = until_ended(&mut stream).await;
    assert_eq!(done["status"], "completed", "{done}");
    let shown = done.to_string();
    assert!(!shown.contains(token), "{shown}");
    assert_eq!(
        done["statusMessage"], "done as [REDACTED:credential]",
        "{done}"
    );
    assert_eq!(
        done["result"]["content"][0]["text"], "your token: [REDACTED:credential]",
        "{done}"
    );
    shutdown.cancel();
}

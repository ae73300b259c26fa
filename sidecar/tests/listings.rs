//! Listings across connections on real loopback: upstream pages followed for
//! the tool catalog, agent-facing pages for prompts and resources with the
//! gateway's own cursors, and routing of gets and reads by what was listed.

#![allow(clippy::unwrap_used)]

mod common;

use aip_sidecar::upstream::health::HealthState;
use common::{Setup, Stack};
use serde_json::{Value, json};

const FAULTS: &str = "  pageSize: 2
  tools:
    - {name: a, responses: [{sequence: [{return: 1}]}]}
    - {name: b, responses: [{sequence: [{return: 1}]}]}
    - {name: c, responses: [{sequence: [{return: 1}]}]}
  resources:
    - {uri: 'file:///r1', name: r1, text: one}
    - {uri: 'file:///r2', name: r2, text: two}
    - {uri: 'file:///r3', name: r3, text: three}
  prompts:
    - {name: p1, text: first}
    - {name: p2, text: second}
    - {name: p3, text: third}
";

const POLICY: &str = "  allowed_tools: [up_a, up_b, up_c]
  allowed_methods: [initialize, notifications/initialized, ping, tools/list, prompts/list, prompts/get, resources/list, resources/read]
";

const SECOND: &str = "apiVersion: aip.io/v1alpha1
kind: ToolConnection
metadata: {name: two}
spec:
  url: {fault_url}
  toolPrefix: two_
";

async fn stack() -> Stack {
    Stack::start(Setup {
        faults: FAULTS,
        policy: POLICY,
        more: SECOND,
        ..Setup::default()
    })
    .await
}

/// Every page of `method` as the agent walks it: (items, cursors seen).
async fn walk(s: &Stack, session: &str, method: &str, key: &str) -> (Vec<Value>, Vec<String>) {
    let (mut items, mut cursors) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    for id in 0..20 {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let page = s
            .post(&[("mcp-session-id", session)], &body.to_string())
            .await
            .json();
        items.extend(page["result"][key].as_array().unwrap().iter().cloned());
        match page["result"]["nextCursor"].as_str() {
            Some(next) => {
                cursors.push(next.to_owned());
                cursor = Some(next.to_owned());
            }
            None => return (items, cursors),
        }
    }
    panic!("the listing never ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_catalog_follows_every_upstream_page() {
    let s = stack().await;
    let session = s.session().await;
    let list = s.request(&session, json!(1), "tools/list").await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["up_a", "up_b", "up_c"], "{list}");
    assert!(list["result"].get("nextCursor").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_and_prompts_are_paged_across_connections() {
    let s = stack().await;
    let session = s.session().await;
    let (resources, cursors) = walk(&s, &session, "resources/list", "resources").await;
    let uris: Vec<&str> = resources
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [
            "file:///r1",
            "file:///r2",
            "file:///r3",
            "file:///r1",
            "file:///r2",
            "file:///r3"
        ]
    );
    assert_eq!(cursors.len(), 3, "one agent page per upstream page");
    assert!(
        cursors.iter().all(|c| !c.starts_with("page-")),
        "an upstream's cursor never reaches the agent as is: {cursors:?}"
    );

    let (prompts, _) = walk(&s, &session, "prompts/list", "prompts").await;
    let names: Vec<&str> = prompts
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["up_p1", "up_p2", "up_p3", "two_p1", "two_p2", "two_p3"]
    );
    let get =
        json!({"jsonrpc": "2.0", "id": 9, "method": "prompts/get", "params": {"name": "two_p2"}});
    let got = s
        .post(&[("mcp-session-id", &session)], &get.to_string())
        .await
        .json();
    assert_eq!(
        got["result"]["messages"][0]["content"]["text"], "second",
        "{got}"
    );

    for bad in [json!("garbage"), json!(7), json!("WyJub3BlIixudWxsXQ")] {
        let body = json!({"jsonrpc": "2.0", "id": 10, "method": "resources/list", "params": {"cursor": bad}});
        let r = s
            .post(&[("mcp-session-id", &session)], &body.to_string())
            .await
            .json();
        assert_eq!(
            r["error"],
            json!({"code": -32602, "message": "Invalid cursor"}),
            "{bad}"
        );
    }
}

/// An agent that lists or reads resources or prompts while its server's
/// first health check is still under way waits for that check, as a tools
/// listing does, instead of being told there is nothing (an agent that
/// lists at once after initialize, as the stdio wrap's clients do, got an
/// empty list and then "Unknown resource").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_reads_wait_for_a_server_still_starting() {
    let faults = format!("{FAULTS}  toolsList: {{sequence: [{{list: true, delay_ms: 400}}]}}\n");
    let s = Stack::start(Setup {
        faults: &faults,
        policy: POLICY,
        expect: HealthState::Unchecked,
        ..Setup::default()
    })
    .await;
    let session = s.session().await;
    let ask = |id: u64, method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let s = &s;
        let session = &session;
        async move {
            s.post(&[("mcp-session-id", session)], &body.to_string())
                .await
                .json()
        }
    };
    let (read, resources, prompts) = tokio::join!(
        ask(1, "resources/read", json!({"uri": "file:///r3"})),
        ask(2, "resources/list", json!({})),
        ask(3, "prompts/list", json!({})),
    );
    assert_eq!(read["result"]["contents"][0]["text"], "three", "{read}");
    assert_eq!(
        resources["result"]["resources"][0]["uri"], "file:///r1",
        "{resources}"
    );
    assert_eq!(
        prompts["result"]["prompts"][0]["name"], "up_p1",
        "{prompts}"
    );
}

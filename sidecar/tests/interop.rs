//! Interoperability with code nobody here wrote: the Python MCP SDK (PyPI)
//! as the agent, and `@modelcontextprotocol/server-everything` (npm) as the
//! server — through the gateway over Streamable HTTP, and through the stdio
//! wrap mode over stdio. `make interop-deps` installs both (pinned). And a
//! Python SDK server whose tool list grows, announced as the SDK announces
//! it (over HTTP, where the gateway finds it speaks 2026-07-28, on the
//! gateway's `subscriptions/listen` stream; over stdio on stdout).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aip_mcp::http::StreamState;
use aip_sidecar::upstream::health::HealthState;
use common::{Setup, Stack};
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    let p = std::env::var_os("AIP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/pyenv/bin/python"));
    assert!(
        p.exists(),
        "no Python with the mcp SDK at {}: run `make interop-deps`",
        p.display()
    );
    p
}

fn everything() -> PathBuf {
    let p = repo()
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "server-everything is not installed at {}: run `make interop-deps`",
        p.display()
    );
    p
}

/// Runs the Python client; its JSON report.
fn client(calls: &Value, transport: &[&str]) -> Value {
    client_with(calls, transport, &[])
}

/// Runs the Python client with extra environment variables.
fn client_with(calls: &Value, transport: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(python())
        .arg(repo().join("sidecar/tests/interop/client.py"))
        .arg(calls.to_string())
        .args(transport)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A server over Streamable HTTP on a free port, killed when dropped.
struct HttpServer(Child, String);

/// server-everything over Streamable HTTP.
type Everything = HttpServer;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl HttpServer {
    /// Starts `command` (which serves `port`) and returns once its stderr
    /// says `ready`.
    fn spawn(mut command: Command, port: u16, ready: &str) -> HttpServer {
        let mut child = command
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 {
            if line.contains(ready) {
                break;
            }
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        HttpServer(child, format!("http://127.0.0.1:{port}/mcp"))
    }

    fn start() -> Everything {
        let port = free_port();
        let mut command = Command::new("node");
        command
            .arg(everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string());
        HttpServer::spawn(command, port, "listening on port")
    }
}

impl HttpServer {
    /// The gateway's connection to this server, over Streamable HTTP.
    fn setup(&self) -> Setup<'static> {
        Setup {
            url: Some(self.1.clone()),
            ..Setup::default()
        }
    }
}

/// The gateway's connection to server-everything run as a stdio server.
fn stdio_everything() -> Setup<'static> {
    let server = everything();
    let command = ["node", server.to_str().unwrap(), "stdio"];
    Setup {
        command: Some(command.map(str::to_owned).to_vec()),
        ..Setup::default()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const EVERYTHING_POLICY: &str = "  allowed_tools: [ev_echo, ev_get-sum, echo, get-sum]
  tool_rules:
    - {tool: ev_get-env, action: block}
    - {tool: get-env, action: block}
  dlp:
    patterns:
      - {name: Secret, regex: 'sk-[a-z0-9]{8}'}
";

fn check_everything(report: &Value, prefix: &str) {
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        vec![format!("{prefix}echo"), format!("{prefix}get-sum")],
        "only what the policy allows is listed"
    );
    let results = report["results"].as_array().unwrap();
    let echoed = results[0]["content"][0]["text"].as_str().unwrap();
    assert!(echoed.contains("hello [REDACTED:Secret]"), "{echoed}");
    assert!(!echoed.contains("sk-abcdefgh"));
    assert!(
        results[1]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains('5'),
        "{}",
        results[1]
    );
    assert_eq!(results[2]["error"]["code"], -32001, "{}", results[2]);
    assert_eq!(results[2]["error"]["message"], "Forbidden");
}

fn everything_calls(prefix: &str) -> Value {
    json!([
        [format!("{prefix}echo"), {"message": "hello sk-abcdefgh"}],
        [format!("{prefix}get-sum"), {"a": 2, "b": 3}],
        [format!("{prefix}get-env"), {}],
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_the_gateway_to_server_everything_over_http() {
    let everything = Everything::start();
    let s = Stack::start(Setup {
        policy: EVERYTHING_POLICY,
        prefix: "ev_",
        ..everything.setup()
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let report =
        tokio::task::spawn_blocking(move || client(&everything_calls("ev_"), &["http", &url]))
            .await
            .unwrap();
    assert_eq!(report["server"], "aip-sidecar");
    check_everything(&report, "ev_");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_the_gateway_to_the_fault_server_over_http() {
    let faults = "  tools:\n    - name: get_item\n      responses: [{sequence: [{error: busy}, {return: {qty: 3}}]}]\n";
    let s = Stack::start(Setup {
        faults,
        policy: "  allowed_tools: [up_get_item]\n",
        ..Setup::default()
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([
        ["up_get_item", {}],
        ["up_get_item", {}],
        ["up_get_item", {}]
    ]);
    let report = tokio::task::spawn_blocking(move || client(&calls, &["http", &url]))
        .await
        .unwrap();
    assert_eq!(report["tools"], json!(["up_get_item"]));
    let r = report["results"].as_array().unwrap();
    assert_eq!(r[0]["isError"], true);
    assert_eq!(r[1]["structuredContent"], json!({"qty": 3}));
    assert_eq!(r[2]["isError"], true, "exhausted: {}", r[2]);
    assert_eq!(s.attempts().len(), 3, "one upstream call per call");
}

/// `spec` as an AgentPolicy file `name` in `dir`.
fn policy_file(dir: &Path, name: &str, spec: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: desktop}}\nspec:\n{spec}")).unwrap();
    path
}

#[test]
fn python_sdk_through_the_stdio_wrap_to_server_everything() {
    let tmp = common::scratch("aip-interop-");
    let policy = policy_file(tmp.path(), "everything.yaml", EVERYTHING_POLICY);
    let sidecar = env!("CARGO_BIN_EXE_aip-sidecar");
    let everything = everything();
    let report = client(
        &everything_calls(""),
        &[
            "stdio",
            sidecar,
            "stdio",
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            "/dev/null",
            "--",
            "node",
            everything.to_str().unwrap(),
            "stdio",
        ],
    );
    check_everything(&report, "");
}

#[test]
fn the_stdio_wrap_works_with_the_fault_server_and_an_argv_with_spaces() {
    // A space in the directory's name too: the argv is passed whole.
    let tmp = common::scratch("aip-interop-faults ");
    let dir = tmp.path();
    let script = dir.join("script with spaces.yaml");
    std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: get_item\n      responses: [{sequence: [{return: {owner: ops@acme.io}}]}]\n    - name: drop_db\n      responses: [{sequence: [{return: dropped}]}]\n").unwrap();
    let policy = policy_file(
        dir,
        "faults.yaml",
        "  allowed_tools: [get_item]\n  dlp:\n    patterns:\n      - {name: Email, regex: '[a-z]+@[a-z.]+'}\n",
    );
    let fault_server = repo().join("target/debug/aip-fault-server");
    assert!(
        fault_server.exists(),
        "build the workspace first (make build)"
    );
    let report = client(
        &json!([["get_item", {}], ["drop_db", {}]]),
        &[
            "stdio",
            env!("CARGO_BIN_EXE_aip-sidecar"),
            "stdio",
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            "/dev/null",
            "--",
            fault_server.to_str().unwrap(),
            "--config",
            script.to_str().unwrap(),
            "--stdio",
            "--log",
            "/dev/null",
        ],
    );
    assert_eq!(report["tools"], json!(["get_item"]));
    assert_eq!(
        report["results"][0]["structuredContent"],
        json!({"owner": "[REDACTED:Email]"})
    );
    assert_eq!(report["results"][1]["error"]["code"], -32001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_reach_the_agent_through_the_gateway() {
    let everything = Everything::start();
    progress_through(everything.setup()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_from_a_stdio_connection_reach_the_agent() {
    progress_through(stdio_everything()).await;
}

/// server-everything behind the gateway (`setup` says how it is reached):
/// the Python SDK asks for progress and gets every update.
async fn progress_through(setup: Setup<'_>) {
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [ev_trigger-long-running-operation]\n",
        prefix: "ev_",
        ..setup
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([["ev_trigger-long-running-operation", {"duration": 0.3, "steps": 3}, {"progress": true}]]);
    let report = tokio::task::spawn_blocking(move || client(&calls, &["http", &url]))
        .await
        .unwrap();
    let result = &report["results"][0];
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{result}"
    );
    let updates = result["progress_updates"].as_array().unwrap();
    assert_eq!(updates.len(), 3, "{result}");
    assert_eq!(updates[2]["progress"], 3.0);
    assert_eq!(updates[2]["total"], 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_and_resources_through_the_gateway_where_the_policy_allows() {
    let everything = Everything::start();
    let policy = "  allowed_tools: []
  allowed_methods: [initialize, notifications/initialized, ping, tools/list, prompts/list, prompts/get, resources/list, resources/read]
  protected_paths: [/etc/shadow]
  dlp:
    patterns:
      - {name: Word, regex: 'Everything'}
";
    let s = Stack::start(Setup {
        policy,
        prefix: "ev_",
        ..everything.setup()
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([
        ["@prompts", null],
        ["@prompt", "ev_simple-prompt"],
        ["@resources", null],
        ["@read", "file:///etc/shadow"],
    ]);
    let report = tokio::task::spawn_blocking(move || client(&calls, &["http", &url]))
        .await
        .unwrap();
    let r = report["results"].as_array().unwrap();
    let prompts = r[0]["prompts"].as_array().unwrap();
    assert!(prompts.contains(&json!("ev_simple-prompt")), "{}", r[0]);
    assert!(
        r[1]["messages"][0]["content"]["text"].as_str().is_some(),
        "{}",
        r[1]
    );
    let resources: Vec<Value> = r[2]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u.as_str().is_some_and(|u| u.ends_with("architecture.md")))
        .cloned()
        .collect();
    assert!(!resources.is_empty(), "{}", r[2]);
    assert_eq!(
        r[3]["error"]["code"], -32007,
        "a protected path is refused before routing: {}",
        r[3]
    );
    // Read a listed resource: routed to its connection, its text redacted.
    let first = resources[0].as_str().unwrap().to_owned();
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([["@read", first]]);
    let report = tokio::task::spawn_blocking(move || client(&calls, &["http", &url]))
        .await
        .unwrap();
    let read = &report["results"][0];
    assert!(
        read["contents"].as_array().is_some_and(|c| !c.is_empty()),
        "{read}"
    );
    let text = read["contents"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("[REDACTED:Word]") && !text.contains("Everything"),
        "redacted: {read}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_requests_reach_the_agent_when_the_connection_opts_in() {
    let everything = Everything::start();
    sampling_through(everything.setup()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_requests_from_a_stdio_connection_reach_the_agent() {
    sampling_through(stdio_everything()).await;
}

/// server-everything, offered sampling by its connection, asks the client
/// to sample during a tool call: the Python SDK gets the request (redacted)
/// on the call's stream and answers it; the answer is redacted before the
/// server sees it, and the call completes.
async fn sampling_through(setup: Setup<'_>) {
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [ev_trigger-sampling-request]
  dlp:
    patterns:
      - {name: Secret, regex: 'sk-[a-z0-9]{8}'}
",
        connection: "  clientCapabilities: {sampling: true}\n",
        prefix: "ev_",
        ..setup
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([["ev_trigger-sampling-request", {"prompt": "summarize sk-12345678", "maxTokens": 20}]]);
    let reply = [("AIP_SAMPLE_REPLY", "the answer is sk-abcdefgh")];
    let report = tokio::task::spawn_blocking(move || client_with(&calls, &["http", &url], &reply))
        .await
        .unwrap();
    let asked = report["sampled"][0]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the agent was asked to sample: {report}"));
    assert!(
        asked.contains("summarize [REDACTED:Secret]") && !asked.contains("sk-1234"),
        "{asked}"
    );
    let text = report["results"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the call completed: {report}"));
    assert!(text.contains("the answer is [REDACTED:Secret]"), "{text}");
    // The agent's answer was redacted on its way to the server (an upstream
    // DLP finding), so the server's echo of it had nothing left to redact.
    let dlp: Vec<Value> = s
        .audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "DLP_TRIGGERED")
        .collect();
    assert!(dlp.iter().any(|l| l["direction"] == "upstream"), "{dlp:?}");
    assert!(
        !dlp.iter()
            .any(|l| l["tool"] == "ev_trigger-sampling-request"),
        "{dlp:?}"
    );
}

#[test]
fn sampling_through_the_stdio_wrap_when_the_capability_is_allowed() {
    let tmp = common::scratch("aip-interop-");
    let policy = policy_file(
        tmp.path(),
        "sampling.yaml",
        "  allowed_tools: [trigger-sampling-request]
  dlp:
    patterns:
      - {name: Secret, regex: 'sk-[a-z0-9]{8}'}
",
    );
    let everything = everything();
    let calls =
        json!([["trigger-sampling-request", {"prompt": "summarize sk-12345678", "maxTokens": 20}]]);
    let report = client_with(
        &calls,
        &[
            "stdio",
            env!("CARGO_BIN_EXE_aip-sidecar"),
            "stdio",
            "--policy",
            policy.to_str().unwrap(),
            "--allow-capability",
            "sampling",
            "--audit",
            "/dev/null",
            "--",
            "node",
            everything.to_str().unwrap(),
            "stdio",
        ],
        &[("AIP_SAMPLE_REPLY", "the answer is sk-abcdefgh")],
    );
    let asked = report["sampled"][0]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the agent was asked to sample: {report}"));
    assert!(asked.contains("summarize [REDACTED:Secret]"), "{asked}");
    let text = report["results"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the call completed: {report}"));
    assert!(text.contains("the answer is [REDACTED:Secret]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_with_the_same_progress_token_each_get_their_own_progress() {
    // Both Python clients use their request id as the progress token, so
    // the tokens collide; the gateway's own tokens keep them apart on the
    // one stdio server they share.
    let s = Stack::start(Setup {
        policy: "  allowed_tools: [ev_trigger-long-running-operation]\n",
        prefix: "ev_",
        ..stdio_everything()
    })
    .await;
    let url = format!("http://{}/mcp", s.addr);
    let calls = json!([["ev_trigger-long-running-operation", {"duration": 1, "steps": 4}, {"progress": true}]]);
    let run = |url: String, calls: Value| {
        tokio::task::spawn_blocking(move || client(&calls, &["http", &url]))
    };
    let (a, b) = (run(url.clone(), calls.clone()), run(url, calls));
    for report in [a.await.unwrap(), b.await.unwrap()] {
        let updates = report["results"][0]["progress_updates"].as_array().unwrap();
        assert_eq!(updates.len(), 4, "{report}");
    }
}

// ------------------------------------------------ tool list changes --

/// The Python SDK server whose tool list grows on each `grow` call.
fn growing() -> PathBuf {
    repo().join("sidecar/tests/servers/growing.py")
}

/// A health interval far longer than the test: only the server's own
/// notice can make the gateway look at its tools again in time.
const SLOW_CHECKS: &str = "  healthCheck: {intervalSeconds: 3600}\n";

const GROWING_POLICY: &str = "  allowed_tools: [up_grow, up_extra_1, up_extra_2, up_extra_3, up_extra_4, up_extra_5, up_extra_6, up_extra_7, up_extra_8, up_extra_9, up_extra_10]\n";

/// The agent calls `grow`; the server announces a new tool outside the
/// call; the agent's GET stream hears of it and the tool is listed, long
/// before the next scheduled health check.
async fn a_new_upstream_tool_reaches_the_agent(s: &Stack) {
    let session = s.session().await;
    let h = [("mcp-session-id", session.as_str())];
    let mut stream = common::Sse::open(s.addr, "GET", &h, "").await;
    assert_eq!(stream.status, 200);
    let before = tool_names(s, &session).await;
    assert_eq!(before, vec!["up_grow"]);
    // The SDK drops a notice while no standalone stream is registered, and
    // says nothing when it is: a server that announced into the void is
    // asked to grow again.
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    let mut grown = 0;
    let note = loop {
        grown += 1;
        let reply = s.call(&session, json!(grown), "up_grow", json!({})).await;
        assert_eq!(
            reply["result"]["content"][0]["text"],
            format!("extra_{grown}"),
            "{reply}"
        );
        match tokio::time::timeout(Duration::from_secs(1), stream.next()).await {
            Ok(note) => break note.unwrap(),
            Err(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "the agent never heard of a change"
            ),
        }
    };
    assert_eq!(note["method"], "notifications/tools/list_changed");
    // A refresh that an earlier notice started may have listed the tools
    // just before the last `grow`: its change is announced first, and the
    // refresh that lists the newest tool is announced next.
    let tool = format!("up_extra_{grown}");
    while !tool_names(s, &session).await.contains(&tool) {
        let note = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("the newest tool is announced")
            .unwrap();
        assert_eq!(note["method"], "notifications/tools/list_changed");
    }
    let extra = s.call(&session, json!("x"), &tool, json!({})).await;
    assert_eq!(
        extra["result"]["content"][0]["text"],
        format!("extra_{grown}"),
        "{extra}"
    );
}

async fn tool_names(s: &Stack, session: &str) -> Vec<String> {
    let list = s.request(session, json!("list"), "tools/list").await;
    let mut names: Vec<String> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_announcing_new_tools_outside_any_call() {
    let port = free_port();
    let mut command = Command::new(python());
    command.arg(growing()).args(["http", &port.to_string()]);
    let server = HttpServer::spawn(command, port, "Uvicorn running on");
    let s = Stack::start(Setup {
        url: Some(server.1.clone()),
        connection: SLOW_CHECKS,
        policy: GROWING_POLICY,
        ..Setup::default()
    })
    .await;
    a_new_upstream_tool_reaches_the_agent(&s).await;
    // The server's headers came with its first event.
    let connection = s.gateway.connections()[0].clone();
    assert_eq!(
        *connection.stream_state().unwrap().borrow(),
        StreamState::Open
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_announcing_new_tools() {
    let command = vec![
        python().display().to_string(),
        growing().display().to_string(),
        "stdio".to_owned(),
    ];
    let s = Stack::start(Setup {
        command: Some(command),
        connection: SLOW_CHECKS,
        policy: GROWING_POLICY,
        ..Setup::default()
    })
    .await;
    a_new_upstream_tool_reaches_the_agent(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_standalone_stream_is_left_alone() {
    // The fault server answers GET without Last-Event-ID with 405.
    let s = Stack::start(Setup {
        faults: "  tools: [{name: read, responses: [{sequence: [{return: 1}]}]}]\n",
        ..Setup::default()
    })
    .await;
    let connection = s.gateway.connections()[0].clone();
    let mut stream = connection.stream_state().unwrap();
    tokio::time::timeout(
        common::PATIENCE,
        stream.wait_for(|state| *state == StreamState::Unsupported),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(connection.health().state, HealthState::Healthy);
}

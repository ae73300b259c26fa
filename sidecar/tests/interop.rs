//! Interoperability with code nobody here wrote: the Python MCP SDK (PyPI)
//! as the agent, and `@modelcontextprotocol/server-everything` (npm) as the
//! server — through the gateway over Streamable HTTP, and through the stdio
//! wrap mode over stdio. `make interop-deps` installs both (pinned).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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

/// server-everything over Streamable HTTP on a free port.
struct Everything(Child, String);

impl Everything {
    fn start() -> Everything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("node")
            .arg(everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 {
            if line.contains("listening on port") {
                break;
            }
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Everything(child, format!("http://127.0.0.1:{port}/mcp"))
    }
}

impl Everything {
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

impl Drop for Everything {
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

fn policy_file(name: &str, spec: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aip-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: desktop}}\nspec:\n{spec}")).unwrap();
    path
}

#[test]
fn python_sdk_through_the_stdio_wrap_to_server_everything() {
    let policy = policy_file("everything.yaml", EVERYTHING_POLICY);
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
    let dir = std::env::temp_dir().join(format!("aip-interop-faults {}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script with spaces.yaml");
    std::fs::write(&script, "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: f}\nspec:\n  tools:\n    - name: get_item\n      responses: [{sequence: [{return: {owner: ops@acme.io}}]}]\n    - name: drop_db\n      responses: [{sequence: [{return: dropped}]}]\n").unwrap();
    let policy = policy_file(
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
    let policy = policy_file(
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

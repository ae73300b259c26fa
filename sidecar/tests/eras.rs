//! Both protocol eras through the gateway, with peers nobody here wrote:
//! the Python MCP SDK's client in its default mode (it probes
//! `server/discover` and speaks MCP 2026-07-28 to a server that answers)
//! and forced to the legacy handshake, and the TypeScript SDK's client in
//! its default mode (the legacy handshake) and pinned to 2026-07-28, in
//! front of the official MCP Go
//! SDK's conformance server run stateless (it speaks 2026-07-28, and the
//! gateway finds so by probing) and with sessions (2025-11-25 only, as the
//! gateway finds when its probe is refused). Every pairing of agent era and
//! server era works, including a server's request for input: a modern
//! agent answers a modern server's `input_required` itself, and for a
//! legacy agent the gateway asks it in its own era and retries the call.

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

/// The Go SDK's conformance server, killed when dropped.
struct GoServer(Child, String);

impl GoServer {
    fn start(stateless: bool) -> GoServer {
        let binary = repo().join("target/peers/mcp-conformance-server");
        assert!(
            binary.exists(),
            "{} is missing: run `make go-peers`",
            binary.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(binary)
            .arg(format!("-http=127.0.0.1:{port}"))
            .arg(format!("-stateless={stateless}"))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // It logs "listening at" just before it listens: wait for the
        // socket itself to accept.
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("listening") {
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        let deadline = std::time::Instant::now() + common::PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the Go server never listened"
            );
            std::thread::yield_now();
        }
        GoServer(child, format!("http://127.0.0.1:{port}/mcp"))
    }
}

impl Drop for GoServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const POLICY: &str =
    "  allowed_tools: [test_simple_text, test_input_required_result_elicitation, test_elicitation]
  tool_rules:
    - {tool: test_error_handling, action: block}
";

/// A gateway in front of `server`, every client capability offered.
async fn gateway(server: &GoServer) -> Stack {
    Stack::start(Setup {
        url: Some(server.1.clone()),
        policy: POLICY,
        prefix: "",
        connection: "  clientCapabilities: {sampling: true, elicitation: true, roots: true}\n",
        ..Setup::default()
    })
    .await
}

/// Runs the Python SDK client in `mode` against the gateway; its report.
async fn client(s: &Stack, mode: &str, calls: Value) -> Value {
    let mut command = Command::new(python());
    command.arg(repo().join("sidecar/tests/interop/eras_client.py"));
    run(command, s, mode, calls).await
}

/// Runs the TypeScript SDK client in `mode` against the gateway (from the
/// directory its package is installed in, where Node resolves it).
async fn ts_client(s: &Stack, mode: &str, calls: Value) -> Value {
    let npm = repo().join("target/npm");
    assert!(
        npm.join("node_modules/@modelcontextprotocol/client")
            .exists(),
        "the TypeScript SDK client is not installed in {}: run `make interop-deps`",
        npm.display()
    );
    // A copy of its own per run: tests run at once.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let script = npm.join(format!("aip-ts-client-{}-{n}.mjs", std::process::id()));
    std::fs::copy(repo().join("sidecar/tests/interop/ts_client.mjs"), &script).unwrap();
    let mut command = Command::new("node");
    command.arg(&script);
    let report = run(command, s, mode, calls).await;
    let _ = std::fs::remove_file(script);
    report
}

async fn run(mut command: Command, s: &Stack, mode: &str, calls: Value) -> Value {
    let url = format!("http://{}/mcp", s.addr);
    let mode = mode.to_owned();
    tokio::task::spawn_blocking(move || {
        let out = command
            .args([url.as_str(), mode.as_str(), &calls.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "client failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    })
    .await
    .unwrap()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// The calls every pairing makes: a plain call, a call the server answers
/// only after asking the agent's name (a modern server asks in its result,
/// a legacy one by a request), and one the policy blocks.
fn calls(asking_tool: &str) -> Value {
    json!([
        ["test_simple_text", {}],
        [asking_tool, {"message": "What is your name?"}],
        ["test_error_handling", {}],
    ])
}

fn check(report: &Value, agent_version: &str) {
    assert_eq!(report["protocol_version"], agent_version, "{report}");
    let tools = report["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("test_simple_text")), "{report}");
    assert!(
        !tools.contains(&json!("test_error_handling")),
        "hidden by the policy: {report}"
    );
    let results = report["results"].as_array().unwrap();
    assert_eq!(
        text(&results[0]),
        "This is a simple text response for testing."
    );
    assert_eq!(
        results[2]["error"]["code"], -32001,
        "blocked: {}",
        results[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_agent_with_a_modern_server() {
    let server = GoServer::start(true);
    let s = gateway(&server).await;
    assert!(
        s.gateway.connections()[0].upstream.modern(),
        "the probe found 2026-07-28"
    );
    let report = client(&s, "auto", calls("test_input_required_result_elicitation")).await;
    check(&report, "2026-07-28");
    assert_eq!(text(&report["results"][1]), "Hello, octocat!", "{report}");
    assert_eq!(report["elicited"][0]["message"], "What is your name?");
    // Each round of the asking call was a call the policy decided.
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    let decided = audit
        .lines()
        .filter(|l| l.contains("test_input_required_result_elicitation") && l.contains("\"ALLOW\""))
        .count();
    assert_eq!(decided, 2, "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_agent_with_a_modern_server() {
    let server = GoServer::start(true);
    let s = gateway(&server).await;
    let report = client(
        &s,
        "legacy",
        calls("test_input_required_result_elicitation"),
    )
    .await;
    check(&report, "2025-11-25");
    // The server asked in its result; the gateway asked the agent with an
    // elicitation request of its era and retried with the answer.
    assert_eq!(text(&report["results"][1]), "Hello, octocat!", "{report}");
    assert_eq!(report["elicited"][0]["message"], "What is your name?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_agent_with_a_legacy_server() {
    let server = GoServer::start(false);
    let s = gateway(&server).await;
    assert!(
        !s.gateway.connections()[0].upstream.modern(),
        "the probe was refused"
    );
    let report = client(&s, "auto", calls("test_elicitation")).await;
    check(&report, "2026-07-28");
    // The server asked by a request mid-call; the agent got it as an
    // input_required result, answered, and its retry took the same
    // upstream call up again.
    assert_eq!(
        report["elicited"][0]["message"], "What is your name?",
        "{report}"
    );
    let answered = report["results"][1].to_string();
    assert!(answered.contains("octocat"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_agent_with_a_legacy_server() {
    let server = GoServer::start(false);
    let s = gateway(&server).await;
    let report = client(&s, "legacy", calls("test_elicitation")).await;
    check(&report, "2025-11-25");
    // The server asked by a request, relayed to the agent as it was.
    assert_eq!(
        report["elicited"][0]["message"], "What is your name?",
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_in_both_eras_with_a_modern_server() {
    let server = GoServer::start(true);
    let s = gateway(&server).await;
    let asking = calls("test_input_required_result_elicitation");
    for (mode, version) in [("2026-07-28", "2026-07-28"), ("legacy", "2025-11-25")] {
        let report = ts_client(&s, mode, asking.clone()).await;
        check(&report, version);
        assert_eq!(
            text(&report["results"][1]),
            "Hello, octocat!",
            "{mode}: {report}"
        );
        assert_eq!(report["elicited"][0]["message"], "What is your name?");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_in_both_eras_with_a_legacy_server() {
    let server = GoServer::start(false);
    let s = gateway(&server).await;
    for (mode, version) in [("2026-07-28", "2026-07-28"), ("legacy", "2025-11-25")] {
        let report = ts_client(&s, mode, calls("test_simple_text")).await;
        check(&report, version);
    }
}

/// A modern tools/call of the Go server's test_elicitation from client
/// `agent` (declaring elicitation), with `extra` params; the response.
async fn elicitation_call(s: &Stack, agent: &str, extra: Value) -> Value {
    let mut params = json!({"name": "test_elicitation", "arguments": {"message": "who?"}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        "io.modelcontextprotocol/clientInfo": {"name": agent, "version": "1"},
    }});
    if let (Some(params), Value::Object(extra)) = (params.as_object_mut(), extra) {
        params.extend(extra);
    }
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "test_elicitation"),
    ];
    s.post(&headers, &body.to_string()).await.json()
}

/// The state the gateway hands a modern agent for a legacy server's
/// question is a one-time handle for that client's retry of that call:
/// another client, other arguments, a second use and a made-up state are
/// refused, and only the right retry reaches the server's open call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_call_resumes_only_for_its_clients_retry() {
    let server = GoServer::start(false);
    let s = gateway(&server).await;
    let ask = |agent: &'static str| {
        let s = &s;
        async move {
            let asked = elicitation_call(s, agent, json!({})).await;
            assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
            let question = &asked["result"]["inputRequests"]["aip"];
            assert_eq!(question["method"], "elicitation/create", "{asked}");
            asked["result"]["requestState"].as_str().unwrap().to_owned()
        }
    };
    let answer = json!({"aip": {"action": "accept", "content": {"username": "octocat"}}});
    let refused = |r: &Value| {
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("requestState"),
            "{r}"
        );
    };

    let state = ask("a").await;
    let stolen = elicitation_call(
        &s,
        "b",
        json!({"requestState": state, "inputResponses": answer}),
    )
    .await;
    refused(&stolen);
    // The call it named is gone (its server told), so its owner's retry is too.
    let late = elicitation_call(
        &s,
        "a",
        json!({"requestState": state, "inputResponses": answer}),
    )
    .await;
    refused(&late);

    let state = ask("a").await;
    let other =
        json!({"requestState": state, "inputResponses": answer, "arguments": {"message": "else"}});
    refused(&elicitation_call(&s, "a", other).await);

    let state = ask("a").await;
    let retry = json!({"requestState": state, "inputResponses": answer});
    let done = elicitation_call(&s, "a", retry.clone()).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert!(done["result"].to_string().contains("octocat"), "{done}");
    refused(&elicitation_call(&s, "a", retry).await);

    let made_up = json!({"requestState": "aip-parked-0123", "inputResponses": answer});
    refused(&elicitation_call(&s, "a", made_up).await);
}

/// A modern agent's `subscriptions/listen` for `uris`, as an open stream.
async fn listen(s: &Stack, uris: &[&str]) -> common::Sse {
    let body = json!({"jsonrpc": "2.0", "id": "watch", "method": "subscriptions/listen", "params": {
    "notifications": {"resourceSubscriptions": uris},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "watcher", "version": "1"},
    }}});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "subscriptions/listen"),
    ];
    common::Sse::open(s.addr, "POST", &headers, &body.to_string()).await
}

/// A modern agent watching a resource hears the server's updates of it, in
/// front of a modern server (the gateway's listen stream to it asks for the
/// resource) and a legacy one (the gateway subscribes its session): the Go
/// server announces its watched resource every 3 s to whoever subscribed.
/// A resource the policy does not let the agent read is not watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_resource_s_updates_reach_the_agent_from_either_era() {
    const WATCHED: &str = "test://watched-resource";
    for stateless in [true, false] {
        let server = GoServer::start(stateless);
        let s = Stack::start(Setup {
            url: Some(server.1.clone()),
            policy: "  allowed_tools: [test_simple_text]\n  protected_paths: [/etc/shadow]\n  allowed_methods: [server/discover, subscriptions/listen, resources/read]\n",
            prefix: "",
            ..Setup::default()
        })
        .await;
        let mut stream = listen(&s, &[WATCHED, "file:///etc/shadow"]).await;
        assert_eq!(stream.status, 200, "stateless={stateless}");
        let ack = stream.next().await.unwrap();
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(
            ack["params"]["notifications"]["resourceSubscriptions"],
            json!([WATCHED]),
            "stateless={stateless}: {ack}"
        );
        let update = stream.next().await.unwrap();
        assert_eq!(
            update,
            json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "watch"}, "uri": WATCHED}}),
            "stateless={stateless}"
        );
    }
}

/// A legacy agent's `resources/subscribe` is kept by the gateway for its
/// session, and the server's updates of the resource reach the session's
/// GET stream, in front of either era's server; `resources/unsubscribe`
/// is answered by the gateway too. A resource the policy does not let it
/// read is refused as a read would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_session_s_subscription_brings_updates_from_either_era() {
    const WATCHED: &str = "test://watched-resource";
    for stateless in [true, false] {
        let server = GoServer::start(stateless);
        let s = Stack::start(Setup {
            url: Some(server.1.clone()),
            policy: "  allowed_tools: [test_simple_text]\n  protected_paths: [/etc/shadow]\n  allowed_methods: [initialize, notifications/initialized, tools/list, tools/call, resources/read, resources/subscribe, resources/unsubscribe]\n",
            prefix: "",
            ..Setup::default()
        })
        .await;
        let session = s.session().await;
        let subscribe = |method: &str, uri: &str| {
            json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": {"uri": uri}}).to_string()
        };
        let headers = [("mcp-session-id", session.as_str())];
        let refused = s
            .post(
                &headers,
                &subscribe("resources/subscribe", "file:///etc/shadow"),
            )
            .await;
        assert_eq!(refused.json()["error"]["code"], -32007, "{refused:?}");
        let mut stream = common::Sse::open(s.addr, "GET", &headers, "").await;
        assert_eq!(stream.status, 200, "stateless={stateless}");
        let taken = s
            .post(&headers, &subscribe("resources/subscribe", WATCHED))
            .await;
        assert_eq!(taken.json()["result"], json!({}), "{taken:?}");
        let upstream = &s.gateway.connections()[0].upstream;
        assert_eq!(upstream.watched_resources().len(), 1);
        let update = stream.next().await.unwrap();
        assert_eq!(
            update,
            json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": WATCHED}}),
            "stateless={stateless}"
        );
        let dropped = s
            .post(&headers, &subscribe("resources/unsubscribe", WATCHED))
            .await;
        assert_eq!(dropped.json()["result"], json!({}), "{dropped:?}");
        assert!(
            upstream.watched_resources().is_empty(),
            "the server is unsubscribed once nobody watches"
        );
    }
}

/// The stdio wrap speaks both eras on its one channel: the Python SDK's
/// client in its default mode launches `aip-sidecar stdio` around the Go
/// SDK's server (over stdio, so legacy), finds the wrap answers
/// `server/discover` and speaks 2026-07-28 to it — a plain call, the
/// server's question answered by the agent's retry, a blocked call — and
/// forced legacy it speaks the handshake era, as before.
#[test]
fn the_stdio_wrap_serves_a_modern_agent_and_a_legacy_one() {
    let tmp = common::scratch("aip-eras-stdio-");
    let dir = tmp.path();
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: desktop}}\nspec:\n{POLICY}")).unwrap();
    let server = repo().join("target/peers/mcp-conformance-server");
    assert!(
        server.exists(),
        "{} is missing: run `make go-peers`",
        server.display()
    );
    for (mode, version) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let out = Command::new(python())
            .arg(repo().join("sidecar/tests/interop/eras_client.py"))
            .args(["stdio", mode, &calls("test_elicitation").to_string()])
            .arg(env!("CARGO_BIN_EXE_aip-sidecar"))
            .args([
                "stdio",
                "--policy",
                policy.to_str().unwrap(),
                "--audit",
                "/dev/null",
            ])
            .args(["--allow-capability", "elicitation", "--"])
            .arg(&server)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "client failed ({mode}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        check(&report, version);
        assert_eq!(
            report["elicited"][0]["message"], "What is your name?",
            "{report}"
        );
        assert!(
            report["results"][1].to_string().contains("octocat"),
            "{report}"
        );
    }
}

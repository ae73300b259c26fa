//! One pipeline for both agent transports: the same message sequence, sent
//! by an agent over Streamable HTTP and over stdio, gets the same replies,
//! the same audit decisions and redactions, and puts the same bytes on the
//! wire to the upstream. The sequence covers every decision (allowed,
//! blocked, protected path, redacted results, an approved ask), method-name
//! variants, case-variant keys, resources and prompts, a method the gateway
//! only relays, and agent replies to nothing; then the same comparison over
//! generated sequences drawn from the same kinds of message, spelled every
//! way a lenient server might still read as a method or a key.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_policy::CompileOptions;
use aip_sidecar::agent::{http as agent_http, stdio};
use aip_sidecar::audit::Audit;
use aip_sidecar::config::file;
use aip_sidecar::gate::{Gateway, GatewayOptions};
use aip_sidecar::upstream::health::HealthState;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const PATIENCE: Duration = Duration::from_secs(10);

const POLICY: &str = "apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {name: agent}
spec:
  allowed_tools: [up_read, up_leak]
  allowed_methods: [initialize, notifications/initialized, ping, tools/list, tools/call,
    resources/list, resources/read, prompts/list, prompts/get, completion/complete, x/custom,
    notifications/cancelled]
  protected_paths: [/etc/shadow]
  tool_rules:
    - {tool: up_write, action: block}
    - {tool: up_deploy, action: ask}
  dlp:
    patterns:
      - {name: Email, regex: '[a-z]+@[a-z]+\\.io'}
";

/// The messages the agent sends, in order.
fn sequence() -> Vec<String> {
    let call = |id: u64, name: &str, args: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": args}})
        .to_string()
    };
    let request = |id: u64, method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    };
    vec![
        request(
            1,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}),
        ),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
        request(2, "tools/list", json!({})),
        call(3, "up_read", json!({"path": "/tmp/a"})),
        call(4, "up_write", json!({})),
        call(5, "up_leak", json!({})),
        call(6, "up_read", json!({"path": "/etc/shadow"})),
        request(7, "TOOLS/CALL", json!({"name": "up_read", "arguments": {}})),
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"up_read","Arguments":{"path":"/etc/shadow"}}}"#.to_owned(),
        request(9, "resources/list", json!({})),
        request(10, "resources/read", json!({"uri": "file:///notes"})),
        request(11, "prompts/list", json!({})),
        request(12, "prompts/get", json!({"name": "up_greet"})),
        request(
            13,
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "greet"},
                "argument": {"name": "who", "value": "a"}}),
        ),
        request(14, "x/custom", json!({"mail": "ops@acme.io"})),
        request(15, "x/denied", json!({})),
        request(16, "ping", json!({})),
        r#"{"jsonrpc":"2.0","id":"stray","result":{}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"up_read"}}"#.to_owned(),
        call(17, "up_deploy", json!({"env": "prod"})),
        call(18, "up_nope", json!({})),
    ]
}

/// An MCP server over HTTP that answers from a script and records every
/// body it receives: the capture device for what the gateway forwards.
struct Recorder {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

fn answer(message: &Value) -> Option<Value> {
    let id = message.get("id")?.clone();
    let method = message["method"].as_str().unwrap_or_default();
    let text = |t: &str| json!({"content": [{"type": "text", "text": t}]});
    let result = match method {
        "initialize" => json!({"protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}, "resources": {}, "prompts": {}, "completions": {}},
            "serverInfo": {"name": "recorder", "version": "1"}}),
        "tools/list" => json!({"tools": [
            {"name": "read", "inputSchema": {"type": "object"}},
            {"name": "leak", "inputSchema": {"type": "object"}},
            {"name": "write", "inputSchema": {"type": "object"}},
            {"name": "deploy", "description": "Ship it.", "inputSchema": {"type": "object"}}]}),
        "tools/call" => match message["params"]["name"].as_str() {
            Some("leak") => {
                let mut r = text("write to ops@acme.io");
                r["structuredContent"] = json!({"owner": "ops@acme.io"});
                r
            }
            Some(name) => text(&format!("{name} {}", message["params"]["arguments"])),
            None => text("?"),
        },
        "resources/list" => json!({"resources": [{"uri": "file:///notes", "name": "notes"}]}),
        "resources/read" => {
            json!({"contents": [{"uri": "file:///notes", "text": "mail ops@acme.io"}]})
        }
        "prompts/list" => json!({"prompts": [{"name": "greet"}]}),
        "prompts/get" => json!({"messages": [{"role": "user",
            "content": {"type": "text", "text": "hi ops@acme.io"}}]}),
        "completion/complete" => json!({"completion": {"values": ["alice"]}}),
        "ping" => json!({}),
        other => json!({"echo": other, "params": message["params"]}),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

async fn recorder(shutdown: CancellationToken) -> Recorder {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let recorded = bodies.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                a = listener.accept() => a.unwrap(),
                () = shutdown.cancelled() => return,
            };
            let recorded = recorded.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let recorded = recorded.clone();
                    async move {
                        if req.method() != hyper::Method::POST {
                            let mut r = Response::new(Full::new(Bytes::new()));
                            *r.status_mut() = hyper::StatusCode::METHOD_NOT_ALLOWED;
                            return Ok::<_, Infallible>(r);
                        }
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let message: Value = serde_json::from_slice(&body).unwrap();
                        recorded.lock().unwrap().push(message.clone());
                        let mut r = match answer(&message) {
                            Some(reply) => Response::new(Full::new(Bytes::from(reply.to_string()))),
                            None => {
                                let mut r = Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = hyper::StatusCode::ACCEPTED;
                                r
                            }
                        };
                        r.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        r.headers_mut()
                            .insert("mcp-session-id", "s-1".parse().unwrap());
                        Ok(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Recorder { url, bodies }
}

/// Audit lines into memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// The audit lines without their timestamps, and with the held call's
    /// approval id (random, one per ask) only said to be there.
    fn records(&self) -> Vec<Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                let line = v.as_object_mut().unwrap();
                line.remove("timestamp");
                if let Some(id) = line.get_mut("approval") {
                    assert!(id.as_str().unwrap().starts_with("ap-"), "{id}");
                    *id = Value::from("ap-...");
                }
                v
            })
            .collect()
    }
}

struct Run {
    replies: Vec<Option<Value>>,
    audit: Vec<Value>,
    forwarded: Vec<Value>,
}

/// A fresh recorder and gateway, healthy and ready.
async fn gateway(shutdown: &CancellationToken) -> (Arc<Gateway>, Recorder, Lines) {
    let recorder = recorder(shutdown.clone()).await;
    let text = format!(
        "{POLICY}---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: up}}\nspec:\n  url: {}\n  toolPrefix: up_\n  healthCheck: {{intervalSeconds: 3600}}\n",
        recorder.url
    );
    let config = file::parse(&text, &CompileOptions::default()).unwrap();
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(config));
    std::mem::forget(tx); // the configuration never changes
    let lines = Lines::default();
    let gateway = Gateway::new(
        rx,
        Audit::new(Box::new(lines.clone())),
        GatewayOptions::default(),
        shutdown.clone(),
    );
    let mut health = gateway.connections()[0].subscribe();
    tokio::time::timeout(PATIENCE, health.wait_for(|s| *s == HealthState::Healthy))
        .await
        .unwrap()
        .unwrap();
    (gateway, recorder, lines)
}

/// Approves the one ask when it appears.
fn approve_when_asked(gateway: &Arc<Gateway>) {
    let approvals = gateway.approvals.clone();
    tokio::spawn(async move {
        let mut changes = approvals.subscribe();
        loop {
            if let Some(ask) = approvals.list().first() {
                approvals.decide(&ask.id, true).unwrap();
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
}

fn finish(replies: Vec<Option<Value>>, recorder: &Recorder, lines: &Lines) -> Run {
    // What the gateway sent for the agent; its own health checks aside.
    let forwarded = recorder
        .bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|m| {
            let id = m["id"].as_str().unwrap_or_default();
            !(id.starts_with("aip-init-") || id.starts_with("aip-list-"))
                && m["method"] != "notifications/initialized"
        })
        .cloned()
        .collect();
    Run {
        replies,
        audit: lines.records(),
        forwarded,
    }
}

async fn over_http(sequence: &[String]) -> Run {
    let shutdown = CancellationToken::new();
    let (gateway, recorder, lines) = gateway(&shutdown).await;
    approve_when_asked(&gateway);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(agent_http::serve(
        gateway.clone(),
        listener,
        agent_http::default_limits(),
        shutdown.clone(),
        TaskTracker::new(),
    ));
    let client = reqwest_like::Client::new(addr);
    let mut session = None;
    let mut replies = Vec::new();
    for body in sequence {
        let (status, headers, text) = client.post(body, session.as_deref()).await;
        if let Some(s) = headers {
            session = Some(s);
        }
        replies.push(match status {
            202 => None,
            200 => Some(serde_json::from_str(&text).unwrap()),
            other => panic!("{other}: {text}"),
        });
    }
    let run = finish(replies, &recorder, &lines);
    shutdown.cancel();
    run
}

async fn over_stdio(sequence: &[String]) -> Run {
    let shutdown = CancellationToken::new();
    let (gateway, recorder, lines) = gateway(&shutdown).await;
    approve_when_asked(&gateway);
    let (agent, served) = tokio::io::duplex(1 << 20);
    let (served_in, served_out) = tokio::io::split(served);
    let serving = tokio::spawn(stdio::serve(gateway.clone(), served_in, served_out));
    let (from, mut to) = tokio::io::split(agent);
    let mut from = BufReader::new(from).lines();
    let mut replies = Vec::new();
    // One message at a time, each answered (or not) before the next, as the
    // HTTP agent does: the upstream sees the same order.
    for body in sequence {
        to.write_all(format!("{body}\n").as_bytes()).await.unwrap();
        let message: Value = serde_json::from_str(body).unwrap();
        // Requests are answered, and so is a request without an id (it is
        // refused); notifications and the agent's replies are not.
        let method = message["method"].as_str();
        let expects_reply =
            method.is_some_and(|m| message.get("id").is_some() || !m.starts_with("notifications/"));
        if !expects_reply {
            replies.push(None);
            continue;
        }
        // The tool-list notices come on stdout too (over HTTP they go to
        // the GET stream): they are not replies.
        let reply = loop {
            let line = tokio::time::timeout(PATIENCE, from.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["method"] != "notifications/tools/list_changed" {
                break message;
            }
        };
        replies.push(Some(reply));
    }
    to.shutdown().await.unwrap(); // end of the agent's input
    tokio::time::timeout(PATIENCE, serving)
        .await
        .unwrap()
        .unwrap();
    let run = finish(replies, &recorder, &lines);
    shutdown.cancel();
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_stdio_agents_get_one_pipeline() {
    let sent = sequence();
    let http = over_http(&sent).await;
    let stdio = over_stdio(&sent).await;
    same(&sent, &http, &stdio);

    // And what they agree on is right: decisions, redactions, refusals.
    let reply = |i: usize| http.replies[i].clone().unwrap_or(Value::Null);
    assert_eq!(
        reply(3)["result"]["content"][0]["text"],
        r#"read {"path":"/tmp/a"}"#
    );
    assert_eq!(reply(4)["error"]["code"], -32001);
    assert_eq!(
        reply(5)["result"]["structuredContent"]["owner"],
        "[REDACTED:Email]"
    );
    assert_eq!(reply(6)["error"]["code"], -32007);
    assert_eq!(reply(7)["error"]["code"], -32600, "misspelled method");
    assert_eq!(reply(8)["error"]["code"], -32602, "case-variant key");
    assert_eq!(
        reply(10)["result"]["contents"][0]["text"],
        "mail [REDACTED:Email]"
    );
    assert_eq!(
        reply(12)["result"]["messages"][0]["content"]["text"],
        "hi [REDACTED:Email]"
    );
    assert_eq!(reply(13)["result"]["completion"]["values"][0], "alice");
    assert_eq!(reply(14)["result"]["echo"], "x/custom");
    assert_eq!(
        reply(14)["result"]["params"]["mail"],
        "[REDACTED:Email]",
        "a relayed method's result is redacted too"
    );
    assert_eq!(reply(15)["error"]["code"], -32006, "not in allowed_methods");
    assert_eq!(
        reply(19)["result"]["content"][0]["text"],
        r#"deploy {"env":"prod"}"#
    );
    assert_eq!(reply(20)["error"]["code"], -32001, "not in allowed_tools");
    let methods: Vec<&str> = http
        .forwarded
        .iter()
        .map(|m| m["method"].as_str().unwrap_or_default())
        .collect();
    assert!(
        !http
            .forwarded
            .iter()
            .any(|m| m.to_string().contains("shadow")),
        "no protected path reached the server: {methods:?}"
    );
    assert_eq!(
        http.forwarded
            .iter()
            .filter(|m| m["method"] == "tools/call")
            .count(),
        3,
        "read, leak and the approved deploy: {methods:?}"
    );
}

/// Both runs of `sent` agree: replies, audit lines, forwarded bytes; and no
/// agent reply to nothing reached the server.
fn same(sent: &[String], http: &Run, stdio: &Run) {
    assert_eq!(http.replies.len(), stdio.replies.len());
    for (i, (h, s)) in http.replies.iter().zip(&stdio.replies).enumerate() {
        assert_eq!(h, s, "reply to {}", sent[i]);
    }
    // A notification gets no reply to wait for, so the line after it may be
    // handled first over stdio: the audit lines are compared as a set.
    let sorted = |lines: &[Value]| {
        let mut lines: Vec<String> = lines.iter().map(Value::to_string).collect();
        lines.sort();
        lines
    };
    assert_eq!(sorted(&http.audit), sorted(&stdio.audit), "audit lines");
    assert_eq!(http.forwarded, stdio.forwarded, "bytes forwarded upstream");
    for run in [http, stdio] {
        for m in &run.forwarded {
            let path = &m["params"]["arguments"]["path"];
            assert!(
                m.get("method").is_some() && (path.is_null() || path == "/tmp/a"),
                "a reply to nothing or a protected path reached the server: {m}"
            );
        }
    }
}

/// Generated sequences: after the handshake, messages of every kind the
/// fixed sequence has, with methods and keys spelled as a lenient server
/// might still read them (case, a zero-width or whitespace tail), tools that
/// are allowed, blocked or unknown, protected paths written as a shell would
/// expand them, and replies to nothing. A fixed seed: the same corpus each
/// run.
mod generated {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use serde_json::json;

    pub const CASES: usize = 64;

    fn spelled(word: &'static str) -> impl Strategy<Value = String> {
        prop_oneof![
            4 => Just(word.to_owned()),
            1 => Just(word.to_uppercase()),
            1 => Just(format!("{word}\u{200b}")),
            1 => Just(format!("{word} ")),
            1 => (0..word.len()).prop_map(move |i| {
                let mut s = word.to_owned();
                s.replace_range(i..=i, &word[i..=i].to_uppercase());
                s
            }),
        ]
    }

    fn message(id: u64) -> impl Strategy<Value = String> {
        let tool = prop_oneof![
            Just("up_read"),
            Just("up_leak"),
            Just("up_write"),
            Just("up_nope")
        ];
        let path = prop_oneof![
            Just("/tmp/a"),
            Just("/etc/shadow"),
            Just("/etc/sha''dow"),
            Just("/e?c/shadow"),
            Just("~root/../../etc/shadow"),
        ];
        let call = (spelled("tools/call"), tool, spelled("arguments"), path).prop_map(
            move |(method, tool, key, path)| {
                let mut params = serde_json::Map::new();
                params.insert("name".to_owned(), json!(tool));
                params.insert(key, json!({"path": path}));
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
            },
        );
        let other = prop_oneof![
            spelled("tools/list"),
            spelled("resources/read"),
            spelled("prompts/get"),
            Just("x/custom".to_owned()),
            Just("x/denied".to_owned()),
            Just("ping".to_owned()),
        ]
        .prop_map(move |method| {
            let params = match method.to_lowercase().trim() {
                "resources/read" => json!({"uri": "file:///notes"}),
                "prompts/get" => json!({"name": "up_greet"}),
                _ => json!({"mail": "ops@acme.io"}),
            };
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
        });
        let stray = prop_oneof![Just(json!("stray")), Just(json!(id + 1000))].prop_map(|id| {
            json!({"jsonrpc": "2.0", "id": id, "result": {"content": []}}).to_string()
        });
        prop_oneof![4 => call, 2 => other, 1 => stray]
    }

    fn sequence() -> impl Strategy<Value = Vec<String>> {
        (3usize..10).prop_flat_map(|n| {
            (0..n as u64)
                .map(|i| message(100 + i).boxed())
                .collect::<Vec<_>>()
        })
    }

    pub fn corpus() -> Vec<Vec<String>> {
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::deterministic_rng(RngAlgorithm::ChaCha),
        );
        let strategy = sequence();
        (0..CASES)
            .map(|_| {
                let mut sent = super::sequence()[..2].to_vec();
                sent.extend(strategy.new_tree(&mut runner).unwrap().current());
                sent
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_sequences_get_the_same_answers_over_both_transports() {
    let corpus = generated::corpus();
    assert_eq!(corpus.len(), generated::CASES);
    for sent in &corpus {
        let http = over_http(sent).await;
        let stdio = over_stdio(sent).await;
        same(sent, &http, &stdio);
    }
}

/// A raw HTTP/1.1 client for the agent side (no client library decides
/// anything for the test).
mod reqwest_like {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub struct Client(SocketAddr);

    impl Client {
        pub fn new(addr: SocketAddr) -> Client {
            Client(addr)
        }

        /// POSTs `body` to /mcp; (status, the session header if any, body).
        pub async fn post(
            &self,
            body: &str,
            session: Option<&str>,
        ) -> (u16, Option<String>, String) {
            let mut stream = tokio::net::TcpStream::connect(self.0).await.unwrap();
            let session = session
                .map(|s| format!("mcp-session-id: {s}\r\n"))
                .unwrap_or_default();
            let head = format!(
                "POST /mcp HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n{session}content-length: {}\r\n\r\n",
                self.0,
                body.len()
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(body.as_bytes()).await.unwrap();
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.unwrap();
            let text = String::from_utf8(raw).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let status = head[9..12].parse().unwrap();
            let session = head
                .lines()
                .find_map(|l| l.strip_prefix("mcp-session-id: "))
                .map(str::to_owned);
            (status, session, body.to_owned())
        }
    }
}

//! No parse differential: every message the strict parser accepts means the
//! same method, tool and arguments to the policy as to every real decoder a
//! server might use — serde_json, Python's `json`, Node's `JSON.parse`, Go's
//! `encoding/json` decoding into typed structs (it matches keys
//! case-insensitively and folds `ſ` and the Kelvin sign) and the official MCP
//! Go SDK's own server — reading either the agent's bytes or the canonical
//! bytes the gateway forwards. The corpus is generated: every key the gateway
//! reads in every spelling that matters (case variants, `\u` escapes, each
//! character some decoder folds to ASCII, zero-width additions), alone and
//! beside the exact key, plus random messages with the quirks smuggling
//! relies on.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aip_mcp::jsonrpc::{Limits, parse};
use aip_policy::{Request, ToolCall};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

const RANDOM_CASES: usize = 3000;

/// Spellings of one key as JSON text: exact, escaped, case-varied, with a
/// character some decoder folds to ASCII, with a zero-width character.
fn spellings(key: &str) -> Vec<String> {
    let mut out = vec![
        key.to_owned(),
        key.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
        key.to_uppercase(),
        capitalized(key),
        format!("{key}\u{200b}"),
        format!("\\u200b{key}"),
    ];
    for (ascii, lookalike) in [('s', 'ſ'), ('k', 'K'), ('i', 'İ'), ('i', 'ı')] {
        if key.contains(ascii) {
            out.push(key.replacen(ascii, &lookalike.to_string(), 1));
        }
    }
    out
}

fn capitalized(key: &str) -> String {
    let mut chars = key.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

/// Every key the gateway reads, in every spelling, alone and beside the
/// exact spelling: the systematic half of the corpus.
fn systematic_corpus() -> Vec<String> {
    let call = |envelope: &[(&str, &str)]| {
        let members: Vec<String> = envelope
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", members.join(","))
    };
    let params = r#"{"name":"read_file","arguments":{"path":"/etc/shadow"}}"#;
    let mut out = Vec::new();
    for (key, value) in [
        ("jsonrpc", r#""2.0""#),
        ("id", "7"),
        ("method", r#""tools/call""#),
        ("params", params),
    ] {
        for spelling in spellings(key) {
            let mut envelope = vec![
                ("jsonrpc", r#""2.0""#),
                ("id", "7"),
                ("method", r#""tools/call""#),
                ("params", params),
            ];
            let position = envelope.iter().position(|(k, _)| *k == key).unwrap();
            envelope[position] = (spelling.as_str(), value);
            out.push(call(&envelope));
            envelope.push((key, value));
            out.push(call(&envelope));
        }
    }
    for (key, value) in [
        ("name", r#""read_file""#),
        ("arguments", r#"{"path":"/etc/shadow"}"#),
        ("_meta", r#"{"progressToken":1}"#),
        ("uri", r#""file:///etc/shadow""#),
    ] {
        for spelling in spellings(key) {
            for beside in [None, Some((key, r#"{"path":"/tmp/x"}"#))] {
                let mut members = vec![
                    r#""name":"list_dir""#.to_owned(),
                    format!("\"{spelling}\":{value}"),
                ];
                if let Some((k, v)) = beside {
                    members.push(format!("\"{k}\":{v}"));
                }
                out.push(format!(
                    r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{{}}}}}"#,
                    members.join(",")
                ));
            }
        }
    }
    for spelling in spellings("path") {
        out.push(format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"read_file","arguments":{{"path":"/tmp/x","{spelling}":"/etc/shadow"}}}}}}"#
        ));
    }
    out
}

/// A key as JSON text for the random half: mostly exact, sometimes another
/// spelling.
fn key(name: &'static str) -> impl Strategy<Value = String> {
    let others = spellings(name);
    prop_oneof![
        12 => Just(format!("\"{name}\"")),
        1 => prop::sample::select(others).prop_map(|s| format!("\"{s}\"")),
    ]
}

fn string_text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "a",
        "Z",
        "/",
        " ",
        "é",
        "😀",
        "\\n",
        "\\\"",
        "\\\\",
        "\\u00e9",
        "\\ud83d\\ude00",
        "\\u0000",
        "\\t",
        "ſ",
        "\\u017f",
    ]);
    prop::collection::vec(pieces, 0..6).prop_map(|v| format!("\"{}\"", v.concat()))
}

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i32>().prop_map(|n| n.to_string()),
        (-(1i64 << 60)..(1i64 << 60)).prop_map(|n| n.to_string()),
        Just("9007199254740991".to_owned()),
        Just("9007199254740993".to_owned()),
        Just("-0".to_owned()),
        Just("1E3".to_owned()),
        Just("2.5e-3".to_owned()),
        Just("1e21".to_owned()),
        Just("0.1".to_owned()),
        (any::<f32>().prop_filter("finite", |f| f.is_finite())).prop_map(|f| format!("{f:?}")),
    ]
}

fn value_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        number_text(),
        string_text(),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(
                (
                    prop::sample::select(vec!["path", "url", "a", "A", "mode", "b", "Path"]),
                    inner
                ),
                0..4
            )
            .prop_map(|kv| format!(
                "{{{}}}",
                kv.iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        ]
    })
}

fn message_text() -> impl Strategy<Value = String> {
    (
        key("method"),
        key("params"),
        key("arguments"),
        key("name"),
        prop::sample::select(vec!["\"tools/call\"", "\"tools\\/call\"", "\"tools/list\""]),
        string_text(),
        value_text(),
        prop::option::of((
            key("method"),
            prop::sample::select(vec!["\"ping\"", "\"tools/call\""]),
        )),
        prop::sample::select(vec!["", " ", "\n", "\t \r\n"]),
        any::<bool>(),
    )
        .prop_map(|(mk, pk, ak, nk, method, name, args, extra, ws, reorder)| {
            let params = format!("{{{nk}:{name},{ak}:{args}}}");
            let mut members = vec![
                "\"jsonrpc\":\"2.0\"".to_owned(),
                "\"id\":1".to_owned(),
                format!("{mk}:{method}"),
                format!("{pk}:{params}"),
            ];
            if let Some((k, v)) = extra {
                members.push(format!("{k}:{v}"));
            }
            if reorder {
                members.reverse();
            }
            format!("{ws}{{{ws}{}{ws}}}{ws}", members.join(&format!(",{ws}")))
        })
}

fn random_corpus() -> Vec<String> {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = message_text();
    (0..RANDOM_CASES)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

/// What the policy evaluates: [method, tool, arguments], or None when the
/// gateway refuses the message (strict parse, or a tools/call whose params
/// the policy cannot read, which it blocks).
fn policy_view(text: &str) -> Option<(Value, String)> {
    let message = parse(text.as_bytes(), Limits::default()).ok()?;
    let request = Request::from_value(&message.value).ok()?;
    let view = if request.method == "tools/call" {
        let call = ToolCall::from_params(request.params).ok()?;
        json!([request.method, call.name, call.arguments])
    } else {
        json!([request.method, null, null])
    };
    Some((view, String::from_utf8(message.to_bytes()).unwrap()))
}

/// [method, name, arguments] as an exact-match reader sees them.
fn exact_view(v: &Value) -> Value {
    let params = v.get("params");
    let is_call = v.get("method").and_then(Value::as_str) == Some("tools/call");
    json!([
        v.get("method"),
        params.filter(|_| is_call).and_then(|p| p.get("name")),
        params.filter(|_| is_call).and_then(|p| p.get("arguments"))
    ])
}

/// Equality with numbers compared by value (Python prints 1e+16 where Rust
/// keeps 10000000000000000; Go keeps the text as sent).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

const PYTHON: &str = r#"
import json, sys
out = []
for text in json.load(sys.stdin):
    try:
        v = json.loads(text)
        p = v.get("params") if v.get("method") == "tools/call" else None
        p = p if isinstance(p, dict) else {}
        out.append([v.get("method"), p.get("name"), p.get("arguments")])
    except Exception as e:
        out.append({"error": str(e)})
json.dump(out, sys.stdout)
"#;

const NODE: &str = r#"
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((text) => {
    try {
      const v = JSON.parse(text);
      const p = v.method === "tools/call" && v.params && typeof v.params === "object" ? v.params : {};
      return [v.method ?? null, p.name ?? null, p.arguments ?? null];
    } catch (e) {
      return { error: String(e) };
    }
  });
  process.stdout.write(JSON.stringify(out));
});
"#;

/// Runs a decoder over the texts (a JSON array on stdin, one view each on
/// stdout).
fn run_decoder(mut command: Command, texts: &[String]) -> Vec<Value> {
    let program = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let input = serde_json::to_vec(texts).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{program} failed");
    let views: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(views.len(), texts.len(), "{program}");
    views
}

fn go_decoders() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/peers/aip-decoders");
    assert!(
        path.exists(),
        "{} is missing: run scripts/ensure-go-peers.sh (make test does)",
        path.display()
    );
    path
}

/// Every decoder's view of each text: name -> views.
fn decode_everywhere(texts: &[String]) -> Vec<(&'static str, Vec<Value>)> {
    let serde: Vec<Value> = texts
        .iter()
        .map(|t| match serde_json::from_str::<Value>(t) {
            Ok(v) => exact_view(&v),
            Err(e) => json!({"error": e.to_string()}),
        })
        .collect();
    let mut python = Command::new("python3");
    python.args(["-c", PYTHON]);
    let mut node = Command::new("node");
    node.args(["-e", NODE]);
    let go = run_decoder(Command::new(go_decoders()), texts);
    let pick = |name: &str| go.iter().map(|v| v[name].clone()).collect::<Vec<_>>();
    vec![
        ("serde_json", serde),
        ("python json", run_decoder(python, texts)),
        ("node JSON.parse", run_decoder(node, texts)),
        ("go encoding/json", pick("encoding/json")),
        ("go MCP SDK", pick("go-sdk")),
    ]
}

#[test]
fn accepted_messages_mean_the_same_to_every_decoder() {
    let systematic = systematic_corpus();
    let random = random_corpus();
    let mut accepted = Vec::new();
    let mut refused = 0;
    for text in systematic.iter().chain(&random) {
        match policy_view(text) {
            Some((view, forwarded)) => accepted.push((text.clone(), view, forwarded)),
            None => refused += 1,
        }
    }
    let total = systematic.len() + random.len();
    assert!(
        accepted.len() > total / 5,
        "only {} of {total} accepted: the generator is too hostile",
        accepted.len()
    );
    assert!(
        refused > total / 20,
        "{refused} refused: the generator is too tame"
    );

    let originals: Vec<String> = accepted.iter().map(|(t, _, _)| t.clone()).collect();
    let forwarded: Vec<String> = accepted.iter().map(|(_, _, f)| f.clone()).collect();
    let mut differences = Vec::new();
    for (bytes, texts) in [("the agent's", &originals), ("the forwarded", &forwarded)] {
        for (decoder, views) in decode_everywhere(texts) {
            for (i, (text, ours, _)) in accepted.iter().enumerate() {
                if !same(ours, &views[i]) {
                    differences.push(format!(
                        "{decoder} on {bytes} bytes of\n  {text}\n  policy:  {ours}\n  decoder: {}",
                        views[i]
                    ));
                }
            }
        }
    }
    eprintln!(
        "{total} messages ({} systematic), {} accepted, {refused} refused, {} differences",
        systematic.len(),
        accepted.len(),
        differences.len()
    );
    assert!(
        differences.is_empty(),
        "{} differences:\n{}",
        differences.len(),
        differences[..differences.len().min(10)].join("\n")
    );
}

/// The folding table covers what Go's `encoding/json` folds, as Go itself
/// reports it.
#[test]
fn go_folds_nothing_the_gateway_does_not() {
    let out = Command::new(go_decoders()).arg("-folds").output().unwrap();
    assert!(out.status.success());
    let folds: Vec<(String, String)> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(folds.len() >= 4, "{folds:?}");
    for (rune, ascii) in folds {
        assert_eq!(
            aip_mcp::jsonrpc::key_skeleton(&rune),
            ascii,
            "Go folds {rune:?} to {ascii:?}"
        );
    }
}

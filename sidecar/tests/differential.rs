//! No parse differential: every message the strict parser accepts decodes to
//! the same method, tool and arguments under serde_json and under Python's
//! `json` module — both the bytes the agent sent and the canonical bytes the
//! gateway forwards. Messages are generated with the quirks smuggling relies
//! on: escaped and case-varied keys, duplicates, every number form, Unicode.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use aip_sidecar::jsonrpc::{Limits, parse};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value;

const CASES: usize = 3000;

/// A key as JSON text: plain, partly \u-escaped, or case-varied.
fn key(name: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just(format!("\"{name}\"")),
        1 => Just(format!("\"{}\"", name.chars().map(|c| format!("\\u{:04x}", c as u32)).collect::<String>())),
        1 => Just(format!("\"{}\"", name.to_uppercase())),
        1 => Just(format!("\"{}\"", name.replace('s', "ſ"))),
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
                    prop::sample::select(vec!["path", "url", "a", "A", "mode", "b"]),
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
        prop::sample::select(vec![
            "\"tools/call\"",
            "\"tools\\/call\"",
            "\"TOOLS/CALL\"",
            "\"tools/list\"",
        ]),
        string_text(),
        value_text(),
        prop::option::of((
            key("method"),
            prop::sample::select(vec!["\"ping\"", "\"tools/call\""]),
        )),
        prop::sample::select(vec!["", " ", "\n", "\t \r\n"]),
        any::<bool>(),
    )
        .prop_map(|(mk, pk, ak, method, name, args, extra, ws, reorder)| {
            let params = format!("{{\"name\":{name},{ak}:{args}}}");
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

/// (method, tool, arguments) of a decoded message.
fn triple(v: &Value) -> Value {
    serde_json::json!([
        v.get("method"),
        v.pointer("/params/name"),
        v.pointer("/params/arguments")
    ])
}

/// Equality with numbers compared by value (Python prints 1e+16 where Rust
/// keeps 10000000000000000; both are the same number).
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
        out.append([v.get("method"), (v.get("params") or {}).get("name"), (v.get("params") or {}).get("arguments")])
    except Exception as e:
        out.append({"error": str(e)})
json.dump(out, sys.stdout)
"#;

fn python_decode(texts: &[String]) -> Vec<Value> {
    let mut child = Command::new("python3")
        .args(["-c", PYTHON])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is on the machine");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn accepted_messages_mean_the_same_to_python() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = message_text();
    let texts: Vec<String> = (0..CASES)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();

    let mut accepted = Vec::new();
    for text in &texts {
        if let Ok(m) = parse(text.as_bytes(), Limits::default()) {
            let forwarded = String::from_utf8(m.to_bytes()).unwrap();
            accepted.push((text.clone(), triple(&m.value), forwarded));
        }
    }
    assert!(
        accepted.len() > CASES / 5,
        "only {} of {CASES} accepted: the generator is too hostile",
        accepted.len()
    );
    assert!(
        accepted.len() < CASES,
        "nothing refused: the generator is too tame"
    );

    let originals: Vec<String> = accepted.iter().map(|(t, _, _)| t.clone()).collect();
    let forwarded: Vec<String> = accepted.iter().map(|(_, _, f)| f.clone()).collect();
    let from_original = python_decode(&originals);
    let from_forwarded = python_decode(&forwarded);
    for (i, (text, ours, fwd)) in accepted.iter().enumerate() {
        assert!(
            same(ours, &from_original[i]),
            "differential on the agent's bytes:\n{text}\nours:   {ours}\npython: {}",
            from_original[i]
        );
        assert!(
            same(ours, &from_forwarded[i]),
            "differential on the forwarded bytes:\n{fwd}\nours:   {ours}\npython: {}",
            from_forwarded[i]
        );
    }
}

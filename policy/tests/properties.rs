//! Properties that must hold for every input, not just the examples.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use aip_policy::{
    AgentPolicy, Cause, CompileOptions, Decision, Evaluator, Request, normalize_name,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Names mixing ASCII, case, whitespace, invisible and compatibility
/// characters: the inputs normalization is about.
fn tricky_name() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "a", "B", "_", "/", " ", "\t", "\u{200b}", "\u{200c}", "\u{feff}", "\u{2003}", "\u{3000}",
        "ｄ", "Ｘ", "\u{fb01}", "\u{b2}", "\u{301}", "e\u{301}", "\u{130}", "ß", "\u{1e9e}", "Ω",
        "\u{2126}", "\u{202e}", "\u{0}", "\u{7f}", "𝐞", "ǅ", "\u{345}", "\u{e000}",
    ]);
    prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        tricky_name().prop_map(Value::String),
        Just(json!("~/.ssh/id_rsa")),
        Just(json!("file:///etc/%73hadow")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A policy exercising every tool-rule feature, in the given mode.
fn policy_yaml(mode: &str) -> String {
    format!(
        r#"apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {{name: prop}}
spec:
  mode: {mode}
  allowed_tools: [read, write, "Ｌist"]
  protected_paths: [~/.ssh, /etc/shadow]
  tool_rules:
    - {{tool: write, action: block}}
    - {{tool: deploy, action: ask, allow_args: {{env: '^(prod|dev)$'}}}}
    - {{tool: read, strict_args: true, allow_args: {{path: '^/srv/'}}}}
    - {{tool: search, allow_args: {{q: '^[a-z ]+$'}}}}
    - {{tool: hot, rate_limit: 1/hour}}
"#
    )
}

fn evaluator(mode: &str) -> Evaluator {
    let options = CompileOptions {
        home: Some("/home/a".into()),
        ..CompileOptions::default()
    };
    Evaluator::from_yaml(&policy_yaml(mode), &options).unwrap()
}

fn tool_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "read", "write", "list", "deploy", "search", "hot", "other", "READ", "ｗrite"
        ])
        .prop_map(str::to_owned),
        tricky_name(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn normalization_is_idempotent(name in prop_oneof![tricky_name(), any::<String>()]) {
        let once = normalize_name(&name).into_owned();
        prop_assert_eq!(normalize_name(&once).into_owned(), once);
    }

    #[test]
    fn evaluation_never_panics(name in prop_oneof![tool_name(), any::<String>()], args in json_value(), method in tricky_name()) {
        let e = evaluator("enforce");
        let v = e.evaluate_call(&json!(1), &name, &args);
        // A tools/call with non-object arguments is malformed, and says so.
        if !args.is_object() && !args.is_null() {
            prop_assert_eq!(v.cause, Some(Cause::InvalidParams));
        }
        let msg = json!({"jsonrpc": "2.0", "id": "x", "method": method, "params": {"name": name, "arguments": args}});
        let request = Request::from_value(&msg).unwrap();
        let _ = e.evaluate(&request);
        let _ = Evaluator::deny_all().evaluate(&request);
    }

    #[test]
    fn monitor_mode_never_blocks_what_only_a_tool_rule_blocks(
        calls in prop::collection::vec((tool_name(), prop::collection::btree_map("[a-z]{1,5}", json_value(), 0..3)), 1..6)
    ) {
        // Fresh evaluators per mode, fed the same sequence, so rate-limit
        // state matches call for call.
        let (enforce, monitor) = (evaluator("enforce"), evaluator("monitor"));
        for (name, args) in calls {
            let args = Value::Object(args.into_iter().collect::<Map<_, _>>());
            let e = enforce.evaluate_call(&json!(1), &name, &args);
            let m = monitor.evaluate_call(&json!(1), &name, &args);
            prop_assert_eq!(e.violation, m.violation);
            prop_assert_eq!(e.cause, m.cause);
            let tool_rule_only = matches!(e.cause, Some(
                Cause::ToolBlocked | Cause::ToolNotAllowed | Cause::ArgumentMissing
                | Cause::ArgumentMismatch | Cause::UndeclaredArgument));
            if tool_rule_only {
                prop_assert_eq!(e.decision, Decision::Block);
                prop_assert_eq!(m.decision, Decision::Allow);
                prop_assert!(m.error().is_none());
            } else {
                prop_assert_eq!(e.decision, m.decision);
            }
        }
    }

    #[test]
    fn policy_hash_is_stable_under_reordering_and_formatting(seed in any::<u64>(), flow in any::<bool>(), quote in any::<bool>()) {
        let reference = AgentPolicy::from_yaml(&render(0, false, false)).unwrap();
        let variant = AgentPolicy::from_yaml(&render(seed, flow, quote)).unwrap();
        prop_assert_eq!(aip_policy::hash::policy_hash(&reference), aip_policy::hash::policy_hash(&variant));
    }
}

/// The same policy rendered with keys in a seed-chosen order, block or flow
/// style, and plain or quoted scalars.
fn render(seed: u64, flow: bool, quote: bool) -> String {
    let q = |s: &str| {
        if quote {
            format!("\"{s}\"")
        } else {
            s.to_owned()
        }
    };
    let mut rule = vec![
        format!("tool: {}", q("fetch")),
        format!("action: {}", q("allow")),
        format!("rate_limit: {}", q("5/minute")),
        format!("allow_args: {{url: '^https://', mode: {}}}", q("read")),
    ];
    let mut spec = vec![
        format!("mode: {}", q("monitor")),
        format!("allowed_tools: [{}, {}]", q("a"), q("b")),
        "strict_args_default: true".to_owned(),
        "# a comment that changes nothing".to_owned(),
        "protected_paths: [~/.ssh]".to_owned(),
    ];
    let mut top = vec![
        format!("apiVersion: {}", q("aip.io/v1alpha1")),
        format!("kind: {}", q("AgentPolicy")),
        format!("metadata: {{name: {}}}", q("p")),
    ];
    shuffle(&mut rule, seed);
    shuffle(&mut spec, seed.rotate_left(17));
    shuffle(&mut top, seed.rotate_left(31));
    let rule_text = if flow {
        format!("    - {{{}}}\n", rule.join(", "))
    } else {
        let mut lines = rule.iter();
        let first = lines
            .next()
            .map(|l| format!("    - {l}\n"))
            .unwrap_or_default();
        first + &lines.map(|l| format!("      {l}\n")).collect::<String>()
    };
    let mut out = top.join("\n") + "\nspec:\n";
    for line in &spec {
        out += &format!("  {line}\n");
    }
    out + "  tool_rules:\n" + &rule_text
}

fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items.swap(i, (seed >> 33) as usize % (i + 1));
    }
}

fn redactor(detect_encoding: bool) -> aip_policy::Redactor {
    let config = aip_policy::document::DlpConfig {
        enabled: None,
        detect_encoding: Some(detect_encoding),
        filter_stderr: None,
        patterns: vec![aip_policy::document::DlpPattern {
            name: "key".into(),
            regex: "sk-[a-z0-9]{6,}".into(),
        }],
    };
    aip_policy::Redactor::new(&config).unwrap().unwrap()
}

/// Values with secrets planted among the generated ones, some of them
/// encoded.
fn value_with_secrets() -> impl Strategy<Value = Value> {
    let secret = prop_oneof![
        Just(json!("sk-abc123def")),
        Just(json!("token: sk-0123456789 here")),
        // base64 of "sk-abcdef123456", found only with detect_encoding.
        Just(json!("c2stYWJjZGVmMTIzNDU2")),
    ];
    prop_oneof![
        json_value(),
        (json_value(), secret.clone()).prop_map(|(v, s)| json!([v, s])),
        (json_value(), secret).prop_map(|(v, s)| json!({"deep": {"a": [v, {"s": s}]}})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The audit copies arguments only when something in them is to be
    /// redacted: that is found without copying, and agrees with redacting.
    #[test]
    fn would_redact_says_what_redacting_does(value in value_with_secrets(), encoded in any::<bool>()) {
        let r = redactor(encoded);
        let mut copy = value.clone();
        let replaced = r.redact_strings(&mut copy, &mut Vec::new());
        prop_assert_eq!(r.would_redact(&value), replaced);
    }
}

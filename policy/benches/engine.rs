//! The engine cases of the performance table in docs/performance.md, shaped
//! like the AIP reference's measurements so the numbers compare.
//! Run with `make bench` (which prints the table) or `cargo bench -p aip-policy`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::hint::black_box;
use std::time::Duration;

use aip_policy::{CompileOptions, Decision, Evaluator, Request};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

const POLICY_PATH: &str = "/etc/aip/policy.yaml";

fn compile(yaml: &str, protect_policy_file: bool) -> Evaluator {
    let options = CompileOptions {
        home: Some("/home/agent".into()),
        policy_path: protect_policy_file.then(|| POLICY_PATH.to_owned()),
        ..CompileOptions::default()
    };
    Evaluator::from_yaml(yaml, &options).expect("benchmark policy compiles")
}

fn allowlist_policy() -> String {
    "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: bench}\nspec:\n  allowed_tools: [read_file, list_directory, search_files, get_file_info, directory_tree]\n".to_owned()
}

/// 50 tool rules; `query_db` (the one called) has three argument regexes.
fn rules_policy() -> String {
    let mut yaml = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: bench}\nspec:\n  tool_rules:\n".to_owned();
    for i in 0..49 {
        yaml += &format!("    - tool: tool_{i:02}\n      allow_args: {{arg: '^value_{i}$'}}\n");
    }
    yaml += r#"    - tool: query_db
      allow_args:
        url: '^https://github\.com/.*'
        query: '^SELECT\s+.*FROM\s+t\d+(\s+WHERE\s+.*)?$'
        mode: '^(read|list|stat)$'
"#;
    yaml
}

fn message(tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
}

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group.measurement_time(Duration::from_secs(3));

    let allowlist = compile(&allowlist_policy(), false);
    let call = message(
        "search_files",
        json!({"path": "/workspace", "pattern": "*.rs"}),
    );
    let request = Request::from_value(&call).unwrap();
    assert_eq!(allowlist.evaluate(&request).decision, Decision::Allow);
    group.bench_function("allowlist", |b| {
        b.iter(|| black_box(&allowlist).evaluate(black_box(&request)))
    });

    let args = json!({
        "url": "https://github.com/acme/platform/blob/main/README.md",
        "query": "SELECT id, name FROM t42 WHERE owner = 'platform'",
        "mode": "read",
    });
    let call = message("query_db", args);
    let request = Request::from_value(&call).unwrap();
    for (name, protect) in [("rules50_args3", false), ("rules50_args3_protected", true)] {
        let evaluator = compile(&rules_policy(), protect);
        assert_eq!(evaluator.evaluate(&request).decision, Decision::Allow);
        group.bench_function(name, |b| {
            b.iter(|| black_box(&evaluator).evaluate(black_box(&request)))
        });
    }
    group.finish();
}

const DLP_POLICY: &str = r#"apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {name: bench}
spec:
  dlp:
    patterns:
      - {name: AWS Key, regex: '(AKIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ASIA)[A-Z0-9]{16}'}
      - {name: Email, regex: '[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}'}
      - {name: SSN, regex: '\b\d{3}-\d{2}-\d{4}\b'}
      - {name: GitHub Token, regex: 'ghp_[a-zA-Z0-9]{36}'}
      - {name: Card, regex: '\b(?:\d{4}[- ]?){3}\d{4}\b'}
"#;

/// 64 KiB of `ls -l` output.
fn listing() -> String {
    let mut text = String::with_capacity(64 * 1024 + 128);
    let mut i = 0u32;
    while text.len() < 64 * 1024 {
        let size = (i.wrapping_mul(2654435761) >> 12) % 900_000 + 100;
        text += &format!(
            "-rw-r--r--  1 agent staff {size:>8} Nov {:>2} {:02}:{:02} src/module_{i:04}/file_{i:05}.rs\n",
            i % 28 + 1,
            i % 24,
            i % 60
        );
        i += 1;
    }
    text.truncate(64 * 1024);
    text
}

/// The listing with eight secrets spread through it.
fn listing_with_secrets() -> String {
    let secrets = [
        "AKIAIOSFODNN7EXAMPLE",
        "alice@example.com",
        "078-05-1120",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "4111 1111 1111 1111",
        "ASIAY34FZKBOKMUTVV7A",
        "ops.team+alerts@corp.example.org",
        "ghp_ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrq",
    ];
    let mut text = listing();
    let step = text.len() / secrets.len();
    for (n, secret) in secrets.iter().enumerate().rev() {
        let at = text[..n * step + step / 2].rfind('\n').map_or(0, |p| p + 1);
        text.insert_str(at, &format!("# leaked: {secret}\n"));
    }
    text
}

fn dlp(c: &mut Criterion) {
    let evaluator = compile(DLP_POLICY, false);
    let redactor = evaluator.redactor().expect("DLP enabled");
    let mut group = c.benchmark_group("dlp_64k");
    group.measurement_time(Duration::from_secs(4));

    let clean = listing();
    assert!(
        redactor.redact(&clean).events.is_empty(),
        "the clean text must be clean"
    );
    group.throughput(Throughput::Bytes(clean.len() as u64));
    group.bench_function("clean", |b| b.iter(|| redactor.redact(black_box(&clean))));

    let dirty = listing_with_secrets();
    let found: usize = redactor.redact(&dirty).events.iter().map(|e| e.count).sum();
    assert_eq!(found, 8, "all eight secrets are found");
    group.throughput(Throughput::Bytes(dirty.len() as u64));
    group.bench_function("8_secrets", |b| {
        b.iter(|| redactor.redact(black_box(&dirty)))
    });
    group.finish();
}

/// 100 distinct argument regexes over 25 tools, shaped like real rules:
/// URL prefixes, SQL shapes, enumerations and Unicode path classes.
fn regex100_policy() -> String {
    let mut yaml = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: bench}\nspec:\n  tool_rules:\n".to_owned();
    for i in 0..25 {
        yaml += &format!(
            r#"    - tool: tool_{i:02}
      allow_args:
        url: '^https://github\.com/org{i}/.*'
        query: '^SELECT\s+.*FROM\s+t{i}\d+(\s+WHERE\s+.*)?$'
        mode: '^(read|list|stat|op{i})$'
        path: '^/workspace/project{i}/[\w./-]+$'
"#
        );
    }
    yaml
}

fn compiles(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile");
    group.measurement_time(Duration::from_secs(3));
    let yaml = regex100_policy();
    let options = CompileOptions::default();
    // What a reload or a push costs: parse, validate, compile.
    group.bench_function("regex100", |b| {
        b.iter(|| Evaluator::from_yaml(black_box(&yaml), &options).unwrap())
    });
    // The same with every regex built, as the sidecar then does off the
    // hot path.
    group.bench_function("regex100_built", |b| {
        b.iter(|| {
            let evaluator = Evaluator::from_yaml(black_box(&yaml), &options).unwrap();
            evaluator.build_regexes();
            evaluator
        })
    });
    group.finish();
}

criterion_group!(benches, decisions, dlp, compiles);
criterion_main!(benches);

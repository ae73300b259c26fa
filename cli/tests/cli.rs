//! The `aip` binary end to end: real files, real exit codes, exact output.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;

use std::path::PathBuf;

use common::{aip, repo, scratch, stderr, stdout};

#[test]
fn basic_conformance_vectors_all_pass() {
    // `make test SHARED=...` passes the folder on as AIP_SHARED.
    let shared = std::env::var_os("AIP_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared"));
    let basic = shared.join("conformance/basic");
    assert!(
        basic.is_dir(),
        "the shared Basic vectors are expected at {} (set SHARED=... for make, AIP_SHARED=... for cargo test)",
        basic.display()
    );
    let out = aip(&["conformance", basic.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.lines().last(), Some("29 passed, 0 failed"), "{text}");
}

#[test]
fn project_conformance_vectors_all_pass() {
    let out = aip(&["conformance", "conformance/project"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines().last().unwrap().ends_with("passed, 0 failed"),
        "{text}"
    );
}

const FAILING_VECTOR: &str = r#"
name: "Deliberately wrong"
tests:
  - id: "wrong-001"
    policy: |
      apiVersion: aip.io/v1alpha1
      kind: AgentPolicy
      metadata: {name: p}
      spec: {allowed_tools: []}
    input: {method: "tools/call", tool: "x", args: {}}
    expected: {decision: "ALLOW", error_code: null, violation: false}
  - id: "right-001"
    policy: null
    input: {method: "tools/call", tool: "x", args: {}}
    expected: {decision: "BLOCK", error_code: -32001}
"#;

#[test]
fn failing_vector_is_reported_with_expected_and_actual() {
    let tmp = scratch("failing");
    let dir = tmp.path();
    std::fs::write(dir.join("wrong.yaml"), FAILING_VECTOR).unwrap();
    let out = aip(&["conformance", dir.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let fail = text
        .lines()
        .find(|l| l.starts_with("FAIL "))
        .expect("a FAIL line");
    assert!(fail.ends_with(
        "wrong-001: decision: expected ALLOW, got BLOCK; error_code: expected null, got -32001; violation: expected false, got true"
    ), "{fail}");
    assert!(
        text.contains("wrong.yaml (Deliberately wrong): 1 passed, 1 failed"),
        "{text}"
    );
    assert_eq!(text.lines().last(), Some("1 passed, 1 failed"));

    let out = aip(&["conformance", "--json", dir.to_str().unwrap()]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["failed"], 1);
    assert_eq!(
        report["files"][0]["tests"][0]["mismatches"][0]["field"],
        "decision"
    );
}

const INVALID_POLICY_VECTORS: &str = r#"
name: "Refusals"
tests:
  - id: "bad-rate"
    policy: |
      apiVersion: aip.io/v1alpha1
      kind: AgentPolicy
      metadata: {name: p}
      spec: {tool_rules: [{tool: t, rate_limit: "5/fortnight"}]}
    input: {method: "tools/call", tool: "t", args: {}}
    expected: {valid: false}
  - id: "bad-regex-as-error-decision"
    policy: |
      apiVersion: aip.io/v1alpha1
      kind: AgentPolicy
      metadata: {name: p}
      spec: {tool_rules: [{tool: t, allow_args: {a: "("}}]}
    input: {method: "tools/call", tool: "t", args: {}}
    expected: {decision: "ERROR"}
  - id: "good-policy-expected-bad"
    policy: |
      apiVersion: aip.io/v1alpha1
      kind: AgentPolicy
      metadata: {name: p}
      spec: {}
    input: {method: "tools/list"}
    expected: {valid: false}
"#;

#[test]
fn vectors_can_expect_a_policy_to_be_refused() {
    let tmp = scratch("refusals");
    let dir = tmp.path();
    std::fs::write(dir.join("refusals.yaml"), INVALID_POLICY_VECTORS).unwrap();
    let out = aip(&["conformance", dir.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(
        text.contains(
            "good-policy-expected-bad: policy: expected the policy to be refused, got it loaded"
        ),
        "{text}"
    );
    assert_eq!(text.lines().last(), Some("2 passed, 1 failed"), "{text}");
}

/// A vector the runner cannot interpret is never a pass: one that states no
/// expectation, or expects or gives something the runner does not read.
#[test]
fn vectors_the_runner_cannot_interpret_are_unsupported_never_passed() {
    let tmp = scratch("unsupported");
    let dir = tmp.path();
    std::fs::write(
        dir.join("odd.yaml"),
        r#"
name: Odd
tests:
  - id: only-an-id
  - id: unknown-expectation
    policy: null
    input: {method: tools/call, tool: t}
    expected: {decision: BLOCK, audit_line: {event: X}}
  - id: unknown-input
    policy: null
    input: {method: tools/call, tool: t, headers: {x: y}}
    expected: {decision: BLOCK}
  - id: fine
    policy: null
    input: {method: tools/call, tool: t}
    expected: {decision: BLOCK}
"#,
    )
    .unwrap();
    let out = aip(&["conformance", dir.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("UNSUPPORTED")
            && text.contains("only-an-id: the vector states no expected outcome"),
        "{text}"
    );
    assert!(
        text.contains("unknown-expectation: not understood: expected.audit_line"),
        "{text}"
    );
    assert!(
        text.contains("unknown-input: not understood: input.headers"),
        "{text}"
    );
    assert_eq!(
        text.lines().last(),
        Some("1 passed, 0 failed, 3 unsupported"),
        "{text}"
    );
}

#[test]
fn unreadable_vector_file_fails_the_run() {
    let tmp = scratch("garbage");
    let dir = tmp.path();
    std::fs::write(dir.join("bad.yaml"), "tests: [unclosed").unwrap();
    let out = aip(&["conformance", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("ERROR "), "{}", stdout(&out));
    assert_eq!(stdout(&out).lines().last(), Some("0 passed, 1 failed"));
}

#[test]
fn check_reports_all_four_problems_with_field_paths() {
    let out = aip(&["policy", "check", "examples/invalid-policy.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let errors: Vec<String> = stderr(&out).lines().map(str::to_owned).collect();
    let prefix = "examples/invalid-policy.yaml: ";
    assert_eq!(
        errors,
        vec![
            format!(
                "{prefix}apiVersion: unsupported apiVersion \"aip.io/v1beta1\"; expected \"aip.io/v1alpha1\""
            ),
            format!(
                "{prefix}spec.allowed_tool: unknown field; expected one of: mode, allowed_tools, allowed_methods, denied_methods, protected_paths, strict_args_default, tool_rules, dlp"
            ),
            format!(
                "{prefix}spec.tool_rules[0].rate_limit: invalid rate_limit \"10 per minute\": expected \"<N>/<period>\", e.g. \"10/minute\""
            ),
            format!(
                "{prefix}spec.tool_rules[0].allow_args.url: regex parse error at 9: unclosed group"
            ),
        ]
    );
}

#[test]
fn check_accepts_every_example() {
    for example in ["filesystem-readonly", "github-agent", "monitor-rollout"] {
        let out = aip(&["policy", "check", &format!("examples/{example}.yaml")]);
        assert!(out.status.success(), "{example}: {}", stderr(&out));
        assert!(stdout(&out).contains(": ok (policy"), "{}", stdout(&out));
    }
}

#[test]
fn check_accepts_the_cluster_example_and_says_what_it_binds() {
    let out = aip(&["policy", "check", "examples/cluster/agentpolicy.yaml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("; pods app=agent, connections fs, approval timeout 120s"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn check_refuses_a_cluster_object_with_the_binding_field_named() {
    let tmp = scratch("cluster-check");
    let dir = tmp.path();
    let text = std::fs::read_to_string(repo().join("examples/cluster/agentpolicy.yaml"))
        .unwrap()
        .replace("toolConnections: [fs]", "toolConnections: [Not_A_Name]");
    let file = dir.join("bad.yaml");
    std::fs::write(&file, text).unwrap();
    let out = aip(&["policy", "check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("spec.toolConnections[0]"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn eval_prints_the_exact_error_response() {
    let request = r#"{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"delete_repository","arguments":{"repo":"x"}}}"#;
    let out = aip(&[
        "policy",
        "eval",
        "examples/github-agent.yaml",
        "--request",
        request,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("decision:  BLOCK\n"), "{text}");
    assert!(text.contains(
        r#"response:  {"error":{"code":-32001,"data":{"reason":"Tool is blocked by policy","tool":"delete_repository"},"message":"Forbidden"},"id":"r-1","jsonrpc":"2.0"}"#
    ), "{text}");
}

#[test]
fn eval_protects_the_policy_file_itself() {
    let path = std::path::absolute(repo().join("examples/monitor-rollout.yaml")).unwrap();
    let request = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"list_tables","arguments":{"file": path.display().to_string()}}});
    let out = aip(&[
        "policy",
        "eval",
        "--json",
        "examples/monitor-rollout.yaml",
        "--request",
        &request.to_string(),
    ]);
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["decision"], "BLOCK");
    assert_eq!(verdict["error"]["code"], -32007);
}

#[test]
fn eval_resolves_an_ask_with_the_given_answer() {
    let request = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"merge_pull_request","arguments":{"owner":"acme","merge_method":"squash"}}}"#;
    let asked = aip(&[
        "policy",
        "eval",
        "examples/github-agent.yaml",
        "--request",
        request,
    ]);
    assert!(
        stdout(&asked).contains("decision:  ASK"),
        "{}",
        stdout(&asked)
    );
    let denied = aip(&[
        "policy",
        "eval",
        "--json",
        "examples/github-agent.yaml",
        "--request",
        request,
        "--approval",
        "deny",
    ]);
    let verdict: serde_json::Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert_eq!(verdict["response"]["error"]["code"], -32004);
    assert_eq!(verdict["response"]["error"]["message"], "User denied");
}

#[test]
fn eval_refuses_a_malformed_request_with_the_field() {
    let out = aip(&[
        "policy",
        "eval",
        "examples/github-agent.yaml",
        "--request",
        r#"{"jsonrpc":"1.0","method":"ping"}"#,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("jsonrpc: must be the string \"2.0\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn convert_moves_version_and_owner_into_annotations_and_keeps_the_hash() {
    let out = aip(&["policy", "convert", "examples/filesystem-readonly.yaml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let yaml = stdout(&out);
    assert!(yaml.contains("aip.io/version: \"1.2.0\""), "{yaml}");
    assert!(
        yaml.contains("aip.io/owner: platform-team@example.com"),
        "{yaml}"
    );
    assert!(!yaml.contains("\n  version:"), "{yaml}");
    let original = aip_policy::AgentPolicy::from_yaml(
        &std::fs::read_to_string(repo().join("examples/filesystem-readonly.yaml")).unwrap(),
    )
    .unwrap();
    let converted = aip_policy::AgentPolicy::from_yaml(&yaml).unwrap();
    assert_eq!(converted.spec, original.spec);
    assert_eq!(
        aip_policy::hash::policy_hash(&converted),
        aip_policy::hash::policy_hash(&original)
    );
}

#[test]
fn convert_refuses_a_name_kubernetes_cannot_hold() {
    let tmp = scratch("convert");
    let dir = tmp.path();
    let file = dir.join("p.yaml");
    std::fs::write(
        &file,
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: My_Agent}\nspec: {}\n",
    )
    .unwrap();
    let out = aip(&["policy", "convert", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(
        "metadata.name \"My_Agent\" is not a valid Kubernetes name: it contains 'M'; only lowercase letters, digits, '-' and '.' are allowed"
    ), "{}", stderr(&out));
}

#[test]
fn redact_applies_the_policy_patterns() {
    let out = aip(&[
        "policy",
        "redact",
        "examples/filesystem-readonly.yaml",
        "--text",
        "key AKIAIOSFODNN7EXAMPLE here",
    ]);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "key [REDACTED:AWS Key] here\n");
    assert!(stderr(&out).contains("DLP_TRIGGERED rule=\"AWS Key\" count=1"));
}

//! Validation of the document (spec §1): every rule, each error with its path.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use aip_policy::AgentPolicy;

fn errors(yaml: &str) -> Vec<String> {
    match AgentPolicy::from_yaml(yaml) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

fn with_spec(spec: &str) -> String {
    format!("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata:\n  name: p\nspec:\n{spec}")
}

#[test]
fn a_minimal_policy_is_valid() {
    assert_eq!(errors(&with_spec("  {}")), Vec::<String>::new());
}

#[test]
fn header_fields() {
    assert_eq!(
        errors("kind: Policy\nmetadata: {}\nspec: {}"),
        vec![
            "apiVersion: required field is missing",
            "kind: unexpected kind \"Policy\"; expected \"AgentPolicy\"",
            "metadata.name: required field is missing",
        ]
    );
    assert_eq!(
        errors("apiVersion: aip.io/v1alpha2\nkind: AgentPolicy\nmetadata: {name: ''}"),
        vec![
            "apiVersion: unsupported apiVersion \"aip.io/v1alpha2\"; expected \"aip.io/v1alpha1\"",
            "metadata.name: must not be empty",
            "spec: required field is missing",
        ]
    );
}

#[test]
fn unknown_fields_are_refused_at_every_level() {
    let yaml = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nstatus: {}\nmetadata: {name: p, uid: x}\nspec:\n  modes: enforce\n  tool_rules:\n    - {tool: t, actions: block}\n  dlp:\n    enable: true\n    patterns: [{name: n, regex: x, scope: all}]";
    let errs = errors(yaml);
    for path in [
        "status",
        "metadata.uid",
        "spec.modes",
        "spec.tool_rules[0].actions",
        "spec.dlp.enable",
        "spec.dlp.patterns[0].scope",
    ] {
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&format!("{path}: unknown field"))),
            "{path} in {errs:?}"
        );
    }
}

#[test]
fn enumerations() {
    assert_eq!(
        errors(&with_spec(
            "  mode: audit\n  tool_rules:\n    - {tool: t, action: deny}"
        )),
        vec![
            "spec.mode: invalid mode \"audit\"; expected one of: enforce, monitor",
            "spec.tool_rules[0].action: invalid action \"deny\"; expected one of: allow, block, ask",
        ]
    );
}

#[test]
fn types_are_checked_with_the_field_named() {
    assert_eq!(
        errors(&with_spec(
            "  allowed_tools: read_file\n  strict_args_default: 'yes'\n  denied_methods: [1]\n  tool_rules:\n    - {tool: t, allow_args: {n: 5}}"
        )),
        vec![
            "spec.allowed_tools: must be a list, found a string",
            "spec.denied_methods[0]: must be a string, found a number",
            "spec.strict_args_default: must be true or false, found a string",
            "spec.tool_rules[0].allow_args.n: must be a string, found a number (quote it)",
        ]
    );
}

#[test]
fn regex_errors_name_the_argument_and_the_byte() {
    assert_eq!(
        errors(&with_spec(
            "  tool_rules:\n    - tool: f\n      allow_args:\n        \"my.url\": '^(a'"
        )),
        vec!["spec.tool_rules[0].allow_args[\"my.url\"]: regex parse error at 1: unclosed group"]
    );
}

#[test]
fn oversized_regex_is_a_validation_error() {
    let errs = errors(&with_spec(
        "  dlp:\n    patterns:\n      - {name: big, regex: '(\\w{500}){500}'}",
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("spec.dlp.patterns[0].regex: regex is too large"),
        "{errs:?}"
    );
}

#[test]
fn rate_limits_must_parse() {
    assert_eq!(
        errors(&with_spec(
            "  tool_rules:\n    - {tool: t, rate_limit: 5/day}"
        )),
        vec![
            "spec.tool_rules[0].rate_limit: invalid rate_limit \"5/day\": the period must be second|sec|s, minute|min|m or hour|hr|h"
        ]
    );
}

#[test]
fn dlp_patterns_need_name_and_regex() {
    assert_eq!(
        errors(&with_spec(
            "  dlp:\n    patterns:\n      - {regex: x}\n      - {name: n}\n      - {name: m, regex: y}"
        )),
        vec![
            "spec.dlp.patterns[0].name: required field is missing",
            "spec.dlp.patterns[1].regex: required field is missing",
        ]
    );
    assert_eq!(
        errors(&with_spec(
            "  dlp:\n    patterns:\n      - {name: n, regex: x}\n      - {name: n, regex: y}"
        )),
        vec![
            "spec.dlp.patterns[1].name: duplicate DLP pattern name \"n\" (also spec.dlp.patterns[0])"
        ]
    );
}

#[test]
fn duplicate_rules_after_normalization_are_refused() {
    assert_eq!(
        errors(&with_spec(
            "  tool_rules:\n    - {tool: Fetch}\n    - {tool: ' fetch', action: block}"
        )),
        vec![
            "spec.tool_rules[1].tool: duplicate rule for tool \" fetch\" (also spec.tool_rules[0]); merge them into one rule"
        ]
    );
}

#[test]
fn schema_hash_format() {
    let good = format!("sha256:{}", "a".repeat(64));
    assert!(
        errors(&with_spec(&format!(
            "  tool_rules:\n    - {{tool: t, schema_hash: '{good}'}}"
        )))
        .is_empty()
    );
    assert_eq!(
        errors(&with_spec(
            "  tool_rules:\n    - {tool: t, schema_hash: 'md5:abc'}"
        )),
        vec![
            "spec.tool_rules[0].schema_hash: invalid schema_hash \"md5:abc\"; expected \"sha256:\" followed by 64 lowercase hex digits"
        ]
    );
}

#[test]
fn yaml_duplicate_keys_and_non_mappings_are_refused() {
    let errs = errors("apiVersion: aip.io/v1alpha1\napiVersion: aip.io/v1alpha1\n");
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("invalid YAML:"), "{errs:?}");
    assert_eq!(
        errors("- a\n- b\n"),
        vec!["the document must be a mapping, found a list"]
    );
}

#[test]
fn yaml_1_1_booleans_stay_strings() {
    let p = AgentPolicy::from_yaml(&with_spec(
        "  allowed_tools: [on, no, y, off]\n  strict_args_default: true",
    ))
    .unwrap();
    assert_eq!(p.spec.allowed_tools.unwrap(), vec!["on", "no", "y", "off"]);
    assert_eq!(
        errors(&with_spec("  strict_args_default: yes")),
        vec!["spec.strict_args_default: must be true or false, found a string"]
    );
}

#[test]
fn json_policies_are_read_too() {
    let json = r#"{"apiVersion":"aip.io/v1alpha1","kind":"AgentPolicy","metadata":{"name":"j"},"spec":{"allowed_tools":["a"]}}"#;
    assert!(AgentPolicy::from_json(json).is_ok());
    let err = AgentPolicy::from_json("{\"apiVersion\": ")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("invalid JSON at line 1 column"), "{err}");
}

#[test]
fn kubernetes_metadata_is_accepted() {
    let yaml = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata:\n  name: p\n  namespace: agents\n  labels: {team: a}\n  annotations: {aip.io/owner: x}\nspec: {}";
    assert!(errors(yaml).is_empty());
}

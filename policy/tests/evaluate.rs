//! Evaluation, rule by rule and error code by error code (spec §3, §4).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use aip_policy::{
    Approval, AuditRecord, Cause, CompileOptions, Decision, Evaluator, ManualClock, RateClock,
    Request, Verdict, Withdrawal,
};
use serde_json::{Value, json};

fn policy(spec: &str) -> Evaluator {
    let text = format!(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata:\n  name: t\nspec:\n{}",
        indent(spec)
    );
    Evaluator::from_yaml(&text, &options()).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn indent(spec: &str) -> String {
    spec.lines().map(|l| format!("  {l}\n")).collect()
}

fn options() -> CompileOptions {
    CompileOptions {
        home: Some("/home/agent".into()),
        policy_path: Some("/etc/aip/policy.yaml".into()),
        ..CompileOptions::default()
    }
}

fn call(e: &Evaluator, tool: &str, args: Value) -> Verdict {
    e.evaluate_call(&json!(1), tool, &args)
}

fn method(e: &Evaluator, m: &str) -> Verdict {
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": m});
    e.evaluate(&Request::from_value(&msg).unwrap())
}

fn code(v: &Verdict) -> Option<i64> {
    v.error().map(|e| e.code)
}

mod methods {
    use super::*;

    #[test]
    fn default_list_admits_the_mcp_lifecycle_and_blocks_the_rest() {
        let e = policy("allowed_tools: []");
        for m in [
            "initialize",
            "notifications/initialized",
            "ping",
            "tools/list",
            "notifications/cancelled",
        ] {
            assert_eq!(method(&e, m).decision, Decision::Allow, "{m}");
        }
        for m in [
            "resources/read",
            "resources/list",
            "prompts/get",
            "logging/setLevel",
            "sampling/createMessage",
        ] {
            let v = method(&e, m);
            assert_eq!(
                (v.decision, code(&v), v.violation),
                (Decision::Block, Some(-32006), true),
                "{m}"
            );
        }
    }

    #[test]
    fn denied_beats_wildcard_and_the_error_names_the_method() {
        let e = policy("allowed_methods: ['*']\ndenied_methods: [Logging/SetLevel]");
        assert_eq!(method(&e, "anything/else").decision, Decision::Allow);
        let v = method(&e, "logging/setlevel");
        assert_eq!(v.cause, Some(Cause::MethodDenied));
        assert_eq!(
            v.response().unwrap(),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32006, "message": "Method not allowed",
                   "data": {"method": "logging/setlevel", "reason": "Method is in denied_methods"}}})
        );
    }

    #[test]
    fn denying_tools_call_overrides_the_fast_path() {
        let e = policy("allowed_tools: [a]\ndenied_methods: [tools/call]");
        let v = call(&e, "a", json!({}));
        assert_eq!((v.decision, code(&v)), (Decision::Block, Some(-32006)));
        let e = policy("allowed_tools: [a]\nallowed_methods: [initialize]");
        assert_eq!(code(&call(&e, "a", json!({}))), Some(-32006));
    }

    #[test]
    fn an_empty_allowed_methods_list_means_the_defaults() {
        let e = policy("allowed_methods: []");
        assert_eq!(method(&e, "initialize").decision, Decision::Allow);
        assert_eq!(method(&e, "resources/read").decision, Decision::Block);
    }

    #[test]
    fn notifications_get_a_verdict_but_no_response() {
        let e = policy("allowed_tools: []");
        let msg = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
        let v = e.evaluate(&Request::from_value(&msg).unwrap());
        assert_eq!(v.decision, Decision::Block);
        assert!(v.error().is_some());
        assert_eq!(v.response(), None);
    }
}

mod tools {
    use super::*;

    #[test]
    fn allowlist_admits_and_refuses() {
        let e = policy("allowed_tools: [read_file]");
        let ok = call(&e, "read_file", json!({"path": "/tmp/x"}));
        assert_eq!(
            (ok.decision, ok.violation, ok.error().is_none()),
            (Decision::Allow, false, true)
        );
        let no = call(&e, "write_file", json!({}));
        assert_eq!(
            (no.decision, code(&no), no.cause),
            (Decision::Block, Some(-32001), Some(Cause::ToolNotAllowed))
        );
        assert_eq!(no.error().unwrap().reason, "Tool not in allowed_tools list");
    }

    #[test]
    fn block_rule_wins_over_the_allowlist() {
        let e = policy("allowed_tools: [rm]\ntool_rules:\n  - {tool: rm, action: block}");
        let v = call(&e, "rm", json!({}));
        assert_eq!(
            (v.decision, code(&v), v.cause),
            (Decision::Block, Some(-32001), Some(Cause::ToolBlocked))
        );
    }

    #[test]
    fn allow_rule_admits_an_unlisted_tool() {
        let e = policy("tool_rules:\n  - {tool: special}");
        assert_eq!(call(&e, "special", json!({})).decision, Decision::Allow);
    }

    #[test]
    fn forwarded_name_is_never_rewritten() {
        let e = policy("allowed_tools: [read_file]");
        let v = call(&e, "READ_FILE", json!({}));
        assert_eq!(v.decision, Decision::Allow);
        let blocked = call(&e, "Ｗrite", json!({}));
        assert_eq!(
            blocked.error().unwrap().subject,
            aip_policy::Subject::Tool("Ｗrite".into())
        );
    }

    #[test]
    fn malformed_tools_call_is_refused_as_invalid_params() {
        let e = policy("allowed_tools: [x]");
        let null_params =
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": null});
        assert_eq!(
            Request::from_value(&null_params).unwrap_err(),
            aip_policy::MessageError::Params
        );
        for params in [
            json!([]),
            json!({}),
            json!({"name": 5}),
            json!({"name": "x", "arguments": [1]}),
        ] {
            let msg = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params});
            let v = e.evaluate(&Request::from_value(&msg).unwrap());
            assert_eq!(
                (v.decision, code(&v)),
                (Decision::Block, Some(-32602)),
                "{params}"
            );
        }
    }

    #[test]
    fn no_policy_blocks_every_tool_call_but_answers_the_lifecycle() {
        let e = Evaluator::deny_all();
        let v = call(&e, "anything", json!({}));
        assert_eq!(
            (v.decision, code(&v), v.cause),
            (Decision::Block, Some(-32001), Some(Cause::NoPolicy))
        );
        assert_eq!(method(&e, "initialize").decision, Decision::Allow);
        assert_eq!(method(&e, "resources/read").decision, Decision::Block);
    }
}

mod arguments {
    use super::*;

    fn github() -> Evaluator {
        policy(
            "tool_rules:\n  - tool: fetch\n    allow_args:\n      url: '^https://github\\.com/'\n      mode: '^(read|list)$'",
        )
    }

    #[test]
    fn every_listed_argument_must_match() {
        let e = github();
        assert_eq!(
            call(
                &e,
                "fetch",
                json!({"url": "https://github.com/a", "mode": "read"})
            )
            .decision,
            Decision::Allow
        );
        let v = call(
            &e,
            "fetch",
            json!({"url": "https://github.com/a", "mode": "write"}),
        );
        assert_eq!(
            (v.decision, v.cause),
            (Decision::Block, Some(Cause::ArgumentMismatch))
        );
        assert_eq!(v.failed_arg(), Some("mode"));
        assert_eq!(v.failed_rule(), Some("^(read|list)$"));
    }

    #[test]
    fn a_missing_argument_blocks_and_is_named() {
        let v = call(&github(), "fetch", json!({"url": "https://github.com/a"}));
        assert_eq!(
            (v.cause, v.failed_arg()),
            (Some(Cause::ArgumentMissing), Some("mode"))
        );
        assert_eq!(
            v.error().unwrap().reason,
            "Required argument 'mode' is missing"
        );
    }

    #[test]
    fn values_are_stringified_as_the_spec_says() {
        for (value, text) in [
            (json!("s"), "s"),
            (json!(42), "42"),
            (json!(-7), "-7"),
            (json!(2.5), "2.5"),
            (json!(3.0), "3"),
            (json!(1e21), "1000000000000000000000"),
            (json!(18446744073709551615u64), "18446744073709551615"),
            (json!(true), "true"),
            (json!(null), ""),
            (json!([1, "a"]), "[1,\"a\"]"),
            (
                json!({"z": 1, "a": {"y": [], "b": null}}),
                "{\"a\":{\"b\":null,\"y\":[]},\"z\":1}",
            ),
        ] {
            assert_eq!(aip_policy::arg_string(&value), text, "{value}");
        }
    }

    #[test]
    fn strict_args_refuses_undeclared_arguments() {
        let e =
            policy("tool_rules:\n  - tool: t\n    strict_args: true\n    allow_args: {a: '.*'}");
        assert_eq!(call(&e, "t", json!({"a": 1})).decision, Decision::Allow);
        let v = call(&e, "t", json!({"a": 1, "headers": {}}));
        assert_eq!(
            (v.cause, v.failed_arg()),
            (Some(Cause::UndeclaredArgument), Some("headers"))
        );
    }

    #[test]
    fn strict_args_default_covers_tools_without_rules() {
        let e = policy("strict_args_default: true\nallowed_tools: [t]");
        assert_eq!(call(&e, "t", json!({})).decision, Decision::Allow);
        assert_eq!(
            call(&e, "t", json!({"x": 1})).cause,
            Some(Cause::UndeclaredArgument)
        );
    }
}

mod rate_limits {
    use super::*;
    use std::time::Duration;

    #[test]
    fn limit_is_enforced_then_refills_with_time() {
        let clock = ManualClock::default();
        let text = "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: t}\nspec:\n  tool_rules:\n    - {tool: s, rate_limit: 2/minute}\n";
        let e = Evaluator::from_yaml(
            text,
            &CompileOptions {
                clock: RateClock::Manual(clock.clone()),
                ..options()
            },
        )
        .unwrap();
        assert_eq!(call(&e, "s", json!({})).decision, Decision::Allow);
        assert_eq!(call(&e, "s", json!({})).decision, Decision::Allow);
        let v = call(&e, "s", json!({}));
        assert_eq!(
            (v.decision, code(&v), v.violation),
            (Decision::RateLimited, Some(-32002), true)
        );
        assert_eq!(v.error().unwrap().reason, "Rate limit of 2/minute exceeded");
        clock.advance(Duration::from_secs(30));
        assert_eq!(call(&e, "s", json!({})).decision, Decision::Allow);
    }

    #[test]
    fn a_recompile_keeps_the_bucket_of_an_unchanged_limit_only() {
        let clock = ManualClock::default();
        let opts = CompileOptions {
            clock: RateClock::Manual(clock.clone()),
            ..options()
        };
        let doc = |extra: &str| {
            let text = format!(
                "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: t}}\nspec:\n  tool_rules:\n    - {{tool: s, rate_limit: 1/minute}}\n    - {{tool: u, rate_limit: {extra}}}\n"
            );
            aip_policy::AgentPolicy::from_yaml(&text).unwrap()
        };
        let first = Evaluator::compile(&doc("1/minute"), &opts).unwrap();
        assert_eq!(call(&first, "s", json!({})).decision, Decision::Allow);
        assert_eq!(call(&first, "u", json!({})).decision, Decision::Allow);
        // u's limit changes, s's does not.
        let second = Evaluator::compile_after(&doc("2/minute"), &opts, &first).unwrap();
        assert_eq!(
            call(&second, "s", json!({})).decision,
            Decision::RateLimited,
            "s's bucket was carried over, still empty"
        );
        assert_eq!(call(&second, "u", json!({})).decision, Decision::Allow);
        assert_eq!(call(&second, "u", json!({})).decision, Decision::Allow);
        let fresh = Evaluator::compile(&doc("2/minute"), &opts).unwrap();
        assert_eq!(call(&fresh, "s", json!({})).decision, Decision::Allow);
    }
}

mod protected_paths {
    use super::*;

    #[test]
    fn the_policy_file_is_always_protected() {
        let e = policy("allowed_tools: [read_file]");
        let v = call(
            &e,
            "read_file",
            json!({"path": "/etc/aip/../aip/policy.yaml"}),
        );
        assert_eq!(
            (v.decision, code(&v), v.cause),
            (Decision::Block, Some(-32007), Some(Cause::ProtectedPath))
        );
        assert_eq!(v.audit_decision(), "PROTECTED_PATH");
        assert_eq!(v.failed_arg(), Some("path"));
        assert_eq!(v.failed_rule(), Some("/etc/aip/policy.yaml"));
    }

    #[test]
    fn configured_paths_with_tilde() {
        let e = policy("allowed_tools: [read_file]\nprotected_paths: [~/.ssh]");
        assert_eq!(
            code(&call(&e, "read_file", json!({"path": "~/.ssh/id_rsa"}))),
            Some(-32007)
        );
        assert_eq!(
            code(&call(&e, "read_file", json!({"path": "/home/agent/.ssh"}))),
            Some(-32007)
        );
        assert_eq!(
            call(&e, "read_file", json!({"path": "/home/agent/notes"})).decision,
            Decision::Allow
        );
    }
}

mod resources {
    use super::*;

    #[test]
    fn resource_uris_get_the_protected_path_check() {
        let e = policy("allowed_methods: [resources/read]\nprotected_paths: [~/.ssh]");
        let read = |uri: &str| {
            let msg = json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": uri}});
            e.evaluate(&Request::from_value(&msg).unwrap())
        };
        assert_eq!(read("file:///srv/readme.md").decision, Decision::Allow);
        let v = read("file:///home/agent/.ssh/id_rsa");
        assert_eq!(
            v.response().unwrap(),
            json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32007, "message": "Access denied: protected path",
                   "data": {"method": "resources/read", "reason": "Parameter 'uri' refers to a protected path"}}})
        );
    }
}

mod monitor {
    use super::*;

    #[test]
    fn tool_rule_violations_pass_as_violations() {
        let e =
            policy("mode: monitor\nallowed_tools: [a]\ntool_rules:\n  - {tool: b, action: block}");
        for tool in ["b", "c"] {
            let v = call(&e, tool, json!({}));
            assert_eq!(
                (v.decision, v.violation, v.error().is_none()),
                (Decision::Allow, true, true),
                "{tool}"
            );
            assert_eq!(v.audit_decision(), "ALLOW_MONITOR");
        }
    }

    #[test]
    fn method_gate_and_protected_paths_stay_enforced() {
        let e = policy("mode: monitor\nallowed_tools: [a]");
        assert_eq!(method(&e, "resources/read").decision, Decision::Block);
        assert_eq!(
            code(&call(&e, "a", json!({"p": "/etc/aip/policy.yaml"}))),
            Some(-32007)
        );
    }
}

mod approvals {
    use super::*;

    fn asking() -> Evaluator {
        policy("tool_rules:\n  - {tool: deploy, action: ask}")
    }

    #[test]
    fn ask_then_each_answer() {
        let v = call(&asking(), "deploy", json!({}));
        assert_eq!(
            (v.decision, v.violation, v.error().is_none()),
            (Decision::Ask, false, true)
        );
        assert_eq!(
            v.clone().resolve(Approval::Approved).decision,
            Decision::Allow
        );
        let denied = v.clone().resolve(Approval::Denied);
        assert_eq!(
            denied.response().unwrap(),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32004, "message": "User denied",
                   "data": {"tool": "deploy", "reason": "Approval denied"}}})
        );
        let timed_out = v.resolve(Approval::TimedOut);
        assert_eq!(
            (timed_out.decision, code(&timed_out)),
            (Decision::Block, Some(-32005))
        );
        assert_eq!(
            timed_out.error().unwrap().message(),
            "User approval timeout"
        );
    }

    /// An ask that ended undecided is never a person's denial: -32015
    /// with the cause in `data`, or -32016 when the gateway shuts down;
    /// the audit decision and record say the same.
    #[test]
    fn a_withdrawal_is_named_for_what_happened() {
        let e = asking();
        let v = call(&e, "deploy", json!({}));
        let changed = v
            .clone()
            .resolve(Approval::Withdrawn(Withdrawal::PolicyChanged));
        assert_eq!(
            changed.response().unwrap(),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32015, "message": "Approval withdrawn",
                   "data": {"tool": "deploy", "reason": "withdrawn: the policy changed and now refuses this call",
                            "cause": "PolicyChanged"}}})
        );
        assert_eq!(changed.audit_decision(), "APPROVAL_WITHDRAWN");
        let down = v
            .clone()
            .resolve(Approval::Withdrawn(Withdrawal::GatewayShutdown));
        assert_eq!(code(&down), Some(-32016));
        assert_eq!(down.audit_decision(), "GATEWAY_SHUTDOWN");
        assert_eq!(down.error().unwrap().message(), "Gateway shutting down");
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "deploy", "arguments": {}}});
        let request = Request::from_value(&message).unwrap();
        let record = AuditRecord::for_request(&e, &request, &down, std::time::UNIX_EPOCH);
        assert_eq!(record.cause, Some("GatewayShutdown"));
        let denied = v.clone().resolve(Approval::Denied);
        assert_eq!(denied.audit_decision(), "USER_DENIED");
        assert_eq!(
            AuditRecord::for_request(&e, &request, &denied, std::time::UNIX_EPOCH).cause,
            None
        );
        for w in Withdrawal::ALL {
            let r = v.clone().resolve(Approval::Withdrawn(w));
            assert!(matches!(code(&r), Some(-32015 | -32016)), "{w}");
            assert_ne!(r.audit_decision(), "USER_DENIED", "{w}");
        }
    }

    #[test]
    fn resolving_a_non_ask_changes_nothing() {
        let e = policy("allowed_tools: [a]");
        let v = call(&e, "a", json!({}));
        assert_eq!(v.clone().resolve(Approval::Denied), v);
    }
}

mod secrets {
    use super::*;

    /// Whatever the agent put in an argument stays out of the error it gets
    /// back and out of the reason: only argument names are echoed.
    #[test]
    fn argument_values_never_appear_in_errors() {
        let secret = "sk_live_5f3a9c1e7b2d4068";
        let e = policy(
            "tool_rules:\n  - tool: pay\n    strict_args: true\n    allow_args: {to: '^acct_[0-9]+$'}",
        );
        for args in [
            json!({"to": secret}),
            json!({"to": "acct_1", "memo": secret}),
            json!({"to": "acct_1", "path": format!("/etc/aip/policy.yaml#{secret}")}),
        ] {
            let v = call(&e, "pay", args.clone());
            assert_eq!(v.decision, Decision::Block, "{args}");
            let shown = format!("{} {:?}", v.response().unwrap(), v.reason());
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}

mod audit {
    use super::*;
    use aip_policy::{AuditRecord, DlpRecord};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn audit_line_redacts_arguments_and_has_the_required_fields() {
        let e = policy(
            "allowed_tools: [send]\ndlp:\n  patterns:\n    - {name: Token, regex: 'tok_[a-z0-9]{8}'}",
        );
        let msg = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                         "params": {"name": "send", "arguments": {"body": "use tok_abcd1234", "n": 2}}});
        let request = Request::from_value(&msg).unwrap();
        let verdict = e.evaluate(&request);
        let at = UNIX_EPOCH + Duration::from_millis(1_780_000_000_123);
        let line =
            serde_json::to_string(&AuditRecord::for_request(&e, &request, &verdict, at)).unwrap();
        assert!(!line.contains("tok_abcd1234"), "{line}");
        let record: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(record["timestamp"], "2026-05-28T20:26:40.123Z");
        assert_eq!(record["direction"], "upstream");
        assert_eq!(record["decision"], "ALLOW");
        assert_eq!(record["policy_mode"], "enforce");
        assert_eq!(record["violation"], false);
        assert_eq!(record["tool"], "send");
        assert_eq!(
            record["args"],
            json!({"body": "use [REDACTED:Token]", "n": 2})
        );

        let dlp = DlpRecord::for_events(
            &[aip_policy::DlpEvent {
                rule: "Token".into(),
                count: 2,
            }],
            Some("send"),
            at,
        );
        assert_eq!(
            serde_json::to_value(&dlp[0]).unwrap(),
            json!({"timestamp": "2026-05-28T20:26:40.123Z", "direction": "downstream", "event": "DLP_TRIGGERED",
                   "dlp_rule": "Token", "dlp_action": "REDACTED", "dlp_match_count": 2, "tool": "send"})
        );
    }
}

mod audit_size {
    use super::*;
    use aip_policy::{AuditRecord, MAX_AUDIT_ARGS_BYTES};
    use std::time::SystemTime;

    /// One call with megabytes of arguments makes an audit line of a few
    /// hundred bytes: their size and the hash of the full value, no data.
    #[test]
    fn large_arguments_are_recorded_by_size_and_hash() {
        let e = policy("allowed_tools: [put]");
        let big = "x".repeat(4 * 1024 * 1024);
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "put", "arguments": {"blob": big}}});
        let request = Request::from_value(&msg).unwrap();
        let verdict = e.evaluate(&request);
        let record = AuditRecord::for_request(&e, &request, &verdict, SystemTime::now());
        let line = serde_json::to_string(&record).unwrap();
        assert!(line.len() < 1024, "{} bytes", line.len());
        let record: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(record.get("args"), None);
        assert_eq!(record["args_bytes"], 4 * 1024 * 1024 + 11);
        assert_eq!(
            record["args_sha256"],
            aip_policy::hash::arguments_hash(&msg["params"]["arguments"])
        );
        // At the cap, the arguments are still recorded whole.
        let fits = "y".repeat(MAX_AUDIT_ARGS_BYTES - 11);
        let msg = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                         "params": {"name": "put", "arguments": {"blob": fits}}});
        let request = Request::from_value(&msg).unwrap();
        let record =
            AuditRecord::for_request(&e, &request, &e.evaluate(&request), SystemTime::now());
        assert_eq!(
            record.args.as_ref().map(|a| a.value()),
            Some(msg["params"]["arguments"].clone())
        );
        assert_eq!(record.args_sha256, None);
    }
}

mod listing {
    use super::*;
    use aip_policy::Listing;

    #[test]
    fn tool_level_listing_ignores_arguments() {
        let e = policy(
            "allowed_tools: [read]\ntool_rules:\n  - {tool: fetch, allow_args: {url: '^https://'}}\n  - {tool: rm, action: block}\n  - {tool: deploy, action: ask}",
        );
        assert_eq!(e.listing("read"), Listing::Listed);
        assert_eq!(e.listing("READ"), Listing::Listed);
        assert_eq!(
            e.listing("fetch"),
            Listing::Listed,
            "argument rules do not hide a tool"
        );
        assert_eq!(e.listing("rm"), Listing::Hidden);
        assert_eq!(e.listing("deploy"), Listing::Ask);
        assert_eq!(e.listing("other"), Listing::Hidden);
        assert_eq!(Evaluator::deny_all().listing("read"), Listing::Hidden);
        let monitor = policy(
            "mode: monitor\nallowed_tools: [read]\ntool_rules:\n  - {tool: rm, action: block}",
        );
        assert_eq!(monitor.listing("rm"), Listing::Listed);
    }
}

//! Every invalid document class is refused with its field path: by the
//! library, by `--check`, and at start (no server ever runs).

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use aip_fault_server::script::{Script, Transport};
use common::{scratch, script};

fn steps(n: usize) -> String {
    (0..n)
        .map(|i| format!("            - return: {{n: {i}}}\n"))
        .collect()
}

fn one_tool(sequence: &str) -> String {
    script(&format!(
        "  tools:\n    - name: t\n      responses:\n        - sequence:\n{sequence}"
    ))
}

/// (class, document, expected error)
fn invalid_documents() -> Vec<(&'static str, String, &'static str)> {
    vec![
        (
            "unknown key",
            script(
                "  tools:\n    - name: t\n      responses:\n        - sequence: [{return: 1}]\n          matchh: {}\n",
            ),
            "spec.tools[0].responses[0].matchh: unknown field `matchh`, expected one of `match`, `matchRegex`, `sequence`",
        ),
        (
            "rug pull after no calls",
            script(
                "  tools:\n    - name: t\n      rugPull: {afterCalls: 0, description: x}\n      responses: [{sequence: [{return: 1}]}]\n",
            ),
            "spec.tools[0].rugPull.afterCalls: must be at least 1",
        ),
        (
            "empty error",
            one_tool("            - error: \"\"\n"),
            "spec.tools[0].responses[0].sequence[0].error: must not be empty",
        ),
        (
            "two outputs in one step",
            one_tool("            - return: {a: 1}\n              error: boom\n"),
            "spec.tools[0].responses[0].sequence[0]: a step has exactly one outcome, found return and error",
        ),
        (
            "101 steps",
            one_tool(&steps(101)),
            "spec.tools[0].responses[0].sequence: must have 1..100 steps, found 101",
        ),
        (
            "delay 300001",
            one_tool("            - return: 1\n              delay_ms: 300001\n"),
            "spec.tools[0].responses[0].sequence[0].delay_ms: must be 0..300000, found 300001",
        ),
        (
            "bad regex",
            script(
                "  tools:\n    - name: t\n      responses:\n        - matchRegex: {q: '(unclosed'}\n          sequence: [{return: 1}]\n",
            ),
            "spec.tools[0].responses[0].matchRegex.q: bad regex:",
        ),
        (
            "zero tools",
            script("  tools: []\n"),
            "spec.tools: at least one tool is required",
        ),
        (
            "page size 0",
            script("  pageSize: 0\n  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n"),
            "spec.pageSize: must be at least 1",
        ),
        (
            "duplicate resource URI",
            script(
                "  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n  resources: [{uri: 'a:1', name: a, text: x}, {uri: 'a:1', name: b, text: y}]\n",
            ),
            "spec.resources: URIs must be unique",
        ),
        (
            "unknown era",
            script(
                "  era: sometimes\n  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n",
            ),
            "spec.era: unknown variant `sometimes`, expected one of `both`, `legacy`, `modern`",
        ),
        (
            "cache freshness over a day",
            script(
                "  caching: {ttlMs: 86400001}\n  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n",
            ),
            "spec.caching.ttlMs: must be 0..86400000, found 86400001",
        ),
        (
            "unknown cache scope",
            script(
                "  caching: {cacheScope: shared}\n  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n",
            ),
            "spec.caching.cacheScope: unknown variant `shared`, expected `public` or `private`",
        ),
        (
            "a tool outcome in toolsList",
            script(&format!("  toolsList:\n    sequence: [{{return: 1}}]\n{T}")),
            "spec.toolsList.sequence[0].return: unknown field `return`, expected one of `list`, `jsonrpc_error`, `http`, `drop`, `stall_body`, `raw_body`, `delay_ms`",
        ),
        (
            "list: false",
            script(&format!(
                "  toolsList:\n    sequence: [{{list: false}}]\n{T}"
            )),
            "spec.toolsList.sequence[0].list: must be true (omit it otherwise)",
        ),
        (
            "two outcomes in a toolsList step",
            script(&format!(
                "  toolsList:\n    sequence: [{{list: true, drop: true}}]\n{T}"
            )),
            "spec.toolsList.sequence[0]: a step has exactly one outcome, found list and drop",
        ),
        (
            "an empty toolsList",
            script(&format!("  toolsList: {{sequence: []}}\n{T}")),
            "spec.toolsList.sequence: must have 1..100 steps, found 0",
        ),
        (
            "a toolsList delay over 300000",
            script(&format!(
                "  toolsList:\n    sequence: [{{list: true, delay_ms: 300001}}]\n{T}"
            )),
            "spec.toolsList.sequence[0].delay_ms: must be 0..300000, found 300001",
        ),
        (
            "input_required asking for nothing",
            one_tool("            - input_required: {inputRequests: {}}\n"),
            "spec.tools[0].responses[0].sequence[0].input_required: needs inputRequests (at least one), requestState, or both",
        ),
        (
            "input_required asking for a request no client answers",
            one_tool("            - input_required: {inputRequests: {a: {method: tools/call}}}\n"),
            "spec.tools[0].responses[0].sequence[0].input_required.inputRequests.a.method: must be elicitation/create, sampling/createMessage, roots/list, found \"tools/call\"",
        ),
        (
            "input_required params not an object",
            one_tool(
                "            - input_required: {inputRequests: {a: {method: roots/list, params: [1]}}}\n",
            ),
            "spec.tools[0].responses[0].sequence[0].input_required.inputRequests.a.params: must be an object",
        ),
        (
            "an empty expected requestState",
            one_tool("            - return: 1\n              expect_retry: {requestState: \"\"}\n"),
            "spec.tools[0].responses[0].sequence[0].expect_retry.requestState: must not be empty (omit it to expect no requestState)",
        ),
    ]
}

/// One tool, for documents about something else.
const T: &str = "  tools: [{name: t, responses: [{sequence: [{return: 1}]}]}]\n";

#[test]
fn library_refuses_each_invalid_class_with_its_path() {
    for (class, doc, expected) in invalid_documents() {
        let err = Script::from_yaml(&doc, Transport::Http)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(expected), "{class}: {err}");
    }
}

#[test]
fn limits_themselves_are_accepted() {
    let max = format!(
        "{}\n",
        one_tool(&format!(
            "{}            - return: last\n              delay_ms: 300000\n",
            steps(99)
        ))
    );
    let s = Script::from_yaml(&max, Transport::Stdio).unwrap();
    assert_eq!(s.tools[0].responses[0].steps.len(), 100);
    let pending = script(
        "  maxPending: 65\n  tools:\n    - name: t\n      responses: [{sequence: [{return: 1}]}]\n",
    );
    assert_eq!(
        Script::from_yaml(&pending, Transport::Http)
            .unwrap_err()
            .to_string(),
        "spec.maxPending: must be 1..64, found 65"
    );
}

#[test]
fn http_only_steps_are_refused_for_stdio() {
    let list = script(&format!(
        "  toolsList:\n    sequence: [{{list: true}}, {{http: {{status: 503}}}}]\n{T}"
    ));
    assert!(Script::from_yaml(&list, Transport::Http).is_ok());
    assert_eq!(
        Script::from_yaml(&list, Transport::Stdio)
            .unwrap_err()
            .to_string(),
        "spec.toolsList.sequence[1].http: only the HTTP transport can play this step"
    );
    for step in [
        "http: {status: 503}",
        "sse_close_after_event: {retry_ms: 10}",
    ] {
        let doc = one_tool(&format!("            - {step}\n"));
        assert!(Script::from_yaml(&doc, Transport::Http).is_ok());
        let err = Script::from_yaml(&doc, Transport::Stdio)
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("only the HTTP transport can play this step"),
            "{err}"
        );
        assert!(
            err.starts_with("spec.tools[0].responses[0].sequence[0]."),
            "{err}"
        );
    }
}

#[test]
fn check_and_start_refuse_each_invalid_class() {
    let tmp = scratch("script-check");
    let dir = tmp.path();
    for (i, (class, doc, expected)) in invalid_documents().into_iter().enumerate() {
        let file = dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&file, doc).unwrap();
        for args in [
            vec!["--check"],
            vec!["--http", "127.0.0.1:0"],
            vec!["--stdio"],
        ] {
            let out = Command::new(env!("CARGO_BIN_EXE_aip-fault-server"))
                .arg("--config")
                .arg(&file)
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{class} {args:?}: {stderr}");
            assert!(
                stderr.starts_with(&format!("{}: {expected}", file.display())),
                "{class} {args:?}: {stderr}"
            );
            assert!(!stderr.contains("listening"), "{class}: a server started");
        }
    }
}

#[test]
fn check_accepts_every_example() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults");
    let mut count = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        // Documents only: the CLI rehearsal's caller script sits beside them.
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_aip-fault-server"))
            .arg("--config")
            .arg(&path)
            .arg("--check")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        count += 1;
    }
    // Ten FaultServer documents and one FaultCli document.
    assert_eq!(count, 11);
}

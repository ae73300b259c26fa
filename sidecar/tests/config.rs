//! The standalone configuration file: multi-document YAML, field-path errors,
//! secrets that never print, and reload that keeps the last good config.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aip_policy::{CompileOptions, Decision};
use aip_sidecar::config::{Endpoint, file};
use secrecy::ExposeSecret;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const POLICY: &str = "apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {name: agent}
spec:
  allowed_tools: [inventory_get_item]
";

/// A directory of its own under cargo's target/tmp (so that a run that is
/// killed leaves nothing outside target/), removed when the guard drops.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

fn connection(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

fn parse(text: &str) -> Result<aip_sidecar::config::Config, Vec<String>> {
    file::parse(text, &CompileOptions::default())
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

#[test]
fn a_policy_and_connections() {
    let tmp = scratch("aip-sidecar-config-");
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "file-secret-value\n").unwrap();
    // HOME is always set; setting a variable of our own would need unsafe.
    let home = std::env::var("HOME").unwrap();
    let text = format!(
        "{POLICY}{}{}",
        connection(
            "inventory",
            &format!(
                "  url: http://127.0.0.1:9/mcp\n  toolPrefix: inventory_\n  timeoutSeconds: 5\n  headers:\n    - name: X-Api-Key\n      valueFrom: {{env: HOME}}\n  bearerToken:\n    valueFrom: {{file: {}}}\n",
                token_file.display()
            )
        ),
        "",
    );
    let config = parse(&text).unwrap();
    assert_eq!(config.connections.len(), 1);
    let inv = config.connection("inventory").unwrap();
    assert_eq!(
        inv.endpoint,
        Endpoint::Http {
            url: "http://127.0.0.1:9/mcp".into()
        }
    );
    assert_eq!(inv.timeout, Duration::from_secs(5));
    assert_eq!(inv.max_response_bytes, 1_000_000);
    let creds = inv.credentials.as_ref().unwrap();
    assert_eq!(creds[0].0, "X-Api-Key");
    assert_eq!(creds[0].1.expose_secret(), home);
    assert_eq!(creds[1].1.expose_secret(), "Bearer file-secret-value");
    let printed = format!("{config:?}");
    assert!(
        !printed.contains(&home) && !printed.contains("file-secret-value"),
        "secrets never print"
    );
    let v = config
        .evaluator
        .evaluate_call(&json!(1), "inventory_get_item", &json!({}));
    assert_eq!(v.decision, Decision::Allow);
}

#[test]
fn unresolvable_credentials_leave_the_connection_without_them() {
    let text = format!(
        "{POLICY}{}",
        connection(
            "c",
            "  url: http://x/mcp\n  headers:\n    - name: X-Key\n      valueFrom: {env: AIP_TEST_SURELY_UNSET_VAR}\n"
        )
    );
    let config = parse(&text).unwrap();
    let err = config
        .connection("c")
        .unwrap()
        .credentials
        .as_ref()
        .unwrap_err();
    assert_eq!(
        err,
        "spec.headers[0]: environment variable AIP_TEST_SURELY_UNSET_VAR is not set"
    );
    let text = format!(
        "{POLICY}{}",
        connection(
            "k",
            "  url: http://x/mcp\n  bearerToken:\n    valueFrom: {secretKeyRef: {name: s, key: token}}\n"
        )
    );
    let err = parse(&text)
        .unwrap()
        .connection("k")
        .unwrap()
        .credentials
        .clone()
        .unwrap_err();
    assert!(
        err.contains("secretKeyRef s/token needs the operator"),
        "{err}"
    );
}

#[test]
fn errors_name_document_and_field() {
    let text = format!(
        "{}{}{}{}{}---\nkind: Secret\nmetadata: {{name: s}}\n",
        POLICY.replace("allowed_tools", "allowed_toolz"),
        connection("a", "  url: ftp://x\n"),
        connection("b", "  url: http://x/mcp\n  timeoutSeconds: 61\n"),
        connection("c", "  url: http://x/mcp\n  retries: 3\n"),
        connection(
            "a2",
            "  url: http://x/mcp\n  headers:\n    - name: Mcp-Session-Id\n      valueFrom: {env: X}\n"
        ),
    );
    assert_eq!(
        parse(&text).unwrap_err(),
        vec![
            "document 1 (AgentPolicy agent): spec.allowed_toolz: unknown field; expected one of: mode, allowed_tools, allowed_methods, denied_methods, protected_paths, strict_args_default, tool_rules, dlp",
            "document 2 (ToolConnection a): spec.url: must be an http:// or https:// URL, found \"ftp://x\"",
            "document 3 (ToolConnection b): spec.timeoutSeconds: must be 1..60",
            "document 4 (ToolConnection c): spec.retries: unknown field `retries`, expected one of `url`, `command`, `headers`, `bearerToken`, `timeoutSeconds`, `maxResponseBytes`, `healthCheck`, `toolPrefix`, `clientCapabilities`, `tls`, `toolPins`, `toolTrust`, `toolScan`, `auth`",
            "document 5 (ToolConnection a2): spec.headers[0].name: Mcp-Session-Id is set by the gateway itself",
            "document 6: kind: expected AgentPolicy or ToolConnection, found Some(\"Secret\")",
        ]
    );
    assert_eq!(
        parse(&format!("{POLICY}---\n{POLICY}")).unwrap_err(),
        vec![
            "document 2 (AgentPolicy agent): a configuration holds one AgentPolicy; this is the second"
        ]
    );
}

#[test]
fn no_policy_means_every_tool_call_is_blocked() {
    let config = parse(&connection("c", "  url: http://x/mcp\n")).unwrap();
    let v = config
        .evaluator
        .evaluate_call(&json!(1), "anything", &json!({}));
    assert_eq!(
        (v.decision, v.error().unwrap().code),
        (Decision::Block, -32001)
    );
}

#[tokio::test]
async fn reload_replaces_a_valid_config_and_keeps_the_old_on_errors() {
    let tmp = scratch("aip-sidecar-reload-");
    let dir = tmp.path();
    let path = dir.join("gateway.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let shutdown = CancellationToken::new();
    let mut watched = file::watch(path.clone(), Duration::from_millis(20), shutdown.clone());
    assert!(watched.errors.borrow().is_none());
    let allowed = |watched: &file::Watched, tool: &str| {
        watched
            .config
            .borrow()
            .evaluator
            .evaluate_call(&json!(1), tool, &json!({}))
            .decision
            == Decision::Allow
    };
    assert!(allowed(&watched, "inventory_get_item"));
    let patience = Duration::from_secs(10);
    // A valid change is picked up.
    std::fs::write(
        &path,
        POLICY.replace("inventory_get_item", "inventory_list"),
    )
    .unwrap();
    tokio::time::timeout(patience, watched.config.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(allowed(&watched, "inventory_list"));
    // An invalid change is refused with its errors; the old config stays.
    std::fs::write(&path, POLICY.replace("allowed_tools", "allowed_toolz")).unwrap();
    tokio::time::timeout(patience, watched.errors.changed())
        .await
        .unwrap()
        .unwrap();
    let errors = watched.errors.borrow().clone().unwrap();
    assert!(
        errors
            .to_string()
            .starts_with("document 1 (AgentPolicy agent): spec.allowed_toolz: unknown field"),
        "{errors}"
    );
    assert!(!watched.config.has_changed().unwrap());
    assert!(allowed(&watched, "inventory_list"));
    shutdown.cancel();
}

#[test]
fn stdio_connections_need_a_program_and_take_no_headers() {
    let ok = format!(
        "{POLICY}{}",
        connection("local", "  command: [server, --stdio]\n")
    );
    let config = parse(&ok).unwrap();
    assert_eq!(
        config.connections[0].endpoint,
        Endpoint::Stdio {
            command: vec!["server".into(), "--stdio".into()]
        }
    );
    let cases = [
        (
            "  command: []\n",
            "spec.command: must name a program to run: [PROGRAM, ARGS...]",
        ),
        (
            "  command: [\"\"]\n",
            "spec.command: must name a program to run: [PROGRAM, ARGS...]",
        ),
        (
            "  command: [server]\n  url: http://127.0.0.1:1/mcp\n",
            "spec.command: give either url or command, not both",
        ),
        (
            "  command: [server]\n  headers: [{name: X-Key, valueFrom: {env: HOME}}]\n",
            "spec.command: a stdio connection takes no headers or bearerToken; pass credentials in the server's environment",
        ),
    ];
    for (spec, error) in cases {
        let text = format!("{POLICY}{}", connection("local", spec));
        assert_eq!(
            parse(&text).unwrap_err(),
            vec![format!("document 2 (ToolConnection local): {error}")],
            "{spec}"
        );
    }
}

#[test]
fn check_reports_the_configuration_without_secrets_or_every_error() {
    let bin = env!("CARGO_BIN_EXE_aip-sidecar");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let example = repo.join("examples/gateway/stdio-connection.yaml");
    let ok = std::process::Command::new(bin)
        .arg("check")
        .arg(&example)
        .output()
        .unwrap();
    let out = String::from_utf8(ok.stdout).unwrap();
    assert!(ok.status.success(), "{out}");
    assert!(
        out.contains("ok (policy shop-agent, connections: 1)"),
        "{out}"
    );
    assert!(
        out.contains("inventory: command [\"target/debug/aip-fault-server\""),
        "{out}"
    );

    let tmp = scratch("aip-sidecar-check-");
    let dir = tmp.path();
    let with_secret = dir.join("secret.yaml");
    let text = format!(
        "{POLICY}{}",
        connection(
            "api",
            "  url: http://127.0.0.1:9/mcp\n  headers:\n    - name: X-Key\n      valueFrom: {env: AIP_CHECK_TEST_KEY}\n"
        )
    );
    std::fs::write(&with_secret, text).unwrap();
    let shown = std::process::Command::new(bin)
        .arg("check")
        .arg(&with_secret)
        .env("AIP_CHECK_TEST_KEY", "hunter2-very-secret")
        .output()
        .unwrap();
    let all = format!("{shown:?}");
    assert!(shown.status.success(), "{all}");
    assert!(all.contains("1 credential headers resolved"), "{all}");
    assert!(
        !all.contains("hunter2"),
        "a credential value was printed: {all}"
    );

    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        format!(
            "{POLICY}{}",
            connection("x", "  command: []\n  timeoutSeconds: 0\n")
        ),
    )
    .unwrap();
    let refused = std::process::Command::new(bin)
        .arg("check")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8(refused.stderr).unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        err.contains("document 2 (ToolConnection x): spec.command: must name a program"),
        "{err}"
    );
}

/// Credentials in a URL and header values no header may carry are refused
/// at load, naming the field and never the value; `check` prints neither.
#[test]
fn credentials_in_urls_and_broken_header_values_are_refused_without_their_values() {
    let tmp = scratch("aip-sidecar-urlcred-");
    let dir = tmp.path();
    let broken = dir.join("broken-token");
    std::fs::write(&broken, "s3cr3t-value\r\nX-Injected: yes\n").unwrap();
    for (spec, field, secret) in [
        (
            "  url: https://alice:s3cr3t-value@example.com/mcp\n".to_owned(),
            "spec.url: holds user information",
            "s3cr3t-value",
        ),
        (
            "  url: https://example.com/mcp?tenant=a&access_token=s3cr3t-value\n".to_owned(),
            "spec.url: query parameter \"access_token\" carries a credential",
            "s3cr3t-value",
        ),
        (
            "  url: https://example.com/mcp?X-Api-Key=s3cr3t-value\n".to_owned(),
            "spec.url: query parameter \"x-api-key\" carries a credential",
            "s3cr3t-value",
        ),
        (
            "  url: https://example.com/mcp?t%6Fken=s3cr3t-value\n".to_owned(),
            "spec.url: query parameter \"token\" carries a credential",
            "s3cr3t-value",
        ),
        (
            "  url: https://example.com/mcp#access_token=s3cr3t-value\n".to_owned(),
            "spec.url: query parameter \"access_token\" carries a credential",
            "s3cr3t-value",
        ),
        (
            format!(
                "  url: https://example.com/mcp\n  headers:\n    - name: X-Token\n      valueFrom: {{file: {}}}\n",
                broken.display()
            ),
            "spec.headers[0].valueFrom: the value for header X-Token holds a line break",
            "s3cr3t-value",
        ),
        (
            format!(
                "  url: https://example.com/mcp\n  bearerToken:\n    valueFrom: {{file: {}}}\n",
                broken.display()
            ),
            "spec.bearerToken.valueFrom: the value for header authorization holds a line break",
            "s3cr3t-value",
        ),
    ] {
        let text = format!("{POLICY}{}", connection("x", &spec));
        let errors = parse(&text).unwrap_err().join("\n");
        assert!(errors.contains(field), "{spec}: {errors}");
        assert!(!errors.contains(secret), "the value was printed: {errors}");
        let file = dir.join("c.yaml");
        std::fs::write(&file, &text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_aip-sidecar"))
            .arg("check")
            .arg(&file)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert!(!all.contains(secret), "check printed the value: {all}");
    }
    // A query that carries no credential is fine.
    let ok = format!(
        "{POLICY}{}",
        connection("x", "  url: https://example.com/mcp?tenant=a&region=eu\n")
    );
    assert!(parse(&ok).is_ok());
}

/// A configuration the binary cannot use stops it at start with the errors,
/// for `stdio` and `run` alike: it never serves without a policy.
#[test]
fn an_unusable_configuration_stops_stdio_and_run_at_start() {
    let tmp = scratch("aip-sidecar-unusable-");
    let dir = tmp.path();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        format!("{POLICY}{}", connection("x", "  url: ftp://nowhere\n")),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_aip-sidecar");
    for args in [
        vec!["stdio", "--config", bad.to_str().unwrap(), "--", "cat"],
        vec![
            "run",
            "--config",
            bad.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
    ] {
        let out = std::process::Command::new(bin)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("the configuration cannot be used") && err.contains("spec.url"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn tool_pins_are_checked_and_named_by_field() {
    let bad_hash = format!(
        "{POLICY}{}",
        connection(
            "p",
            "  url: http://x/mcp\n  toolPins:\n    read: {schemaHash: 'sha256:ABC'}\n"
        )
    );
    let err = parse(&bad_hash).unwrap_err().join("\n");
    assert!(
        err.contains(
            "(ToolConnection p): spec.toolPins.read.schemaHash: \"sha256:ABC\" is not a fingerprint"
        ),
        "{err}"
    );
    let hash = format!("sha256:{}", "a".repeat(64));
    let contradiction = format!(
        "{POLICY}{}",
        connection(
            "p",
            &format!(
                "  url: http://x/mcp\n  toolTrust: Listed\n  toolPins:\n    read: {{schemaHash: '{hash}'}}\n"
            )
        )
    );
    let err = parse(&contradiction).unwrap_err().join("\n");
    assert!(
        err.contains("spec.toolTrust: Listed serves every tool"),
        "{err}"
    );
    let unknown = format!(
        "{POLICY}{}",
        connection("p", "  url: http://x/mcp\n  toolScan: Loud\n")
    );
    let err = parse(&unknown).unwrap_err().join("\n");
    assert!(
        err.contains("spec.toolScan") && err.contains("Warn"),
        "{err}"
    );
}

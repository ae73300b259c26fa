//! Every invalid FaultCli document class is refused with its field path: by
//! the library, by `--check`, at install (`--shims`: no directory is made),
//! and by a shim whose session's document was tampered with.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use aip_fault_server::cli::CliScript;

const BINARY: &str = env!("CARGO_BIN_EXE_aip-fault-server");

fn doc(spec: &str) -> String {
    format!("apiVersion: aip.io/v1alpha1\nkind: FaultCli\nmetadata: {{name: test}}\nspec:\n{spec}")
}

/// One executable `t` with one response holding `sequence`.
fn one(sequence: &str) -> String {
    doc(&format!(
        "  executables:\n    - name: t\n      responses:\n        - sequence:\n{sequence}"
    ))
}

fn response(lines: &str) -> String {
    doc(&format!(
        "  executables:\n    - name: t\n      responses:\n        - {lines}\n"
    ))
}

fn named(name: &str) -> String {
    doc(&format!(
        "  executables:\n    - name: {name}\n      responses: [{{sequence: [{{exit_code: 0}}]}}]\n"
    ))
}

fn steps(n: usize) -> String {
    (0..n)
        .map(|i| format!("            - {{exit_code: 0, stdout: \"{i}\"}}\n"))
        .collect()
}

const STEP: &str = "spec.executables[0].responses[0].sequence[0]";

/// (class, document, expected error)
fn invalid_documents() -> Vec<(&'static str, String, String)> {
    vec![
        (
            "unknown key",
            one("            - {exit_code: 0, exitcode: 1}\n"),
            format!(
                "{STEP}.exitcode: unknown field `exitcode`, expected one of `exit_code`, `stdout`, `stderr`, `delay_ms`, `deadline_ms`"
            ),
        ),
        (
            "no exit_code",
            one("            - {stdout: hi}\n"),
            format!("{STEP}: missing field `exit_code`"),
        ),
        (
            "exit_code 256",
            one("            - {exit_code: 256}\n"),
            format!("{STEP}.exit_code: must be 0..255, found 256"),
        ),
        (
            "negative exit_code",
            one("            - {exit_code: -1}\n"),
            format!("{STEP}.exit_code: must be 0..255, found -1"),
        ),
        (
            "stdout not text",
            one("            - {exit_code: 0, stdout: [a]}\n"),
            format!("{STEP}.stdout: invalid type: sequence, expected a string"),
        ),
        (
            "101 steps",
            one(&steps(101)),
            "spec.executables[0].responses[0].sequence: must have 1..100 steps, found 101".into(),
        ),
        (
            "zero steps",
            response("sequence: []"),
            "spec.executables[0].responses[0].sequence: must have 1..100 steps, found 0".into(),
        ),
        (
            "delay 300001",
            one("            - {exit_code: 0, delay_ms: 300001}\n"),
            format!("{STEP}.delay_ms: must be 0..300000, found 300001"),
        ),
        (
            "deadline 300001",
            one("            - {exit_code: 0, deadline_ms: 300001}\n"),
            format!("{STEP}.deadline_ms: must be 0..300000, found 300001"),
        ),
        (
            "bad regex",
            response("{matchRegex: ['^get$', '(unclosed'], sequence: [{exit_code: 0}]}"),
            "spec.executables[0].responses[0].matchRegex[1]: bad regex:".into(),
        ),
        (
            "no regex",
            response("{matchRegex: [], sequence: [{exit_code: 0}]}"),
            "spec.executables[0].responses[0].matchRegex: must have one regex per argument (use match: [] for no arguments)".into(),
        ),
        (
            "match and matchRegex",
            response("{match: [a], matchRegex: [a], sequence: [{exit_code: 0}]}"),
            "spec.executables[0].responses[0]: give either match or matchRegex, not both".into(),
        ),
        (
            "unquoted number argument",
            response("{match: [scale, --replicas, 3], sequence: [{exit_code: 0}]}"),
            "spec.executables[0].responses[0].match[2]: must be a string, found 3; quote it (\"3\")"
                .into(),
        ),
        (
            "no responses",
            doc("  executables:\n    - {name: t, responses: []}\n"),
            "spec.executables[0].responses: at least one response is required".into(),
        ),
        (
            "duplicate name",
            doc(
                "  executables:\n    - {name: t, responses: [{sequence: [{exit_code: 0}]}]}\n    - {name: t, responses: [{sequence: [{exit_code: 1}]}]}\n",
            ),
            "spec.executables[1].name: duplicate executable name \"t\"".into(),
        ),
        (
            "name with a slash",
            named("/usr/bin/kubectl"),
            "spec.executables[0].name: \"/usr/bin/kubectl\" is not a command name (no '/' or NUL)"
                .into(),
        ),
        (
            "hidden name",
            named(".aip-fault"),
            "spec.executables[0].name: \".aip-fault\" must not start with '.'".into(),
        ),
        (
            "empty name",
            named("''"),
            "spec.executables[0].name: must not be empty".into(),
        ),
        (
            "name with a space",
            named("'kube ctl'"),
            "spec.executables[0].name: \"kube ctl\" must not contain whitespace".into(),
        ),
        (
            "no executables key",
            doc("  mocks: []\n"),
            "spec.mocks: unknown field `mocks`, expected `executables`".into(),
        ),
        (
            "empty spec",
            doc("  {}\n"),
            "spec: missing field `executables`".into(),
        ),
        (
            "wrong apiVersion",
            doc("  executables: []\n").replace("aip.io/v1alpha1", "aip.io/v2"),
            "apiVersion: must be \"aip.io/v1alpha1\", found \"aip.io/v2\"".into(),
        ),
        (
            "empty metadata.name",
            doc("  executables: []\n").replace("{name: test}", "{name: ' '}"),
            "metadata.name: must not be empty".into(),
        ),
    ]
}

struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Under cargo's target/tmp, so that a run that is killed leaves
    /// nothing outside target/.
    fn new(name: &str) -> TempDir {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("aip-fault-clidoc-{name}-"))
                .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
                .unwrap(),
        )
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

fn run(config: &Path, args: &[&str], shims: Option<&Path>) -> Output {
    let mut command = Command::new(BINARY);
    command.arg("--config").arg(config).args(args);
    if let Some(dir) = shims {
        command.arg("--shims").arg(dir);
    }
    command.output().unwrap()
}

#[test]
fn library_refuses_each_invalid_class_with_its_path() {
    for (class, document, expected) in invalid_documents() {
        let err = CliScript::from_yaml(&document).unwrap_err().to_string();
        assert!(err.starts_with(&expected), "{class}: {err}");
    }
}

#[test]
fn check_and_install_refuse_each_invalid_class() {
    let temp = TempDir::new("refused");
    for (i, (class, document, expected)) in invalid_documents().into_iter().enumerate() {
        let file = temp.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&file, document).unwrap();
        let shims = temp.path().join(format!("shims-{i}"));
        for (args, dir) in [(&["--check"][..], None), (&[][..], Some(shims.as_path()))] {
            let out = run(&file, args, dir);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{class} {args:?}: {stderr}");
            assert!(
                stderr.starts_with(&format!("{}: {expected}", file.display())),
                "{class} {args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{class}: no PATH printed");
        }
        assert!(!shims.exists(), "{class}: a shim directory was made");
    }
}

#[test]
fn limits_themselves_are_accepted() {
    let max = one(&format!(
        "{}            - {{exit_code: 255, delay_ms: 300000, deadline_ms: 300000}}\n",
        steps(99)
    ));
    let script = CliScript::from_yaml(&max).unwrap();
    let steps = &script.executables[0].responses[0].steps;
    assert_eq!(steps.len(), 100);
    assert_eq!(
        (
            steps[99].exit_code,
            steps[99].delay_ms,
            steps[99].deadline_ms
        ),
        (255, 300_000, Some(300_000))
    );
    let empty = CliScript::from_yaml(&doc("  executables: []\n")).unwrap();
    assert!(empty.executables.is_empty());
    let temp = TempDir::new("limits");
    let file = temp.path().join("max.yaml");
    std::fs::write(&file, max).unwrap();
    let out = run(&file, &["--check"], None);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}: ok (1 executables)\n", file.display())
    );
}

#[test]
fn each_half_refuses_the_other_kind() {
    let temp = TempDir::new("kinds");
    let cli = temp.path().join("cli.yaml");
    std::fs::write(&cli, doc("  executables: []\n")).unwrap();
    for args in [&["--stdio"][..], &["--http", "127.0.0.1:0"][..]] {
        let out = run(&cli, args, None);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "{}: kind: a FaultCli document is installed with --shims DIR, not served over MCP\n",
                cli.display()
            )
        );
    }
    let mcp = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/faults/transient-then-success.yaml");
    let shims = temp.path().join("shims");
    let out = run(&mcp, &[], Some(&shims));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "{}: kind: must be \"FaultCli\", found \"FaultServer\"\n",
            mcp.display()
        )
    );
    assert!(!shims.exists());
}

#[test]
fn a_deadline_past_the_limit_is_refused() {
    let temp = TempDir::new("deadline-limit");
    let file = temp.path().join("cli.yaml");
    std::fs::write(&file, doc("  executables: []\n")).unwrap();
    let shims = temp.path().join("shims");
    let out = run(&file, &["--deadline", "301s"], Some(&shims));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--deadline <DURATION>': must be at most 300000 ms, found 301000 ms"),
        "{stderr}"
    );
    assert!(!shims.exists());
}

#[test]
fn a_shim_refuses_a_tampered_session_document_with_its_path() {
    let temp = TempDir::new("tampered");
    let file = temp.path().join("cli.yaml");
    std::fs::write(&file, one("            - {exit_code: 0, stdout: fine}\n")).unwrap();
    let shims = temp.path().join("shims");
    let out = run(&file, &[], Some(&shims));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snapshot = shims.join(".aip-fault/document.yaml");
    std::fs::write(&snapshot, one("            - {exit_code: 256}\n")).unwrap();
    let out = Command::new(shims.join("t")).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "aip-fault-server: t: the session's document is invalid: {}: {STEP}.exit_code: must be 0..255, found 256; fails closed, nothing real was run\n",
            std::fs::canonicalize(&snapshot).unwrap().display()
        )
    );
}

//! The main error paths of every binary the project ships: a missing file,
//! a missing kubeconfig, an unreachable API server, a bad argument. Each
//! exits non-zero and says what is wrong once, naming the file or flag;
//! kubectl-aip words it as kubectl does (`error: ...`, one line, paths in
//! double quotes, no "(os error N)").

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn binary(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/debug")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (make build)",
        path.display()
    );
    path
}

/// A directory of the test's own under cargo's target/tmp (so that a run
/// that is killed leaves nothing outside target/), removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("aip-errors-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Runs `name` with a clean Kubernetes environment: no KUBECONFIG, no
/// in-cluster variables, HOME an empty folder (so no ~/.kube/config).
fn run(name: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let home = scratch("home");
    let mut command = Command::new(binary(name));
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home.path())
        .stdin(std::process::Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// kubectl's shape: exit 1, exactly one line `error: ...`, said once.
fn kubectl_style(o: &Output) -> String {
    let text = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(text.starts_with("error: "), "{text}");
    assert!(!text.contains("(os error"), "{text}");
    text.trim_end().to_owned()
}

#[test]
fn kubectl_aip_names_a_missing_kubeconfig_once() {
    let tmp = scratch("kc");
    let missing = tmp.path().join("nope.kubeconfig");
    let path = missing.to_str().unwrap();

    let given = run("kubectl-aip", &["approvals", "--kubeconfig", path], &[]);
    assert_eq!(
        kubectl_style(&given),
        format!("error: cannot read the kubeconfig \"{path}\": No such file or directory")
    );

    let from_env = run("kubectl-aip", &["approvals"], &[("KUBECONFIG", &missing)]);
    assert_eq!(
        kubectl_style(&from_env),
        format!(
            "error: no kubeconfig: \"{path}\" does not exist (set KUBECONFIG or pass --kubeconfig)"
        )
    );

    let tmp = scratch("bare-home");
    let home = tmp.path();
    let default = run("kubectl-aip", &["approve", "x"], &[("HOME", home)]);
    let expected = home.join(".kube/config");
    assert_eq!(
        kubectl_style(&default),
        format!(
            "error: no kubeconfig: \"{}\" does not exist (set KUBECONFIG or pass --kubeconfig)",
            expected.display()
        )
    );
}

#[test]
fn kubectl_aip_names_an_unreachable_api_server() {
    // A port that was just free: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tmp = scratch("refused");
    let dir = tmp.path();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n\
             clusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u, namespace: agents}}}}]\n"
        ),
    )
    .unwrap();
    for args in [
        &["approvals"][..],
        &["approve", "ar-1"],
        &["deny", "ar-1", "--reason", "no"],
        &["grant", "fs"],
    ] {
        let out = run(
            "kubectl-aip",
            &[args, &["--kubeconfig", kubeconfig.to_str().unwrap()]].concat(),
            &[],
        );
        let text = kubectl_style(&out);
        assert!(
            text.starts_with(&format!(
                "error: cannot reach the API server https://127.0.0.1:{port}/"
            )),
            "{args:?}: {text}"
        );
        assert!(text.contains("Connection refused"), "{args:?}: {text}");
    }
}

#[test]
fn kubectl_aip_refuses_bad_arguments_before_connecting() {
    let tmp = scratch("args");
    let missing = tmp.path().join("nope.kubeconfig");
    let deny = run(
        "kubectl-aip",
        &["deny", "ar-1", "--reason", " "],
        &[("KUBECONFIG", &missing)],
    );
    assert_eq!(
        kubectl_style(&deny),
        "error: --reason must say why the call is denied"
    );
    let grant = run(
        "kubectl-aip",
        &["grant", "fs", "--operator", "aip-operator"],
        &[("KUBECONFIG", &missing)],
    );
    assert_eq!(
        kubectl_style(&grant),
        "error: --operator must be NAMESPACE/SERVICEACCOUNT, found \"aip-operator\""
    );

    let usage = run("kubectl-aip", &["frobnicate"], &[]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
    assert!(
        stderr(&usage).starts_with("error: unrecognized subcommand 'frobnicate'"),
        "{}",
        stderr(&usage)
    );
    let no_reason = run("kubectl-aip", &["deny", "ar-1"], &[]);
    assert_eq!(no_reason.status.code(), Some(2), "{}", stderr(&no_reason));
    assert!(
        stderr(&no_reason).contains("--reason"),
        "{}",
        stderr(&no_reason)
    );
}

#[test]
fn aip_operator_without_a_cluster_says_why_once() {
    let tmp = scratch("operator");
    let missing = tmp.path().join("nope.kubeconfig");
    let out = run(
        "aip-operator",
        &["--admin-listen", "127.0.0.1:0", "--log-format", "text"],
        &[("KUBECONFIG", &missing)],
    );
    let text = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("connecting to the Kubernetes API"), "{text}");
    assert_eq!(
        text.matches(missing.to_str().unwrap()).count(),
        1,
        "the kubeconfig is named once: {text}"
    );
    assert!(!text.contains("(os error"), "{text}");
}

#[test]
fn a_missing_file_is_named_by_every_binary_that_reads_one() {
    let tmp = scratch("files");
    let missing = tmp.path().join("nope.yaml");
    let path = missing.to_str().unwrap();
    for (name, args) in [
        ("aip", &["policy", "check", path][..]),
        ("aip", &["policy", "convert", path]),
        ("aip-sidecar", &["check", "--config", path]),
        ("aip-sidecar", &["run", "--config", path]),
        ("aip-sidecar", &["stdio", "--config", path]),
        ("aip-fault-server", &["--config", path]),
    ] {
        let out = run(name, args, &[]);
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {text}");
        assert!(text.contains(path), "{name} {args:?}: {text}");
        if name != "aip-fault-server" {
            // The project's own tools: the path once, the reason without
            // its errno, kubectl's prefix where the tool ends on an error.
            assert_eq!(text.matches(path).count(), 1, "{name} {args:?}: {text}");
            assert!(
                text.contains("No such file or directory"),
                "{name} {args:?}: {text}"
            );
            assert!(!text.contains("(os error"), "{name} {args:?}: {text}");
            assert!(
                args[0] == "check" || text.starts_with("error: "),
                "{name} {args:?}: {text}"
            );
        }
    }
}

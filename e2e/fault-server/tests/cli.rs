//! The CLI half as an agent meets it: real processes (a shell script, a
//! Python `subprocess` caller, many at once) invoking mocked executables
//! through PATH, signals and deadlines on real pids, and the attempt log
//! read back from disk.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// How long any single expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

const BINARY: &str = env!("CARGO_BIN_EXE_aip-fault-server");

fn doc(executables: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: FaultCli\nmetadata: {{name: test}}\nspec:\n{executables}"
    )
}

/// A temporary directory of its own, removed when the test ends.
struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Under cargo's target/tmp, so that a run that is killed leaves
    /// nothing outside target/.
    fn new(name: &str) -> TempDir {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("aip-fault-cli-{name}-"))
                .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
                .unwrap(),
        )
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A child that is killed and reaped if the test fails before it exits.
struct Reaped(Option<Child>);

impl Reaped {
    fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Waits for the exit, at most PATIENCE.
    fn wait(&mut self) -> ExitStatus {
        let mut child = self.0.take().unwrap();
        let (tx, rx) = channel();
        let pid = child.id();
        std::thread::spawn(move || tx.send(child.wait().unwrap()));
        rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            signal(pid, "KILL");
            panic!("process {pid} did not exit within {PATIENCE:?}")
        })
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// One mock session: its shims, its attempt log, and a "real" directory
/// later on PATH holding a real `kubectl` (which must never be reached while
/// kubectl is mocked) and an undeclared `realtool`.
struct Rehearsal {
    temp: TempDir,
    shims: PathBuf,
    log: PathBuf,
    /// The PATH the installer printed for the agent.
    path: String,
}

impl Rehearsal {
    fn install(name: &str, document: &str, extra: &[&str]) -> Rehearsal {
        let temp = TempDir::new(name);
        let real = temp.path().join("real");
        std::fs::create_dir_all(&real).unwrap();
        for tool in ["kubectl", "realtool"] {
            write_executable(
                &real.join(tool),
                &format!("#!/bin/sh\necho \"real {tool} $*\"\n"),
            );
        }
        let inherited = format!("{}:{}", real.display(), system_path());
        Rehearsal::install_in(temp, document, extra, &inherited)
    }

    fn install_in(temp: TempDir, document: &str, extra: &[&str], inherited: &str) -> Rehearsal {
        let config = temp.path().join("document.yaml");
        std::fs::write(&config, document).unwrap();
        let shims = temp.path().join("shims");
        let log = temp.path().join("attempts.jsonl");
        let out = install(&config, &shims, &log, extra, inherited);
        assert!(
            out.status.success(),
            "install failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let path = stdout
            .strip_suffix('\n')
            .and_then(|l| l.strip_prefix("PATH="))
            .unwrap_or_else(|| panic!("unexpected install output: {stdout:?}"))
            .to_owned();
        Rehearsal {
            temp,
            shims: std::fs::canonicalize(shims).unwrap(),
            log,
            path,
        }
    }

    fn real(&self) -> PathBuf {
        self.temp.path().join("real")
    }

    /// Runs a shell script with the agent's PATH, in the temp directory.
    fn sh(&self, script: &str) -> Output {
        Command::new("/bin/sh")
            .args(["-c", script])
            .env("PATH", &self.path)
            .current_dir(self.temp.path())
            .output()
            .unwrap()
    }

    /// Starts one invocation of a shim as its own process (the shim execs,
    /// so the pid is the fault server's).
    fn spawn(&self, name: &str, args: &[&str], stdout: Stdio) -> Reaped {
        let child = Command::new(self.shims.join(name))
            .args(args)
            .env("PATH", &self.path)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Reaped(Some(child))
    }

    fn attempts(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until the log holds a line for which `wanted` holds; returns it.
    fn wait_for_line(&self, wanted: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(line) = self.attempts().into_iter().find(&wanted) {
                return line;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no such attempt line within {PATIENCE:?}: {:#?}",
                self.attempts()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_started(&self, pid: u32) -> Value {
        self.wait_for_line(|l| l["pid"] == pid && l["outcome"] == "started")
    }
}

fn install(config: &Path, shims: &Path, log: &Path, extra: &[&str], inherited: &str) -> Output {
    Command::new(BINARY)
        .arg("--config")
        .arg(config)
        .arg("--shims")
        .arg(shims)
        .arg("--log")
        .arg(log)
        .args(extra)
        .env("PATH", inherited)
        .output()
        .unwrap()
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn system_path() -> String {
    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".to_owned())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The log's (outcome, exit_code, step_index) triples, in order.
fn outcomes(attempts: &[Value]) -> Vec<(String, Value, Value)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["outcome"].as_str().unwrap().to_owned(),
                a["exit_code"].clone(),
                a["step_index"].clone(),
            )
        })
        .collect()
}

fn exhausted_message(name: &str, response: usize, steps: usize) -> String {
    format!(
        "aip-fault-server: {name}: scripted sequence exhausted (response {response}, {steps} steps); fails closed, nothing real was run\n"
    )
}

const UNMATCHED: &str = "aip-fault-server: kubectl: no scripted response matches these arguments; fails closed, nothing real was run\n";

const KUBECTL_GET_PODS: &str = "  executables:
    - name: kubectl
      responses:
        - match: [get, pods]
          sequence:
            - {exit_code: 1, stderr: \"error: the server is currently unable to handle the request\\n\"}
            - {exit_code: 0, stdout: \"NAME    READY\\nweb-0   1/1\\n\"}
            - {exit_code: 3, stdout: partial, stderr: \"warning: stale\\n\"}
        - matchRegex: ['^logs$', '^web-[0-9]+$']
          sequence:
            - {exit_code: 0, stdout: \"log line\\n\"}
";

/// `out|err|rc` per call, as a shell script that calls the mock sees them.
const CALL_FOUR_TIMES: &str = r#"
for i in 1 2 3 4; do
    out=$(kubectl get pods 2>err)
    rc=$?
    printf '%s|%s|%s\n' "$out" "$(cat err)" "$rc"
done
"#;

#[test]
fn shell_script_sees_the_scripted_outputs_and_exit_codes_in_order() {
    let r = Rehearsal::install("shell", &doc(KUBECTL_GET_PODS), &[]);
    let out = r.sh(CALL_FOUR_TIMES);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let exhausted = exhausted_message("kubectl", 0, 3);
    assert_eq!(
        text(&out.stdout),
        format!(
            "|error: the server is currently unable to handle the request|1\n\
             NAME    READY\nweb-0   1/1||0\n\
             partial|warning: stale|3\n\
             |{}|125\n",
            exhausted.trim_end()
        )
    );
    let attempts = r.attempts();
    assert_eq!(
        outcomes(&attempts),
        vec![
            ("started".into(), Value::Null, json!(0)),
            ("completed".into(), json!(1), json!(0)),
            ("started".into(), Value::Null, json!(1)),
            ("completed".into(), json!(0), json!(1)),
            ("started".into(), Value::Null, json!(2)),
            ("completed".into(), json!(3), json!(2)),
            ("exhausted".into(), json!(125), Value::Null),
        ]
    );
    let seqs: Vec<u64> = attempts
        .iter()
        .map(|a| a["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    let numbers: Vec<u64> = (attempts.iter())
        .map(|a| a["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, vec![1, 1, 2, 2, 3, 3, 4]);
    let argv_sha256 = hex::encode(Sha256::digest(br#"["get","pods"]"#));
    for a in &attempts {
        assert_eq!(a["executable"], "kubectl");
        assert_eq!(a["response_index"], 0);
        assert_eq!(a["steps_total"], 3);
        assert_eq!(a["argv_sha256"], argv_sha256.as_str());
        assert!(a.get("argv").is_none(), "argv only with --log-args: {a}");
    }
}

#[test]
fn unmatched_arguments_fail_closed_and_consume_nothing() {
    let r = Rehearsal::install("unmatched", &doc(KUBECTL_GET_PODS), &["--log-args"]);
    // An extra argument, a regex that does not match, one argument too many
    // for the positional regexes: never the real kubectl later on PATH.
    for args in ["get pods -A", "logs api", "logs web-0 -f", ""] {
        let out = r.sh(&format!("kubectl {args}"));
        assert_eq!(out.status.code(), Some(125), "kubectl {args}");
        assert_eq!(text(&out.stdout), "", "kubectl {args}");
        assert_eq!(text(&out.stderr), UNMATCHED, "kubectl {args}");
    }
    let out = r.sh("kubectl logs web-12; kubectl get pods");
    assert_eq!(text(&out.stdout), "log line\n");
    assert_eq!(out.status.code(), Some(1), "get pods still plays step 0");
    let attempts = r.attempts();
    let unmatched: Vec<&Value> = (attempts.iter())
        .filter(|a| a["outcome"] == "unmatched")
        .collect();
    assert_eq!(unmatched.len(), 4);
    assert_eq!(unmatched[0]["argv"], json!(["get", "pods", "-A"]));
    assert_eq!(unmatched[3]["argv"], json!([]));
    for a in unmatched {
        assert_eq!(a["exit_code"], 125);
        assert_eq!(a["response_index"], Value::Null);
        assert_eq!(a["step_index"], Value::Null);
    }
    let last = &attempts[attempts.len() - 2];
    assert_eq!(
        (&last["outcome"], &last["step_index"], &last["argv"]),
        (&json!("started"), &json!(0), &json!(["get", "pods"]))
    );
}

#[test]
fn undeclared_executables_still_resolve_through_the_rest_of_path() {
    let r = Rehearsal::install("undeclared", &doc(KUBECTL_GET_PODS), &[]);
    let out = r.sh("command -v kubectl; command -v realtool; realtool a b; uname -s");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "{}\n{}\nreal realtool a b\nLinux\n",
            r.shims.join("kubectl").display(),
            r.real().join("realtool").display()
        )
    );
    assert_eq!(
        r.attempts(),
        Vec::<Value>::new(),
        "nothing mocked was called"
    );
    // Only declared names are shims.
    let names: Vec<String> = std::fs::read_dir(&r.shims)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, vec![".aip-fault", "kubectl"]);
}

fn python() -> PathBuf {
    std::env::var_os("AIP_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

#[test]
fn python_subprocess_caller_sees_the_sequence_in_order() {
    let r = Rehearsal::install("python", &doc(KUBECTL_GET_PODS), &[]);
    let caller = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli_subprocess.py");
    let out = Command::new(python())
        .arg(caller)
        .args(["4", "kubectl", "get", "pods", "--", "realtool", "x"])
        .env("PATH", &r.path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = json!([
        {"argv": ["kubectl", "get", "pods"], "returncode": 1, "stdout": "",
         "stderr": "error: the server is currently unable to handle the request\n"},
        {"argv": ["kubectl", "get", "pods"], "returncode": 0, "stdout": "NAME    READY\nweb-0   1/1\n", "stderr": ""},
        {"argv": ["kubectl", "get", "pods"], "returncode": 3, "stdout": "partial", "stderr": "warning: stale\n"},
        {"argv": ["kubectl", "get", "pods"], "returncode": 125, "stdout": "",
         "stderr": exhausted_message("kubectl", 0, 3)},
        {"argv": ["realtool", "x"], "returncode": 0, "stdout": "real realtool x\n", "stderr": ""},
    ]);
    assert_eq!(report, expected);
    let codes: Vec<Value> = (r.attempts().iter())
        .filter(|a| a["outcome"] != "started")
        .map(|a| a["exit_code"].clone())
        .collect();
    assert_eq!(codes, vec![json!(1), json!(0), json!(3), json!(125)]);
}

#[test]
fn concurrent_invocations_consume_each_step_exactly_once() {
    const N: usize = 100;
    let steps: String = (0..N)
        .map(|i| {
            format!(
                "            - {{exit_code: {}, stdout: \"step {i}\\n\"}}\n",
                i % 7
            )
        })
        .collect();
    let document = doc(&format!(
        "  executables:\n    - name: gh\n      responses:\n        - sequence:\n{steps}"
    ));
    let r = Rehearsal::install("concurrent", &document, &[]);
    // N invocations at once from one shell, each writing its own files.
    let out = r.sh(&format!(
        "for i in $(seq 1 {N}); do (gh api /repos > out.$i; echo $? > rc.$i) & done; wait"
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut seen = BTreeSet::new();
    for i in 1..=N {
        let stdout = std::fs::read_to_string(r.temp.path().join(format!("out.{i}"))).unwrap();
        let step: usize = stdout
            .strip_prefix("step ")
            .and_then(|s| s.trim_end().parse().ok())
            .unwrap_or_else(|| panic!("invocation {i} printed {stdout:?}"));
        let rc = std::fs::read_to_string(r.temp.path().join(format!("rc.{i}"))).unwrap();
        assert_eq!(rc.trim(), (step % 7).to_string(), "invocation {i}");
        assert!(seen.insert(step), "step {step} played twice");
    }
    assert_eq!(seen, (0..N).collect());
    let after = r.sh("gh api /repos");
    assert_eq!(after.status.code(), Some(125));
    assert_eq!(text(&after.stderr), exhausted_message("gh", 0, N));

    let attempts = r.attempts();
    assert_eq!(attempts.len(), 2 * N + 1);
    let seqs: Vec<u64> = attempts
        .iter()
        .map(|a| a["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=2 * N as u64 + 1).collect::<Vec<_>>());
    let started: BTreeSet<u64> = (attempts.iter())
        .filter(|a| a["outcome"] == "started")
        .map(|a| a["step_index"].as_u64().unwrap())
        .collect();
    assert_eq!(started, (0..N as u64).collect());
    // Every invocation's two lines agree on pid, attempt and step.
    for start in attempts.iter().filter(|a| a["outcome"] == "started") {
        let ends: Vec<&Value> = (attempts.iter())
            .filter(|a| a["attempt"] == start["attempt"] && a["outcome"] != "started")
            .collect();
        assert_eq!(ends.len(), 1, "{start}");
        assert_eq!(ends[0]["outcome"], "completed");
        assert_eq!(ends[0]["pid"], start["pid"]);
        assert_eq!(ends[0]["step_index"], start["step_index"]);
        assert!(ends[0]["seq"].as_u64() > start["seq"].as_u64());
    }
    let numbers: BTreeSet<u64> = (attempts.iter())
        .map(|a| a["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (1..=N as u64 + 1).collect());
}

const SLOW: &str = "  executables:
    - name: kubectl
      responses:
        - match: [wait]
          sequence:
            - {exit_code: 0, stdout: never, delay_ms: 300000}
            - {exit_code: 0, stdout: never, delay_ms: 300000}
            - {exit_code: 0, stdout: \"third\\n\"}
        - match: [hang]
          sequence:
            - {exit_code: 0, stdout: never, delay_ms: 300000}
            - {exit_code: 0, stdout: \"second\\n\"}
        - match: [own-deadline]
          sequence:
            - {exit_code: 0, stdout: never, delay_ms: 300000, deadline_ms: 150}
";

fn assert_recorded_then_ended(r: &Rehearsal, pid: u32, outcome: &str, code: u8) -> Value {
    let lines: Vec<Value> = (r.attempts().into_iter())
        .filter(|a| a["pid"] == pid)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(
        (&lines[0]["outcome"], &lines[0]["exit_code"]),
        (&json!("started"), &Value::Null)
    );
    assert_eq!(
        (&lines[1]["outcome"], &lines[1]["exit_code"]),
        (&json!(outcome), &json!(code))
    );
    assert!(lines[0]["seq"].as_u64() < lines[1]["seq"].as_u64());
    assert_eq!(lines[1]["attempt"], lines[0]["attempt"]);
    lines[1].clone()
}

#[test]
fn sigterm_or_sigint_during_a_delay_exits_130_after_the_attempt_is_recorded() {
    let r = Rehearsal::install("sigterm", &doc(SLOW), &[]);
    for (name, step) in [("TERM", 0), ("INT", 1)] {
        let mut child = r.spawn("kubectl", &["wait"], Stdio::piped());
        let pid = child.id();
        let started = r.wait_started(pid);
        assert_eq!(
            (started["step_index"].as_u64(), started["delay_ms"].as_u64()),
            (Some(step), Some(300_000))
        );
        signal(pid, name);
        let status = child.wait();
        assert_eq!(status.code(), Some(130), "SIG{name}: {status:?}");
        let end = assert_recorded_then_ended(&r, pid, "canceled", 130);
        assert_eq!(end["signal"], format!("SIG{name}"));
    }
    // Canceled steps stay consumed: the next call plays step 2.
    let out = r.sh("kubectl wait");
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "third\n".into())
    );
}

#[test]
fn a_deadline_exits_124_after_the_attempt_is_recorded() {
    // The session's --deadline.
    let r = Rehearsal::install("deadline", &doc(SLOW), &["--deadline", "200ms"]);
    let mut child = r.spawn("kubectl", &["wait"], Stdio::piped());
    let pid = child.id();
    assert_eq!(r.wait_started(pid)["deadline_ms"], 200);
    assert_eq!(child.wait().code(), Some(124));
    let end = assert_recorded_then_ended(&r, pid, "deadline", 124);
    assert_eq!(end["deadline_ms"], 200);
    assert!(end["latency_ms"].as_u64().unwrap() >= 200, "{end}");

    // The step's own, smaller than the session's: the smaller applies.
    let out = r.sh("kubectl own-deadline");
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        "aip-fault-server: kubectl: deadline of 150 ms passed\n"
    );
    let own = r.attempts().last().unwrap().clone();
    assert_eq!(
        (own["outcome"].as_str(), own["deadline_ms"].as_u64()),
        (Some("deadline"), Some(150))
    );
}

fn dump(name: &str, exit_code: u8, extra: &[&str]) -> Rehearsal {
    // Well past a pipe's buffer (64 KiB on Linux).
    let big = "x".repeat(1 << 20);
    let document = doc(&format!(
        "  executables:\n    - name: dump\n      responses:\n        - sequence:\n            - {{exit_code: {exit_code}, stdout: {big}}}\n"
    ));
    Rehearsal::install(name, &document, extra)
}

#[test]
fn a_deadline_ends_an_attempt_whose_reader_stopped_draining() {
    let r = dump("stalled", 0, &["--deadline", "300ms"]);
    // Nobody reads stdout: the write blocks on a full pipe, the deadline ends it.
    let mut stalled = r.spawn("dump", &[], Stdio::piped());
    let pid = stalled.id();
    assert_eq!(stalled.wait().code(), Some(124));
    assert_recorded_then_ended(&r, pid, "deadline", 124);
}

#[test]
fn a_reader_that_leaves_early_gets_partial_output_and_the_step_stands() {
    let r = dump("early-reader", 5, &[]);
    // head takes ten bytes and exits; the shell waits for both.
    let out = r.sh("dump | head -c 10");
    assert_eq!(text(&out.stdout), "x".repeat(10));
    // The record says which outcome was played, not that the output arrived.
    let lines = r.attempts();
    assert_eq!(
        outcomes(&lines),
        vec![
            ("started".into(), Value::Null, json!(0)),
            ("completed".into(), json!(5), json!(0)),
        ]
    );
}

#[test]
fn a_sigkilled_attempt_stays_recorded_as_started_with_no_exit_code() {
    let r = Rehearsal::install("sigkill", &doc(SLOW), &[]);
    let mut child = r.spawn("kubectl", &["hang"], Stdio::piped());
    let pid = child.id();
    r.wait_started(pid);
    signal(pid, "KILL");
    assert_eq!(child.wait().signal(), Some(9));
    // The next invocation takes the lock the dead one held and plays step 1.
    let out = r.sh("kubectl hang");
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "second\n".into())
    );
    let attempts = r.attempts();
    let killed: Vec<&Value> = attempts.iter().filter(|a| a["pid"] == pid).collect();
    assert_eq!(killed.len(), 1, "{attempts:#?}");
    assert_eq!(
        (
            &killed[0]["outcome"],
            &killed[0]["exit_code"],
            &killed[0]["step_index"]
        ),
        (&json!("started"), &Value::Null, &json!(0))
    );
    assert_eq!(
        outcomes(&attempts),
        vec![
            ("started".into(), Value::Null, json!(0)),
            ("started".into(), Value::Null, json!(1)),
            ("completed".into(), json!(0), json!(1)),
        ]
    );
    assert_eq!(attempts[1]["attempt"], 2);
}

#[test]
fn an_explicit_empty_list_disables_inherited_mocks() {
    let outer = Rehearsal::install("inherited", &doc(KUBECTL_GET_PODS), &[]);
    assert!(outer.path.starts_with(&outer.shims.display().to_string()));
    // An inner session declares no executables; installed from inside the
    // outer one, its PATH no longer holds the outer shims.
    let temp = TempDir::new("inherited-inner");
    let inner = Rehearsal::install_in(temp, &doc("  executables: []\n"), &[], &outer.path);
    assert_eq!(
        inner.path,
        format!(
            "{}:{}:{}",
            inner.shims.display(),
            outer.real().display(),
            system_path()
        )
    );
    let out = inner.sh("kubectl get pods");
    assert_eq!(text(&out.stdout), "real kubectl get pods\n");
    assert_eq!(outer.attempts(), Vec::<Value>::new());

    // Reinstalling the outer directory with [] removes its shims: a new,
    // empty session in the same place.
    let config = outer.temp.path().join("empty.yaml");
    std::fs::write(&config, doc("  executables: []\n")).unwrap();
    let again = install(&config, &outer.shims, &outer.log, &[], &outer.path);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(!outer.shims.join("kubectl").exists());
    let out = outer.sh("kubectl get pods");
    assert_eq!(text(&out.stdout), "real kubectl get pods\n");
}

#[test]
fn install_refuses_a_directory_that_is_not_a_shim_directory() {
    let temp = TempDir::new("not-shims");
    let config = temp.path().join("document.yaml");
    std::fs::write(&config, doc(KUBECTL_GET_PODS)).unwrap();
    let dir = temp.path().join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubectl"), "precious").unwrap();
    let out = install(&config, &dir, &temp.path().join("log"), &[], &system_path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "aip-fault-server: {}: not an aip-fault-server shim directory (kubectl is neither a shim nor .aip-fault); choose an empty or new directory\n",
            std::fs::canonicalize(&dir).unwrap().display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("kubectl")).unwrap(),
        "precious"
    );
    assert!(!dir.join(".aip-fault").exists());
}

#[test]
fn reinstalling_starts_a_new_session_with_fresh_state() {
    let r = Rehearsal::install("reinstall", &doc(KUBECTL_GET_PODS), &[]);
    assert_eq!(r.sh("kubectl get pods").status.code(), Some(1));
    let config = r.temp.path().join("document.yaml");
    let again = install(&config, &r.shims, &r.log, &[], &system_path());
    assert!(again.status.success());
    assert_eq!(
        r.sh("kubectl get pods").status.code(),
        Some(1),
        "step 0 again"
    );
    let sessions: Vec<Value> = r.attempts().iter().map(|a| a["session"].clone()).collect();
    assert_eq!(sessions.len(), 4);
    assert_eq!(sessions[0], sessions[1]);
    assert_eq!(sessions[2], sessions[3]);
    assert_ne!(sessions[0], sessions[2]);
    assert_eq!(
        r.attempts()[2]["seq"],
        1,
        "the log is appended to, numbered anew"
    );
}

#[test]
fn the_documented_rehearsal_retries_once_after_a_transient_failure() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults");
    let document =
        std::fs::read_to_string(examples.join("cli-transient-then-success.yaml")).unwrap();
    let r = Rehearsal::install("rehearsal", &document, &["--log-args"]);
    let out = Command::new("/bin/sh")
        .arg(examples.join("cli-retry-once.sh"))
        .env("PATH", &r.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "found deployment.apps/web\n");
    assert_eq!(
        text(&out.stderr),
        "Error from server (ServiceUnavailable): the server is currently unable to handle the request\n\
         kubectl exited 1; retrying once\n"
    );
    let summary: Vec<Value> = r
        .attempts()
        .iter()
        .map(|a| {
            json!([
                a["seq"],
                a["attempt"],
                a["step_index"],
                a["outcome"],
                a["exit_code"],
                a["delay_ms"]
            ])
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            json!([1, 1, 0, "started", null, 200]),
            json!([2, 1, 0, "completed", 1, 200]),
            json!([3, 2, 1, "started", null, 0]),
            json!([4, 2, 1, "completed", 0, 0]),
        ]
    );
    assert_eq!(
        r.attempts()[0]["argv"],
        json!(["get", "deployment", "web", "-o", "name"])
    );
}

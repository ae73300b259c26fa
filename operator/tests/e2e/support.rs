//! What the end-to-end stories share: processes of the real binaries, the
//! fault server as the upstream, the platform engineer's objects, waiting.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aip_fault_server::core::Core;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::common::agent::Agent;
use crate::common::kubectl::Kubectl;

pub const PATIENCE: Duration = Duration::from_secs(30);

/// A child process killed on drop, its stderr and stdout (audit records)
/// collected line by line.
pub struct Proc {
    child: Child,
    /// Every stderr line so far; a new line bumps the version.
    lines: tokio::sync::watch::Receiver<Vec<String>>,
    /// Every stdout line so far, likewise.
    out: tokio::sync::watch::Receiver<Vec<String>>,
    name: &'static str,
}

/// Lines of `stream` collected as they come, on a thread of their own.
fn collect(
    stream: impl std::io::Read + Send + 'static,
) -> tokio::sync::watch::Receiver<Vec<String>> {
    let (sink, lines) = tokio::sync::watch::channel(Vec::new());
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.send_modify(|all| all.push(line));
        }
    });
    lines
}

impl Proc {
    pub fn start(name: &'static str, mut command: Command) -> Proc {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let lines = collect(child.stderr.take().unwrap());
        let out = collect(child.stdout.take().unwrap());
        Proc {
            child,
            lines,
            out,
            name,
        }
    }

    /// Everything the process has said so far, stderr then stdout.
    pub fn all_output(&self) -> String {
        let mut all = self.lines.borrow().join("\n");
        all.push('\n');
        all.push_str(&self.out.borrow().join("\n"));
        all
    }

    /// Waits for a stdout line (an audit record) containing every one of
    /// `needles`; returns it.
    pub async fn record(&self, needles: &[&str]) -> String {
        let mut out = self.out.clone();
        let has = |l: &String| needles.iter().all(|n| l.contains(n));
        let found = tokio::time::timeout(PATIENCE, out.wait_for(|all| all.iter().any(has))).await;
        let all = self.out.borrow().clone();
        assert!(
            matches!(found, Ok(Ok(_))),
            "{} never wrote a record with {needles:?}:\n{}",
            self.name,
            all.join("\n")
        );
        all.into_iter().find(|l| has(l)).unwrap()
    }

    /// Waits until `count` stderr lines contain `needle`.
    pub async fn lines_with(&self, needle: &str, count: usize) {
        self.lines_within(needle, count, PATIENCE).await;
    }

    /// The same, waiting up to `patience`.
    pub async fn lines_within(&self, needle: &str, count: usize, patience: Duration) {
        let mut lines = self.lines.clone();
        let found = tokio::time::timeout(
            patience,
            lines.wait_for(|all| all.iter().filter(|l| l.contains(needle)).count() >= count),
        )
        .await;
        assert!(
            matches!(found, Ok(Ok(_))),
            "{} never said {needle:?} {count} times:\n{}",
            self.name,
            self.lines.borrow().join("\n")
        );
    }

    /// How many stderr lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .borrow()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub async fn line(&self, needle: &str) -> String {
        let mut lines = self.lines.clone();
        let found = tokio::time::timeout(
            PATIENCE,
            lines.wait_for(|all| all.iter().any(|l| l.contains(needle))),
        )
        .await;
        let all = self.lines.borrow().clone();
        assert!(
            matches!(found, Ok(Ok(_))),
            "{} never said {needle:?}:\n{}",
            self.name,
            all.join("\n")
        );
        all.into_iter().find(|l| l.contains(needle)).unwrap()
    }

    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // AIP_E2E_LOGS=1 shows every process's stderr, passing or not.
        if std::thread::panicking() || std::env::var_os("AIP_E2E_LOGS").is_some() {
            eprintln!(
                "--- {} said:\n{}",
                self.name,
                self.lines.borrow().join("\n")
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace binary built beside this crate's.
pub fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_aip-operator")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`make build`)",
        path.display()
    );
    path
}

pub fn policy(tools: &[&str]) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: files, namespace: agents}}\nspec:\n  allowed_tools: {}\n  podSelector: {{matchLabels: {{app: agent}}}}\n  toolConnections: [fs]\n",
        json!(tools)
    )
}

/// A Secret `name` in namespace agents holding `token` under key token.
pub fn secret_named(name: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: agents}}\nstringData: {{token: {token}}}\n"
    )
}

pub fn secret(token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: fs-token, namespace: agents}}\nstringData: {{token: {token}}}\n"
    )
}

/// Calls `f` until it returns Some, or fails after PATIENCE.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn error_code(response: &Value) -> Option<i64> {
    response["error"]["code"].as_i64()
}

/// The name of the one ApprovalRequest that is pending, once there is one.
pub async fn pending_request(kubectl: &Kubectl) -> String {
    eventually("an ApprovalRequest is pending", || {
        let kubectl = kubectl.clone();
        async move {
            let names = kubectl.get(
                "approvalrequests",
                "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
            );
            (!names.is_empty() && !names.contains(' ')).then_some(names)
        }
    })
    .await
}

/// Calls `tool` until it returns a result (not an error); the result.
pub async fn succeeds(agent: &Agent, what: &str, tool: &str, arguments: Value) -> Value {
    eventually(what, || {
        let mut agent = clone_agent(agent);
        let arguments = arguments.clone();
        async move {
            let r = agent.call(tool, arguments).await;
            r.get("result").is_some().then_some(r)
        }
    })
    .await
}

pub fn clone_agent(agent: &Agent) -> Agent {
    Agent::resume(agent.addr, &agent.session)
}

/// The sidecar in Kubernetes mode, pointed at the operator on `grpc`.
pub fn start_sidecar(ca: &Path, grpc: u16, token_file: &Path) -> Proc {
    start_sidecar_with(ca, grpc, token_file, &[])
}

/// The same with `extra` arguments to `run`.
pub fn start_sidecar_with(
    ca: &Path,
    grpc: u16,
    token_file: &Path,
    extra: &[&std::ffi::OsStr],
) -> Proc {
    start_sidecar_logging(ca, grpc, token_file, extra, "info")
}

/// The same, its diagnostics filtered by `rust_log` (RUST_LOG).
pub fn start_sidecar_logging(
    ca: &Path,
    grpc: u16,
    token_file: &Path,
    extra: &[&std::ffi::OsStr],
    rust_log: &str,
) -> Proc {
    let mut c = Command::new(binary("aip-sidecar"));
    c.env("RUST_LOG", rust_log);
    c.args(["--log-format", "json", "run"])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .arg("--operator")
        .arg(format!("https://127.0.0.1:{grpc}"))
        .arg("--operator-ca")
        .arg(ca)
        // The name the operator's certificate carries (it is made for the
        // chart's Service).
        .args(["--operator-server-name", "aip-operator.aip-system.svc"])
        .arg("--token-file")
        .arg(token_file)
        .args(extra);
    Proc::start("aip-sidecar", c)
}

/// The agent pod `agents/agent-1` (service account `agent`, `app=agent`)
/// and its sidecar, started as the kubelet would with a token bound to the
/// pod: the sidecar's process and an agent session on it.
pub async fn agent_pod_with_sidecar(
    cluster: &crate::common::Cluster,
    dir: &Path,
    installed: &Installed,
) -> (Proc, Agent) {
    cluster.service_account("agents", "agent").await;
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let token = sidecar_token(cluster, dir, "agent", "agent-1", &uid).await;
    let sidecar = start_sidecar(&installed.ca, installed.ports.grpc, &token);
    let agent = agent_of(&sidecar).await;
    (sidecar, agent)
}

/// The operator's ports: gRPC and webhooks fixed (it comes back on them).
#[derive(Clone, Copy)]
pub struct Ports {
    pub grpc: u16,
    pub webhook: u16,
}

/// The fault server on loopback as the upstream `files`: `read_file` and
/// `delete_file` answer "contents" and "deleted" (50 times each) to callers
/// presenting `Bearer tok-A`; its URL and attempt log. It stops with
/// `shutdown`.
pub async fn start_fault_server(dir: &Path, shutdown: &CancellationToken) -> (String, PathBuf) {
    start_fault_server_with(dir, shutdown, "", "").await
}

/// The same, with `read_extra` and `delete_extra` (tool members, as YAML
/// flow entries ending in a comma) added to the two tools.
pub async fn start_fault_server_with(
    dir: &Path,
    shutdown: &CancellationToken,
    read_extra: &str,
    delete_extra: &str,
) -> (String, PathBuf) {
    let attempts = dir.join("attempts.jsonl");
    let script = format!(
        "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: files}}\nspec:\n  requireBearer: {{sha256: {}}}\n  tools:\n    - {{name: read_file, {read_extra} responses: [{{sequence: [{}]}}]}}\n    - {{name: delete_file, {delete_extra} responses: [{{sequence: [{}]}}]}}\n",
        hex::encode(Sha256::digest(b"tok-A")),
        vec!["{return: contents}"; 50].join(", "),
        vec!["{return: deleted}"; 50].join(", "),
    );
    let fault = Core::new(
        Script::from_yaml(&script, Transport::Http).unwrap(),
        AttemptLog::new(Box::new(std::fs::File::create(&attempts).unwrap()), false),
    );
    let url = aip_fault_server::http::start_on_loopback(fault, shutdown.clone())
        .await
        .unwrap();
    (url, attempts)
}

/// The ToolConnection `fs` to `url`, with the `fs-token` Secret as bearer.
pub fn connection(url: &str) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: fs, namespace: agents}}\nspec:\n  url: {url}\n  toolPrefix: fs_\n  bearerToken: {{valueFrom: {{secretKeyRef: {{name: fs-token, key: token}}}}}}\n"
    )
}

/// How many delete_file calls reached the upstream.
pub fn deletes(attempts: &Path) -> usize {
    std::fs::read_to_string(attempts)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"tool\":\"delete_file\""))
        .count()
}

/// An agent session on the sidecar's MCP endpoint, once it listens.
pub async fn agent_of(sidecar: &Proc) -> Agent {
    let line = sidecar.line("agents at http://").await;
    let addr: SocketAddr = line
        .split("agents at http://")
        .nth(1)
        .and_then(|rest| rest.split("/mcp").next())
        .unwrap()
        .parse()
        .unwrap();
    Agent::connect(addr).await
}

/// Waits until the agent lists `tool`.
pub async fn lists(agent: &Agent, tool: &str) {
    eventually(&format!("{tool} reaches the agent"), || {
        let mut agent = clone_agent(agent);
        async move {
            agent
                .tool_names()
                .await
                .iter()
                .any(|t| t == tool)
                .then_some(())
        }
    })
    .await;
}

/// Helm (target/bin/helm on PATH) as the administrator of a cluster, with
/// its own cache and configuration directories.
pub struct Helm {
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Helm {
    pub fn new(kubeconfig: &Path, dir: &Path) -> Helm {
        let home = dir.join("helm");
        std::fs::create_dir_all(&home).unwrap();
        Helm {
            kubeconfig: kubeconfig.to_owned(),
            home,
        }
    }

    /// `helm ARGS --kubeconfig ...`: whether it succeeded, and what it said.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("helm")
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .output()
            .expect("helm on PATH (make helm puts one in target/bin)");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, said) = self.run(args);
        assert!(ok, "helm {args:?} failed:\n{said}");
        said
    }

    /// The objects of release `aip` in aip-system as Helm applied them.
    pub fn manifest(&self) -> Vec<Value> {
        let text = self.ok(&["get", "manifest", "aip", "--namespace", "aip-system"]);
        text.split("\n---")
            .filter_map(|doc| {
                let object = serde_saphyr::from_str::<Value>(doc)
                    .unwrap_or_else(|e| panic!("helm's manifest does not parse ({e}):\n{doc}"));
                (!object.is_null()).then_some(object)
            })
            .collect()
    }
}

/// The chart's path in the workspace.
pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/aip");

/// `helm install aip charts/aip` into aip-system, its Service pointing at
/// this host (type ExternalName, `localhost`) and the webhooks on
/// `webhook_port`: the API server calls the operator running here through
/// the chart's own Service and webhook configurations. `extra`: more
/// `helm install` flags. (No `--wait`: with no kubelet the Deployment's
/// pods never run; this test runs the operator itself.)
pub fn helm_install(helm: &Helm, webhook_port: u16, extra: &[&str]) -> String {
    let port = format!("service.webhookPort={webhook_port}");
    let mut args = vec![
        "install",
        "aip",
        CHART,
        "--namespace",
        "aip-system",
        "--create-namespace",
        "--set",
        "service.externalName=localhost",
        "--set",
        &port,
    ];
    args.extend_from_slice(extra);
    helm.ok(&args)
}

/// The operator's arguments as the chart's Deployment gives them.
pub fn operator_args(manifest: &[Value]) -> Vec<String> {
    let deployment = manifest
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the chart has the operator's Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The operator binary as the chart runs it (`args` from the chart's
/// Deployment, each flag in `extra` replacing the chart's), as the user of
/// `kubeconfig`, listening on `ports` of loopback.
pub fn start_chart_operator(
    kubeconfig: &Path,
    args: &[String],
    ports: Ports,
    extra: &[&str],
) -> Proc {
    let overridden = |arg: &&String| {
        extra
            .iter()
            .filter(|e| e.starts_with("--"))
            .any(|flag| arg.split('=').next() == flag.split('=').next())
    };
    let mut c = Command::new(binary("aip-operator"));
    c.env("KUBECONFIG", kubeconfig)
        .args(args.iter().filter(|a| !overridden(a)))
        .args(["--grpc-listen", &format!("127.0.0.1:{}", ports.grpc)])
        .args(["--webhook-listen", &format!("127.0.0.1:{}", ports.webhook)])
        .args(["--admin-listen", "127.0.0.1:0"])
        // What the Deployment's fieldRefs would give it.
        .env("POD_NAMESPACE", "aip-system")
        .env("POD_NAME", "aip-operator-0")
        .args(extra);
    Proc::start("aip-operator", c)
}

/// The CA the operator made (in its TLS Secret), written to `dir`/ca.crt.
pub fn operator_ca(admin: &Kubectl, dir: &Path) -> PathBuf {
    use base64::Engine;
    let encoded = admin.ok(
        &[
            "get",
            "secret",
            "aip-operator-tls",
            "-n",
            "aip-system",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ],
        None,
    );
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .unwrap();
    let path = dir.join("operator-ca.crt");
    std::fs::write(&path, pem).unwrap();
    path
}

/// The chart installed with Helm, and how its operator runs: as the
/// chart's service account, on fixed ports (so it can come back where
/// sidecars and the API server expect it).
pub struct Installed {
    pub helm: Helm,
    /// The operator's identity: its service account's token.
    pub kubeconfig: PathBuf,
    /// The operator's arguments, from the chart's Deployment.
    pub args: Vec<String>,
    /// The CA the operator made, for sidecars to trust.
    pub ca: PathBuf,
    pub ports: Ports,
}

impl Installed {
    /// Installs the chart and starts its operator; the installation and
    /// the operator's process.
    pub async fn start(
        cluster: &crate::common::Cluster,
        admin: &Kubectl,
        dir: &Path,
    ) -> (Installed, Proc) {
        Installed::start_with(cluster, admin, dir, &[]).await
    }

    /// The same, the operator given `extra` flags besides the chart's.
    pub async fn start_with(
        cluster: &crate::common::Cluster,
        admin: &Kubectl,
        dir: &Path,
        extra: &[&str],
    ) -> (Installed, Proc) {
        let ports = Ports {
            grpc: crate::common::local::free_port(),
            webhook: crate::common::local::free_port(),
        };
        let helm = Helm::new(&admin.kubeconfig, dir);
        helm_install(&helm, ports.webhook, &[]);
        let args = operator_args(&helm.manifest());
        let token = cluster.account_token("aip-system", "aip-operator").await;
        let kubeconfig = cluster.kubeconfig(dir, &token);
        let operator = start_chart_operator(&kubeconfig, &args, ports, extra);
        operator.line("caBundle written").await;
        operator.line("cluster state loaded").await;
        let ca = operator_ca(admin, dir);
        let installed = Installed {
            helm,
            kubeconfig,
            args,
            ca,
            ports,
        };
        (installed, operator)
    }

    /// Another operator process as the chart runs it (`extra` replacing
    /// the chart's flags), once the previous one is gone.
    pub fn restart(&self, extra: &[&str]) -> Proc {
        start_chart_operator(&self.kubeconfig, &self.args, self.ports, extra)
    }
}

/// The token the kubelet would project for pod `pod` (uid)'s sidecar,
/// running as `account` in namespace agents, written to `dir`/token.
pub async fn sidecar_token(
    cluster: &crate::common::Cluster,
    dir: &Path,
    account: &str,
    pod: &str,
    uid: &str,
) -> PathBuf {
    let token = cluster
        .token("agents", account, pod, uid, &[aip_proto::TOKEN_AUDIENCE])
        .await;
    let path = dir.join("token");
    std::fs::write(&path, token).unwrap();
    path
}

/// Every Event in namespace agents as "reason Kind/name: note" lines.
pub fn events(kubectl: &Kubectl) -> String {
    kubectl.ok(
        &[
            "get",
            "events.events.k8s.io",
            "-n",
            "agents",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.regarding.kind}/{.regarding.name}: {.note}{\"\\n\"}{end}",
        ],
        None,
    )
}

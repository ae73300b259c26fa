//! What the node stories share: the node's control plane, the chart
//! installed once per node, kubectl as each person, waiting on the
//! cluster with `kubectl wait` (it watches).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aip_kube_test::{Dedicated, User};
use serde_json::Value;

use crate::common::Cluster;
use crate::common::agent::Agent;
use crate::common::kubectl::Kubectl;

/// The operator's namespace and release, as the quickstart names them.
pub const RELEASE: &str = "aip";
pub const OPERATOR_NAMESPACE: &str = "aip-system";

/// How long a pod may take to be scheduled, pulled from containerd's
/// store and started on the loaded 2-core machine.
pub const POD_PATIENCE: Duration = Duration::from_secs(120);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whose turn it is on the node: most stories share it; one that stops the
/// operator or the API server has it alone (within this test process,
/// which is how `make node-test` runs them).
static TURN: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The node's cluster for one story, holding its turn.
pub struct OnNode {
    pub cluster: Cluster,
    _turn: Turn,
}

enum Turn {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(tokio::sync::RwLockWriteGuard<'static, ()>),
}

impl std::ops::Deref for OnNode {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

/// The node's cluster, with the chart installed (once per node: the first
/// test to get here installs it, the others wait for it), shared with the
/// other stories.
pub async fn cluster() -> OnNode {
    let turn = Turn::Shared(TURN.read().await);
    on_node(turn).await
}

/// The same, for a story that stops what the others need (the operator,
/// the API server): it runs alone.
pub async fn cluster_alone() -> OnNode {
    let turn = Turn::Alone(TURN.write().await);
    on_node(turn).await
}

async fn on_node(turn: Turn) -> OnNode {
    let plane = Dedicated::Given(aip_kube_test::node().await);
    let admin = plane.client(User::Admin).await;
    let cluster = Cluster { plane, admin };
    let kubectl = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    tokio::task::spawn_blocking(move || install_chart_once(&kubectl))
        .await
        .unwrap();
    OnNode {
        cluster,
        _turn: turn,
    }
}

/// `helm install` of charts/aip as it ships, `--wait`ing for the operator's
/// Deployment; under a lock in the node's directory, so that test processes
/// (a runner may start one per test) install it once between them.
fn install_chart_once(kubectl: &Kubectl) {
    static ONCE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut installed = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if *installed {
        return;
    }
    let node_dir = std::env::var_os(aip_kube_test::node::ENV).unwrap();
    let lock = Path::new(&node_dir).join("chart.lock");
    let helm = repo().join("target/bin/helm");
    let chart = repo().join("charts/aip");
    let script = format!(
        "{helm} status {RELEASE} -n {OPERATOR_NAMESPACE} >/dev/null 2>&1 || \
         {helm} install {RELEASE} {chart} --namespace {OPERATOR_NAMESPACE} --create-namespace --wait --timeout 5m {lock}",
        helm = helm.display(),
        chart = chart.display(),
        lock = lock_values(Path::new(&node_dir)).join(" "),
    );
    let out = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", &script])
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .output()
        .expect("flock and sh");
    assert!(
        out.status.success(),
        "helm install failed:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        kubectl
            .run(
                &["get", "pods,events", "-n", OPERATOR_NAMESPACE, "-o", "wide"],
                None
            )
            .1
    );
    wait_webhooks(kubectl, Duration::from_secs(60));
    *installed = true;
}

/// The chart's egress-lock values on the test node: the CNI DaemonSet on,
/// into the node's own CNI directories, the node's DNS server. Namespaces
/// without an EgressLock are not locked: every other story runs with the
/// plugin installed and shows that it changes nothing for them.
pub fn lock_values(node_dir: &Path) -> Vec<String> {
    use aip_kube_test::node::{CNI_BIN, CNI_CONF, NODE_ADDRESS};
    vec![
        "--set egressLock.cni.enabled=true".to_owned(),
        format!(
            "--set egressLock.cni.binDir={}",
            node_dir.join(CNI_BIN).display()
        ),
        format!(
            "--set egressLock.cni.confDir={}",
            node_dir.join(CNI_CONF).display()
        ),
        format!("--set egressLock.clusterDNS[0]={NODE_ADDRESS}"),
    ]
}

/// Waits until the operator's webhooks answer through their Service. Helm's
/// `--wait` ends when the Deployment is Available, but the Service reaches
/// its pods only once kube-proxy has written their rules: a story's first
/// `kubectl apply` could be refused until then. The probe is a server-side
/// dry run of an AgentPolicy (it creates nothing); whatever answer the
/// webhook gives ends the wait, only a call that never reached it repeats.
fn wait_webhooks(kubectl: &Kubectl, patience: Duration) {
    let probe = format!(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: webhook-probe, namespace: {OPERATOR_NAMESPACE}}}\nspec:\n  podSelector: {{matchLabels: {{app: webhook-probe}}}}\n  allowed_tools: [probe]\n"
    );
    let (_, out, err) = dry_run_until_answered(kubectl, &probe, patience);
    assert!(
        !err.contains("failed calling webhook"),
        "the operator's webhooks do not answer: {out}{err}"
    );
}

/// `kubectl wait --for=FOR OBJECT` in the kubectl's namespace, for up to
/// `patience`; kubectl's own words on failure, with the namespace's pods
/// and Events.
pub fn wait_for(kubectl: &Kubectl, object: &str, condition: &str, patience: Duration) {
    let timeout = format!("--timeout={}s", patience.as_secs());
    let (ok, out, err) = kubectl.run(
        &[
            "wait",
            "-n",
            &kubectl.namespace,
            object,
            &format!("--for={condition}"),
            &timeout,
        ],
        None,
    );
    assert!(
        ok,
        "kubectl wait {object} --for={condition}: {out}{err}\n{}",
        describe(kubectl)
    );
}

/// Waits until the injector answers for pods in `namespace`. A Deployment
/// is Available once its pod is Ready, but the webhook's Service reaches
/// that pod only after kube-proxy has written its rules (up to its minimum
/// sync period later): until then the API server's call is refused. The
/// probe is a server-side dry run, which calls the webhooks and creates
/// nothing; a refusal for any other reason fails at once.
pub fn wait_injector(kubectl: &Kubectl, namespace: &str, patience: Duration) {
    let probe = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: injector-probe, namespace: {namespace}}}\nspec:\n  containers: [{{name: agent, image: {PAUSE}}}]\n"
    );
    let (ok, out, err) = dry_run_until_answered(kubectl, &probe, patience);
    assert!(
        ok,
        "the injector does not answer in {namespace}: {out}{err}"
    );
}

/// A server-side dry run of `probe` (it calls the webhooks and creates
/// nothing), repeated while the call to a webhook does not get through
/// (for up to `patience`); kubectl's last result.
fn dry_run_until_answered(
    kubectl: &Kubectl,
    probe: &str,
    patience: Duration,
) -> (bool, String, String) {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let (ok, out, err) = kubectl.run(&["apply", "--dry-run=server", "-f", "-"], Some(probe));
        if ok || !err.contains("failed calling webhook") || std::time::Instant::now() >= deadline {
            return (ok, out, err);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The namespace's pods and Events, for a failure report.
pub fn describe(kubectl: &Kubectl) -> String {
    let (_, pods, _) = kubectl.run(
        &["get", "pods", "-n", &kubectl.namespace, "-o", "wide"],
        None,
    );
    let (_, events, _) = kubectl.run(
        &[
            "get",
            "events",
            "-n",
            &kubectl.namespace,
            "--sort-by=.lastTimestamp",
        ],
        None,
    );
    format!("pods:\n{pods}\nevents:\n{events}")
}

/// The one pod matching `selector`, as JSON, once it exists.
pub async fn pod(kubectl: &Kubectl, selector: &str) -> Value {
    eventually(&format!("a pod {selector}"), POD_PATIENCE, || async {
        let (ok, out, _) = kubectl.run(
            &[
                "get",
                "pods",
                "-n",
                &kubectl.namespace,
                "-l",
                selector,
                "-o",
                "json",
            ],
            None,
        );
        serde_json::from_str::<Value>(&out)
            .ok()
            .filter(|_| ok)
            .and_then(|list| list["items"].get(0).cloned())
    })
    .await
}

/// The names of the operator's pods (not the chart's other pods, such as
/// the aip-cni DaemonSet's), space-separated.
pub fn operator_pod_names(kubectl: &Kubectl) -> String {
    kubectl.ok(
        &[
            "get",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=aip-operator",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )
}

/// `kubectl logs` of one container of the pods matching `selector`.
/// Every line the operator's pods logged.
pub fn operator_logs(kubectl: &Kubectl) -> String {
    kubectl.ok(
        &[
            "logs",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=aip-operator",
            "--tail=-1",
        ],
        None,
    )
}

pub fn logs(kubectl: &Kubectl, object: &str, container: &str) -> String {
    kubectl
        .run(
            &["logs", "-n", &kubectl.namespace, object, "-c", container],
            None,
        )
        .1
}

/// Waits until `container`'s log of `object` has a line containing
/// `needle`; the whole log.
pub async fn log_line(
    kubectl: &Kubectl,
    object: &str,
    container: &str,
    needle: &str,
    patience: Duration,
) -> String {
    let what = format!("{object} container {container} logs {needle:?}");
    eventually(&what, patience, || async {
        let log = logs(kubectl, object, container);
        log.contains(needle).then_some(log)
    })
    .await
}

/// The name of the one pending ApprovalRequest, once there is one.
pub async fn pending_request(kubectl: &Kubectl, patience: Duration) -> String {
    eventually("a pending ApprovalRequest", patience, || async {
        let names = kubectl.get(
            "approvalrequests",
            "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
        );
        (!names.is_empty() && !names.contains(' ')).then_some(names)
    })
    .await
}

/// fs_read_file through `agent` answers what the tool server says.
pub async fn reads(agent: &mut Agent) {
    let read = agent
        .call("fs_read_file", serde_json::json!({"path": "/q3"}))
        .await;
    assert_eq!(
        read["result"]["content"][0]["text"], "Q3: revenue up 12%",
        "{read}"
    );
}

/// Calls `tool` in the session until the gateway answers it with a result
/// (a policy change reached the pod); the answer.
pub async fn until_allowed(
    forward: &Forward,
    agent: &Agent,
    tool: &str,
    patience: Duration,
) -> Value {
    eventually(
        &format!("{tool} allowed in the running pod"),
        patience,
        || {
            let mut agent = Agent::resume(forward.addr, &agent.session);
            async move {
                let answer = agent.call(tool, serde_json::json!({"path": "/old"})).await;
                answer.get("result").is_some().then_some(answer)
            }
        },
    )
    .await
}

/// An RFC 3339 time of the API (second resolution), comparable as text.
pub fn time<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("no {what} in {value}"))
}

/// One story's world on the node: a namespace of its own opted in to
/// injection, a scripted tool server (aip-fault-server from its image) as
/// Deployment `files` and Service `files` there, the connection `fs` to it
/// with its bearer token in Secret `fs-token` (granted), and agent pods
/// whose agent container is a do-nothing process: the test itself plays
/// the agent through `kubectl port-forward` to the pod's loopback port
/// 15001, exactly where the injected gateway listens for its agents.
pub struct Story {
    pub namespace: String,
    pub admin: Kubectl,
}

/// The tool server's script: read_file answers, delete_file and chmod do
/// what they say; only `token`'s SHA-256 is in it.
pub fn upstream_script(token: &str) -> String {
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    // A sequence answers one call per step: as many as a story makes.
    let steps = |value: &str| vec![format!("{{return: \"{value}\"}}"); 100].join(", ");
    let (read, delete, chmod) = (
        steps("Q3: revenue up 12%"),
        steps("deleted"),
        steps("changed"),
    );
    format!(
        "apiVersion: aip.io/v1alpha1
kind: FaultServer
metadata: {{name: files}}
spec:
  requireBearer: {{sha256: {sha}}}
  tools:
    - name: read_file
      description: Read a file.
      inputSchema: {{type: object, properties: {{path: {{type: string}}}}, required: [path]}}
      responses: [{{sequence: [{read}]}}]
    - name: delete_file
      description: Delete a file.
      inputSchema: {{type: object, properties: {{path: {{type: string}}}}, required: [path]}}
      responses: [{{sequence: [{delete}]}}]
    - name: chmod
      description: Change a file's mode.
      responses: [{{sequence: [{chmod}]}}]
"
    )
}

impl Story {
    /// A fresh namespace `PREFIX-xxxxx`, labelled for injection.
    pub async fn new(cluster: &Cluster, prefix: &str) -> Story {
        let namespace = cluster.fresh_namespace(prefix).await;
        let admin = cluster.kubectl(User::Admin, &namespace);
        admin.ok(
            &["label", "namespace", &namespace, "aip.io/inject=enabled"],
            None,
        );
        Story { namespace, admin }
    }

    /// The tool server, accepting `server_token`; the connection `fs` with
    /// `secret_token` in its Secret, granted; returns once the server's pod
    /// is Ready.
    pub fn tools(&self, server_token: &str, secret_token: &str) {
        self.tools_scripted(&upstream_script(server_token), secret_token, "");
    }

    /// The same with the tool server playing `script`, and `extra` (spec
    /// lines, indented) added to the connection.
    pub fn tools_scripted(&self, script: &str, secret_token: &str, extra: &str) {
        let ns = &self.namespace;
        self.admin.apply(&format!(
            "{}---
apiVersion: v1
kind: Secret
metadata: {{name: fs-token, namespace: {ns}}}
stringData: {{token: {secret_token}}}
---
apiVersion: aip.io/v1alpha1
kind: ToolConnection
metadata: {{name: fs, namespace: {ns}}}
spec:
  url: http://files.{ns}.svc.cluster.local:8080/mcp
  toolPrefix: fs_
  bearerToken: {{valueFrom: {{secretKeyRef: {{name: fs-token, key: token}}}}}}
  healthCheck: {{intervalSeconds: 5}}
{extra}",
            self.files_server(script)
        ));
        let (ok, out, err) = self.admin.aip(&["grant", "fs", "-n", ns]);
        assert!(ok, "{out}{err}");
        wait_for(
            &self.admin,
            "deployment/files",
            "condition=Available",
            POD_PATIENCE,
        );
    }

    /// The tool server playing `script` (its ConfigMap, Deployment and
    /// Service `files`), as YAML documents to apply.
    pub fn files_server(&self, script: &str) -> String {
        let ns = &self.namespace;
        let script = script.replace('\n', "\n    ");
        format!(
            "apiVersion: v1
kind: ConfigMap
metadata: {{name: files-script, namespace: {ns}}}
data:
  script.yaml: |
    {script}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: files, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: files}}}}
  template:
    metadata: {{labels: {{app: files, aip.io/inject: disabled}}}}
    spec:
      automountServiceAccountToken: false
      containers:
        - name: files
          image: ghcr.io/aip-k8s/aip-fault-server:{VERSION}
          args: [--http, \"0.0.0.0:8080\", --config, /etc/files/script.yaml]
          ports: [{{name: mcp, containerPort: 8080}}]
          readinessProbe: {{httpGet: {{path: /healthz, port: mcp}}, periodSeconds: 1}}
          volumeMounts: [{{name: script, mountPath: /etc/files}}]
      volumes: [{{name: script, configMap: {{name: files-script}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: files, namespace: {ns}}}
spec:
  selector: {{app: files}}
  ports: [{{name: mcp, port: 8080, targetPort: mcp}}]
"
        )
    }

    /// AgentPolicy `files` for pods `app=agent`: `allowed` tools, and
    /// `rules` (YAML list items, indented as `tool_rules` entries).
    pub fn policy(&self, allowed: &[&str], rules: &str) {
        self.admin.apply(&self.policy_text(allowed, rules, 300));
    }

    /// Policy `files` that lets agents read and holds fs_delete_file for a
    /// person (`timeout_seconds` to decide), and group `approvers` (alice)
    /// bound to decide in the namespace.
    pub fn asking(&self, timeout_seconds: u32) {
        let ns = &self.namespace;
        let policy = self.policy_text(
            &["fs_read_file", "fs_delete_file"],
            "    - {tool: fs_delete_file, action: ask}\n",
            timeout_seconds,
        );
        self.admin.apply(&format!(
            "{policy}---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: approvers, namespace: {ns}}}
subjects: [{{kind: Group, name: approvers, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{kind: ClusterRole, name: aip-approver, apiGroup: rbac.authorization.k8s.io}}
"
        ));
    }

    fn policy_text(&self, allowed: &[&str], rules: &str, timeout_seconds: u32) -> String {
        let ns = &self.namespace;
        let rules = if rules.is_empty() {
            String::new()
        } else {
            format!("  tool_rules:\n{rules}")
        };
        format!(
            "apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {{name: files, namespace: {ns}}}
spec:
  podSelector: {{matchLabels: {{app: agent}}}}
  toolConnections: [fs]
  allowed_tools: {allowed}
  approval: {{timeoutSeconds: {timeout_seconds}}}
{rules}",
            allowed = serde_json::json!(allowed),
        )
    }

    /// Pod `name` (`app=agent`), its agent container the node's pause
    /// image; returns once the kubelet reports it Ready.
    pub fn agent_pod(&self, name: &str) {
        self.apply_agent(name, PAUSE, "Always");
        wait_for(
            &self.admin,
            &format!("pod/{name}"),
            "condition=Ready",
            POD_PATIENCE,
        );
    }

    /// Pod `name` (`app=agent`) running the example agent (the official
    /// MCP Go SDK's client, inside the pod): it lists its tools, reads,
    /// tries fs_chmod, and deletes, printing a line for each, and exits.
    pub fn example_agent(&self, name: &str) {
        let image = format!("ghcr.io/aip-k8s/aip-example-agent:{VERSION}");
        self.apply_agent(name, &image, "Never");
    }

    /// A pod `app=agent` whose one container runs `image`.
    fn apply_agent(&self, name: &str, image: &str, restart: &str) {
        let ns = &self.namespace;
        self.admin.apply(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{app: agent}}}}
spec:
  restartPolicy: {restart}
  containers:
    - name: agent
      image: {image}
"
        ));
    }

    /// How often the kubelet restarted pod `name`'s sidecar.
    pub fn sidecar_restarts(&self, name: &str) -> Value {
        self.pod_json(name)["status"]["initContainerStatuses"][0]["restartCount"].clone()
    }

    /// A session through `kubectl port-forward` to the pod's gateway, once
    /// the gateway lists `tool` (the connection's catalog is fetched after
    /// the pod is Ready).
    pub async fn agent_session(&self, pod: &str, tool: &str) -> (Forward, Agent) {
        let forward = Forward::to(&self.admin, pod, 15001);
        let agent = Agent::connect(forward.addr).await;
        let session = agent.session.clone();
        eventually(
            &format!("{pod}'s gateway lists {tool}"),
            POD_PATIENCE,
            || {
                let mut agent = Agent::resume(forward.addr, &session);
                async move {
                    agent
                        .tool_names()
                        .await
                        .iter()
                        .any(|t| t == tool)
                        .then_some(())
                }
            },
        )
        .await;
        (forward, agent)
    }

    /// The pod as JSON.
    pub fn pod_json(&self, name: &str) -> Value {
        let out = self.admin.ok(
            &["get", "pod", name, "-n", &self.namespace, "-o", "json"],
            None,
        );
        serde_json::from_str(&out).unwrap()
    }

    /// The tool server's attempt log lines for `tool`.
    pub fn upstream_calls(&self, tool: &str) -> Vec<Value> {
        logs(&self.admin, "deployment/files", "files")
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["tool"] == tool)
            .collect()
    }
}

impl Drop for Story {
    /// A failed story shows its namespace: pods, Events, and every gateway's
    /// log (the one before a restart too).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        eprintln!(
            "--- namespace {}:\n{}",
            self.namespace,
            describe(&self.admin)
        );
        let names = self.admin.get("pods", "{.items[*].metadata.name}");
        for pod in names.split_whitespace() {
            for previous in ["--previous=false", "--previous=true"] {
                let (_, log, _) = self.admin.run(
                    &[
                        "logs",
                        "-n",
                        &self.namespace,
                        pod,
                        "-c",
                        "aip-sidecar",
                        previous,
                    ],
                    None,
                );
                if !log.is_empty() {
                    eprintln!("--- {pod} aip-sidecar ({previous}):\n{log}");
                }
            }
        }
    }
}

/// Puts the operator's Deployment back to its replicas when dropped, so
/// that a story that stopped it and failed does not fail the others.
pub struct OperatorReplicas {
    kubectl: Kubectl,
    pub replicas: String,
}

impl OperatorReplicas {
    pub fn scale_to_zero(kubectl: Kubectl) -> OperatorReplicas {
        let replicas = kubectl.get("deployment/aip-operator", "{.spec.replicas}");
        kubectl.ok(
            &[
                "scale",
                "deployment/aip-operator",
                "-n",
                OPERATOR_NAMESPACE,
                "--replicas=0",
            ],
            None,
        );
        OperatorReplicas { kubectl, replicas }
    }

    pub fn restore(&self) {
        self.kubectl.ok(
            &[
                "scale",
                "deployment/aip-operator",
                "-n",
                OPERATOR_NAMESPACE,
                &format!("--replicas={}", self.replicas),
            ],
            None,
        );
        wait_for(
            &self.kubectl,
            "deployment/aip-operator",
            "condition=Available",
            POD_PATIENCE,
        );
    }
}

impl Drop for OperatorReplicas {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.restore();
        }
    }
}

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The node's sandbox image, also a do-nothing agent container.
pub const PAUSE: &str = "localhost/aip-node/pause:1.0";

/// `kubectl port-forward` to a pod's loopback port: what the test's agent
/// connects to stands for the agent container's `127.0.0.1:PORT`.
pub struct Forward {
    child: std::process::Child,
    pub addr: std::net::SocketAddr,
}

impl Forward {
    pub fn to(kubectl: &Kubectl, pod: &str, port: u16) -> Forward {
        use std::io::BufRead;
        let mut child = Command::new("kubectl")
            .args([
                "port-forward",
                "--address=127.0.0.1",
                "-n",
                &kubectl.namespace,
                &format!("pod/{pod}"),
                &format!(":{port}"),
            ])
            .env("KUBECONFIG", &kubectl.kubeconfig)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("kubectl");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        // kubectl says "Handling connection for PORT" on every connection:
        // a closed pipe would end it (SIGPIPE).
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        // "Forwarding from 127.0.0.1:PORT -> 15001"
        let addr = line
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("kubectl port-forward said {line:?}"));
        Forward { child, addr }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls `f` every 100 ms until it returns Some, for up to `patience`.
pub async fn eventually<T, F, Fut>(what: &str, patience: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The containerd id of container `container` of pod `name` (the sidecar is
/// an init container, the others regular ones), once it runs.
pub fn container_id(story: &Story, name: &str, container: &str) -> String {
    let pod = story.pod_json(name);
    let statuses = ["initContainerStatuses", "containerStatuses"];
    statuses
        .iter()
        .flat_map(|list| pod["status"][list].as_array().cloned().unwrap_or_default())
        .find(|s| s["name"] == container)
        .and_then(|s| s["containerID"].as_str().map(str::to_owned))
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_owned))
        .unwrap_or_else(|| panic!("no running container {container} in pod {name}: {pod}"))
}

/// `ctr` against the node's containerd, in Kubernetes' namespace; its
/// stdout.
fn ctr(args: &[&str]) -> String {
    let node = aip_kube_test::node::NodeInfo::read(std::path::Path::new(
        &std::env::var_os(aip_kube_test::node::ENV).unwrap(),
    ))
    .unwrap();
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&node.containerd_socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends `signal` (SIGTERM, SIGKILL) to a container's process, as the
/// kubelet or an OOM kill would.
pub fn signal_container(id: &str, signal: &str) {
    ctr(&["tasks", "kill", "--signal", signal, id]);
}

/// The host pid of a container's process.
pub fn container_pid(id: &str) -> u32 {
    ctr(&["tasks", "ls"])
        .lines()
        .find(|l| l.starts_with(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no task {id}"))
}

/// Resets every TCP connection to port `port` that the network namespace
/// of process `pid` holds, as a conntrack flush or a load balancer would:
/// the kernel aborts the sockets and sends each peer a reset. How many
/// sockets `ss` listed (and so killed).
pub fn reset_connections(pid: u32, port: u16) -> usize {
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "ss", "-K", "-t", "-n"])
        .args(["dport", "=", &format!(":{port}")])
        .output()
        .expect("nsenter and ss");
    let listed = String::from_utf8_lossy(&out.stdout);
    listed.lines().filter(|l| l.starts_with("ESTAB")).count()
}

/// The operator's gRPC port as the injected sidecar of pod `name` dials it.
pub fn operator_port(story: &Story, name: &str) -> u16 {
    let pod = story.pod_json(name);
    let args = pod["spec"]["initContainers"][0]["args"].clone();
    let url = args
        .as_array()
        .and_then(|a| {
            a.iter()
                .skip_while(|v| *v != "--operator")
                .nth(1)
                .and_then(Value::as_str)
        })
        .unwrap_or_else(|| panic!("no --operator in {args}"))
        .to_owned();
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// Every line container `container` of pod `name` printed (`previous`: of
/// the container before its restart).
pub fn container_log(story: &Story, name: &str, container: &str, previous: bool) -> String {
    story
        .admin
        .run(
            &[
                "logs",
                "-n",
                &story.namespace,
                name,
                "-c",
                container,
                &format!("--previous={previous}"),
            ],
            None,
        )
        .1
}

/// The sidecar's audit line for `tool` (its stdout, which kubectl logs
/// beside the diagnostics), once it is there.
pub async fn audit_line(story: &Story, name: &str, tool: &str, previous: bool) -> Value {
    eventually(
        &format!("an audit line for {tool}"),
        POD_PATIENCE,
        || async {
            container_log(story, name, "aip-sidecar", previous)
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["tool"] == tool && l.get("decision").is_some())
        },
    )
    .await
}

/// Every line of `log` is a JSON object: what a log pipeline parses.
pub fn assert_json_lines(what: &str, log: &str) {
    for (i, line) in log.lines().enumerate() {
        let parsed = serde_json::from_str::<Value>(line);
        assert!(
            parsed.as_ref().is_ok_and(Value::is_object),
            "line {} of {what} is not a JSON object: {line}",
            i + 1
        );
    }
}

/// Every line the story's sidecars (now and before a restart) and the
/// operator's pods printed parses as JSON, under the JSON format they run
/// with.
pub fn assert_logs_are_json(story: &Story, cluster: &Cluster) {
    let names = story.admin.get("pods", "{.items[*].metadata.name}");
    for pod in names.split_whitespace() {
        for previous in [false, true] {
            let log = container_log(story, pod, "aip-sidecar", previous);
            assert_json_lines(&format!("{pod}'s aip-sidecar (previous: {previous})"), &log);
        }
    }
    let operator = cluster.kubectl(User::Admin, OPERATOR_NAMESPACE);
    let names = operator.get("pods", "{.items[*].metadata.name}");
    for pod in names.split_whitespace() {
        for previous in [false, true] {
            let (_, log, _) = operator.run(
                &[
                    "logs",
                    "-n",
                    OPERATOR_NAMESPACE,
                    pod,
                    &format!("--previous={previous}"),
                ],
                None,
            );
            assert_json_lines(&format!("{pod} (previous: {previous})"), &log);
        }
    }
}

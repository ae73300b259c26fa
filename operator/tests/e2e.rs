//! The platform engineer's story, end to end, against the fake API server:
//! kubectl applies the CRDs, a Secret, a ToolConnection pointing at the
//! fault server and an AgentPolicy; the real aip-operator binary streams the
//! pod's configuration to the real aip-sidecar binary in Kubernetes mode,
//! which enforces it on an agent's calls. Editing the policy changes
//! enforcement and the status shows the new hash synced 1/1; an invalid edit
//! is refused by the operator's webhook and, admitted while the webhook is
//! not registered, marked Accepted=False while the sidecar keeps the previous
//! policy; a pod selected by two policies refuses every call;
//! stopping the operator leaves the sidecar enforcing; rotating the Secret
//! makes the next call use the new credential, and the upstream's 401 hides
//! the connection's tools. A ToolConnection naming a Secret its author
//! cannot read is refused, and a sidecar with the pod's default token (the
//! wrong audience) gets nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aip_fault_server::core::Core;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use common::Cluster;
use common::agent::Agent;
use common::kubectl::{Kubectl, tempdir, webhook_configuration};
use common::local::{TlsFiles, free_port};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(30);

/// A child process killed on drop, its stderr collected line by line.
struct Proc {
    child: Child,
    /// Every stderr line so far; a new line bumps the version.
    lines: tokio::sync::watch::Receiver<Vec<String>>,
    name: &'static str,
}

impl Proc {
    fn start(name: &'static str, mut command: Command) -> Proc {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let (sink, lines) = tokio::sync::watch::channel(Vec::new());
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.send_modify(|all| all.push(line));
            }
        });
        Proc { child, lines, name }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    async fn line(&self, needle: &str) -> String {
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

    fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
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
fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_aip-operator")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`make build`)",
        path.display()
    );
    path
}

fn policy(tools: &[&str]) -> String {
    format!(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: files, namespace: agents}}\nspec:\n  allowed_tools: {}\n  podSelector: {{matchLabels: {{app: agent}}}}\n  toolConnections: [fs]\n",
        json!(tools)
    )
}

fn secret(token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: fs-token, namespace: agents}}\nstringData: {{token: {token}}}\n"
    )
}

/// Calls `f` until it returns Some, or fails after PATIENCE.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
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

fn error_code(response: &Value) -> Option<i64> {
    response["error"]["code"].as_i64()
}

// kubectl blocks a worker while the API server runs on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_to_sidecar_enforcement() {
    let dir = tempdir();
    // bob is a platform engineer who may edit aip objects but not read the
    // Secret the connection uses.
    let cluster = Cluster::with_users("bob-token,bob,u-bob,\"platform\"\n").await;
    let kubeconfig = dir.join("admin.kubeconfig");
    std::fs::write(
        &kubeconfig,
        cluster.running.kubeconfig(aip_fake_apiserver::ADMIN_TOKEN),
    )
    .unwrap();
    let kubectl = Kubectl {
        kubeconfig: kubeconfig.clone(),
    };

    // The upstream: a fault server that takes only tok-A.
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let attempts = dir.join("attempts.jsonl");
    let script = format!(
        "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: files}}\nspec:\n  requireBearer: {{sha256: {}}}\n  tools:\n    - name: read_file\n      responses: [{{sequence: [{}]}}]\n    - name: delete_file\n      responses: [{{sequence: [{}]}}]\n",
        hex::encode(Sha256::digest(b"tok-A")),
        vec!["{return: contents}"; 50].join(", "),
        vec!["{return: deleted}"; 50].join(", "),
    );
    let fault = Core::new(
        Script::from_yaml(&script, Transport::Http).unwrap(),
        AttemptLog::new(Box::new(std::fs::File::create(&attempts).unwrap()), false),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fault_url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(fault.clone().run(shutdown.clone()));
    tokio::spawn(aip_fault_server::http::serve(
        fault.clone(),
        listener,
        Default::default(),
        shutdown.clone(),
    ));

    // The platform engineer's objects.
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/aip.io.yaml");
    kubectl.ok(&["apply", "-f", crds], None);
    kubectl.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: aip-system}\n");
    kubectl.apply(&secret("tok-A"));
    kubectl.apply(&format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: fs, namespace: agents}}\nspec:\n  url: {fault_url}\n  toolPrefix: fs_\n  bearerToken: {{valueFrom: {{secretKeyRef: {{name: fs-token, key: token}}}}}}\n"
    ));
    kubectl.apply(&policy(&["fs_read_file"]));

    // The agent pod, and the token the kubelet would project for its sidecar.
    cluster.service_account("agents", "agent").await;
    let uid = cluster
        .pod("agents", "agent-1", "agent", json!({"app": "agent"}))
        .await;
    let token = cluster
        .token(
            "agents",
            "agent",
            "agent-1",
            &uid,
            &[aip_proto::TOKEN_AUDIENCE],
        )
        .await;
    let token_file = dir.join("token");
    std::fs::write(&token_file, &token).unwrap();

    // The operator (a fixed port and certificate, so that it can come back
    // where the sidecar expects it), then the sidecar pointed at it.
    let tls = TlsFiles::new(&dir);
    let ports = Ports {
        grpc: free_port(),
        webhook: free_port(),
    };
    let grpc = ports.grpc;
    let mut operator = start_operator(&kubeconfig, &tls, ports);
    operator.line("gRPC config service listening").await;
    kubectl.apply(&webhook_configuration(
        "Validating",
        "validate",
        &format!("https://127.0.0.1:{}/validate", ports.webhook),
        &tls.cert_pem,
        "agentpolicies, toolconnections",
    ));
    // bob may not aim a Secret he cannot read at a host of his choosing.
    kubectl.apply("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: aip-editor, namespace: agents}\nrules:\n- {apiGroups: [aip.io], resources: [agentpolicies, toolconnections], verbs: [get, list, create, update, patch]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bob-edits-aip, namespace: agents}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\nroleRef: {kind: Role, name: aip-editor, apiGroup: rbac.authorization.k8s.io}\n");
    let bob = Kubectl {
        kubeconfig: cluster.kubeconfig(&dir, "bob-token"),
    };
    let (ok, _, err) = bob.run(
        &["apply", "-f", "-"],
        Some("apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {name: exfil, namespace: agents}\nspec:\n  url: https://bob.example.net/mcp\n  bearerToken: {valueFrom: {secretKeyRef: {name: fs-token, key: token}}}\n"),
    );
    assert!(!ok, "refused");
    assert!(
        err.contains("names Secret fs-token, which bob may not get in namespace agents"),
        "{err}"
    );

    // A sidecar presenting the pod's default token (the API server's
    // audience) gets nothing: it never leaves its empty, deny-all config.
    let default_token = cluster.token("agents", "agent", "agent-1", &uid, &[]).await;
    let default_token_file = dir.join("default-token");
    std::fs::write(&default_token_file, &default_token).unwrap();
    let impostor = start_sidecar(&tls.cert, grpc, &default_token_file);
    let line = impostor
        .line("configuration stream from the operator lost")
        .await;
    assert!(line.contains("audience"), "{line}");
    drop(impostor);

    let sidecar = start_sidecar(&tls.cert, grpc, &token_file);
    let agents_line = sidecar.line("agents at http://").await;
    let agent_addr: SocketAddr = agents_line
        .split("agents at http://")
        .nth(1)
        .and_then(|rest| rest.split("/mcp").next())
        .unwrap()
        .parse()
        .unwrap();
    let mut agent = Agent::connect(agent_addr).await;

    // Enforced: the granted tool works, the other is refused.
    eventually("the connection's tools reach the agent", || {
        let mut agent = clone_agent(&agent);
        async move {
            agent
                .tool_names()
                .await
                .contains(&"fs_read_file".to_owned())
                .then_some(())
        }
    })
    .await;
    let read = agent.call("fs_read_file", json!({"path": "a"})).await;
    assert_eq!(read["result"]["content"][0]["text"], "contents", "{read}");
    let refused = agent.call("fs_delete_file", json!({"path": "a"})).await;
    assert_eq!(error_code(&refused), Some(-32001), "{refused}");
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/1");
    kubectl.wait("toolconnection/fs", "{.status.health.state}", "Healthy");
    assert_eq!(
        kubectl.get("toolconnection/fs", "{.status.tools[*].name}"),
        "delete_file read_file"
    );
    let listed = kubectl.ok(&["get", "aip", "-n", "agents"], None);
    assert!(
        listed.contains("agentpolicy.aip.io/files") && listed.contains("toolconnection.aip.io/fs"),
        "{listed}"
    );
    assert!(
        listed.contains("Healthy") && listed.contains("1/1"),
        "{listed}"
    );
    let first_hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
    assert!(first_hash.starts_with("sha256:"));

    // Editing the policy changes enforcement; the status follows.
    kubectl.apply(&policy(&["fs_read_file", "fs_delete_file"]));
    let deleted = succeeds(
        &agent,
        "the edited policy is enforced",
        "fs_delete_file",
        json!({"path": "a"}),
    )
    .await;
    assert_eq!(deleted["result"]["content"][0]["text"], "deleted");
    kubectl.wait("agentpolicy/files", "{.status.synced}", "1/1");
    let second_hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
    assert_ne!(second_hash, first_hash);
    kubectl.wait("agentpolicy/files", "{.status.observedGeneration}", "2");

    // An ask waits for a person while the agent's other calls go on; a
    // status patch with kubectl releases it, exactly once.
    kubectl.apply(&format!(
        "{}  tool_rules: [{{tool: fs_delete_file, action: ask}}]\n",
        policy(&["fs_read_file", "fs_delete_file"])
    ));
    let asking = eventually("the ask rule is in force", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.clone(),
        };
        let second_hash = second_hash.clone();
        async move {
            let hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
            let synced = kubectl.get("agentpolicy/files", "{.status.synced}");
            (hash != second_hash && synced == "1/1").then_some(hash)
        }
    })
    .await;
    assert!(asking.starts_with("sha256:"));
    let deletes = |log: &str| {
        log.lines()
            .filter(|l| l.contains("\"tool\":\"delete_file\""))
            .count()
    };
    let before = deletes(&std::fs::read_to_string(&attempts).unwrap());
    let held = tokio::spawn({
        let mut agent = clone_agent(&agent);
        async move { agent.call("fs_delete_file", json!({"path": "held"})).await }
    });
    let name = eventually("an ApprovalRequest appears", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.clone(),
        };
        async move {
            let names = kubectl.get("approvalrequests", "{.items[*].metadata.name}");
            (!names.is_empty()).then_some(names)
        }
    })
    .await;
    assert!(name.starts_with("fs-delete-file-"), "{name}");
    let apr = format!("approvalrequest/{name}");
    assert_eq!(kubectl.get(&apr, "{.status.decision}"), "Pending");
    assert_eq!(kubectl.get(&apr, "{.spec.arguments}"), r#"{"path":"held"}"#);
    assert_eq!(
        kubectl.get(&apr, "{.metadata.labels.aip\\.io/pod}"),
        "agent-1"
    );
    let other = agent
        .call("fs_read_file", json!({"path": "meanwhile"}))
        .await;
    assert_eq!(
        other["result"]["content"][0]["text"], "contents",
        "other calls do not wait"
    );
    assert_eq!(
        deletes(&std::fs::read_to_string(&attempts).unwrap()),
        before,
        "nothing sent yet"
    );
    let (ok, said) = kubectl.decide(&name, "Approved", "");
    assert!(ok, "{said}");
    let released = tokio::time::timeout(PATIENCE, held).await.unwrap().unwrap();
    assert_eq!(
        released["result"]["content"][0]["text"], "deleted",
        "{released}"
    );
    assert_eq!(
        deletes(&std::fs::read_to_string(&attempts).unwrap()),
        before + 1,
        "forwarded exactly once"
    );
    assert_eq!(kubectl.get(&apr, "{.status.decision}"), "Approved");

    // A call the agent cancels while it waits is withdrawn and never sent,
    // whatever is decided later.
    let cancelled = tokio::spawn({
        let agent = clone_agent(&agent);
        async move {
            agent
                .call_as(777, "fs_delete_file", json!({"path": "cancelled"}))
                .await
        }
    });
    let withdrawn = pending_request(&kubeconfig).await;
    agent
        .notify(
            "notifications/cancelled",
            json!({"requestId": 777, "reason": "changed my mind"}),
        )
        .await;
    kubectl.wait(
        &format!("approvalrequest/{withdrawn}"),
        "{.status.decision}",
        "Withdrawn",
    );
    let answer = tokio::time::timeout(PATIENCE, cancelled)
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer.is_null() || answer.get("result").is_none(),
        "{answer}"
    );
    // (Without the approval webhooks registered here, a late decision is
    // even written; it releases nothing.)
    let (ok, said) = kubectl.decide(&withdrawn, "Approved", "");
    assert!(ok, "{said}");
    assert_eq!(
        deletes(&std::fs::read_to_string(&attempts).unwrap()),
        before + 1,
        "never sent"
    );

    // Two identical calls need two approvals.
    let first = tokio::spawn({
        let mut agent = clone_agent(&agent);
        async move { agent.call("fs_delete_file", json!({"path": "twice"})).await }
    });
    let second = tokio::spawn({
        let mut agent = clone_agent(&agent);
        async move { agent.call("fs_delete_file", json!({"path": "twice"})).await }
    });
    let both = eventually("two requests are pending", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.clone(),
        };
        async move {
            let names = kubectl.get(
                "approvalrequests",
                "{.items[?(@.status.decision==\"Pending\")].metadata.name}",
            );
            let names: Vec<String> = names.split_whitespace().map(str::to_owned).collect();
            (names.len() == 2).then_some(names)
        }
    })
    .await;
    let (ok, said) = kubectl.decide(&both[0], "Approved", "");
    assert!(ok, "{said}");
    eventually("one of the two is released", || {
        let attempts = attempts.clone();
        async move {
            (deletes(&std::fs::read_to_string(&attempts).unwrap()) == before + 2).then_some(())
        }
    })
    .await;
    assert!(
        !(first.is_finished() && second.is_finished()),
        "the other still waits"
    );
    let (ok, said) = kubectl.decide(&both[1], "Approved", "");
    assert!(ok, "{said}");
    for call in [first, second] {
        let r = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
        assert_eq!(r["result"]["content"][0]["text"], "deleted", "{r}");
    }
    let before = before + 2;

    // A denial answers -32004 and sends nothing.
    let held = tokio::spawn({
        let mut agent = clone_agent(&agent);
        async move {
            agent
                .call("fs_delete_file", json!({"path": "denied"}))
                .await
        }
    });
    let pending = "{.items[?(@.status.decision==\"Pending\")].metadata.name}";
    let denied = eventually("a second ApprovalRequest is pending", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.clone(),
        };
        async move {
            let names = kubectl.get("approvalrequests", pending);
            (!names.is_empty()).then_some(names)
        }
    })
    .await;
    let (ok, said) = kubectl.decide(&denied, "Denied", r#","reason":"not today""#);
    assert!(ok, "{said}");
    let refused = tokio::time::timeout(PATIENCE, held).await.unwrap().unwrap();
    assert_eq!(error_code(&refused), Some(-32004), "{refused}");
    assert_eq!(
        deletes(&std::fs::read_to_string(&attempts).unwrap()),
        before + 1
    );

    // Undecided until it expires: -32005, and the request says Expired.
    kubectl.apply(&format!(
        "{}  tool_rules: [{{tool: fs_delete_file, action: ask}}]\n  approval: {{timeoutSeconds: 1}}\n",
        policy(&["fs_read_file", "fs_delete_file"])
    ));
    // The timeout is read when the operator creates the request: the
    // index having this generation is what counts.
    kubectl.wait("agentpolicy/files", "{.status.observedGeneration}", "4");
    let expired = eventually("the short timeout is in force", || {
        let mut agent = clone_agent(&agent);
        async move {
            let r = agent.call("fs_delete_file", json!({"path": "late"})).await;
            (error_code(&r) == Some(-32005)).then_some(r)
        }
    })
    .await;
    assert_eq!(expired["error"]["code"], -32005, "{expired}");
    let decisions = kubectl.get("approvalrequests", "{.items[*].status.decision}");
    assert!(decisions.contains("Expired"), "{decisions}");
    assert_eq!(
        deletes(&std::fs::read_to_string(&attempts).unwrap()),
        before + 1,
        "nothing sent"
    );
    kubectl.apply(&policy(&["fs_read_file", "fs_delete_file"]));
    eventually("the ask rule is gone again", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.clone(),
        };
        let second_hash = second_hash.clone();
        async move {
            let hash = kubectl.get("agentpolicy/files", "{.status.policyHash}");
            let synced = kubectl.get("agentpolicy/files", "{.status.synced}");
            (hash == second_hash && synced == "1/1").then_some(())
        }
    })
    .await;

    // An invalid edit is refused at apply time by the operator's webhook...
    let invalid = format!(
        "{}  tool_rules: [{{tool: fs_read_file, rate_limit: lots}}]\n",
        policy(&["fs_read_file"])
    );
    let (ok, _, err) = kubectl.run(&["apply", "-f", "-"], Some(&invalid));
    assert!(!ok, "the webhook refuses it");
    assert!(
        err.contains("denied the request: AgentPolicy files is invalid: spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\""),
        "{err}"
    );
    // ...and, admitted while the webhook is not there, marked and not enforced.
    kubectl.ok(
        &["delete", "validatingwebhookconfiguration", "validate"],
        None,
    );
    kubectl.apply(&invalid);
    kubectl.wait(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Accepted\")].status}",
        "False",
    );
    let message = kubectl.get(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Accepted\")].message}",
    );
    assert!(
        message.starts_with("spec.tool_rules[0].rate_limit: invalid rate_limit \"lots\""),
        "{message}"
    );
    assert_eq!(
        kubectl.get("agentpolicy/files", "{.status.policyHash}"),
        second_hash
    );
    let still = agent.call("fs_delete_file", json!({"path": "b"})).await;
    assert!(
        still.get("result").is_some(),
        "the previous policy stays in force: {still}"
    );

    // A second policy selecting the same pod: neither applies, both say so,
    // and the pod gets an Event.
    kubectl.apply("apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: wide, namespace: agents}\nspec:\n  allowed_tools: [fs_read_file]\n");
    kubectl.wait(
        "agentpolicy/wide",
        "{.status.conditions[?(@.type==\"Conflict\")].status}",
        "True",
    );
    let conflict = kubectl.get(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Conflict\")].message}",
    );
    assert!(conflict.contains("agent-1 (also wide)"), "{conflict}");
    eventually(
        "the pod caught between two policies refuses every call",
        || {
            let mut agent = clone_agent(&agent);
            async move {
                error_code(&agent.call("fs_read_file", json!({"path": "x"})).await).map(|_| ())
            }
        },
    )
    .await;
    let events = kubectl.ok(
        &[
            "get",
            "events.events.k8s.io",
            "-n",
            "agents",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.regarding.kind}/{.regarding.name}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(events.contains("PolicyConflict Pod/agent-1"), "{events}");
    kubectl.ok(&["delete", "agentpolicy", "wide", "-n", "agents"], None);
    kubectl.wait(
        "agentpolicy/files",
        "{.status.conditions[?(@.type==\"Conflict\")].status}",
        "False",
    );
    eventually("the pod is governed again", || {
        let mut agent = clone_agent(&agent);
        async move {
            agent
                .call("fs_read_file", json!({"path": "y"}))
                .await
                .get("result")
                .map(|_| ())
        }
    })
    .await;

    // Without the operator the sidecar keeps enforcing its last config.
    operator.terminate();
    let read = agent.call("fs_read_file", json!({"path": "c"})).await;
    assert!(read.get("result").is_some(), "{read}");
    assert_eq!(
        error_code(&agent.call("fs_other", json!({})).await),
        Some(-32001)
    );

    // Back, then a rotated Secret: the next call carries the new credential,
    // the upstream refuses it, and the connection's tools disappear.
    let operator = start_operator(&kubeconfig, &tls, ports);
    operator.line("cluster state loaded").await;
    kubectl.apply(&secret("tok-B"));
    // The old credential still works upstream, so a 401 proves the new one
    // was sent.
    eventually(
        "the rotated credential's 401 hides the connection's tools",
        || {
            let mut agent = clone_agent(&agent);
            async move {
                (!agent
                    .tool_names()
                    .await
                    .iter()
                    .any(|t| t.starts_with("fs_")))
                .then_some(())
            }
        },
    )
    .await;
    kubectl.wait(
        "toolconnection/fs",
        "{.status.health.state}",
        "NeedsCredentials",
    );
    assert_eq!(
        kubectl.get("toolconnection/fs", "{.status.health.httpStatus}"),
        "401"
    );
    let hidden = agent.call("fs_read_file", json!({"path": "e"})).await;
    assert_eq!(
        hidden["error"]["message"], "Unknown tool: fs_read_file",
        "{hidden}"
    );

    // Rotating back restores the tools, and the upstream sees tok-A again.
    kubectl.apply(&secret("tok-A"));
    let read = succeeds(
        &agent,
        "the restored credential brings the tools back",
        "fs_read_file",
        json!({"path": "f"}),
    )
    .await;
    assert_eq!(read["result"]["content"][0]["text"], "contents");
    kubectl.wait("toolconnection/fs", "{.status.health.state}", "Healthy");
    let want = hex::encode(Sha256::digest(b"Bearer tok-A"));
    let log = std::fs::read_to_string(&attempts).unwrap();
    let last = log.lines().last().unwrap();
    assert!(last.contains(&want), "{last}");
    assert!(!log.contains("tok-A"), "the attempt log holds digests only");
    drop(sidecar);
}

/// The name of the one ApprovalRequest that is pending, once there is one.
async fn pending_request(kubeconfig: &Path) -> String {
    eventually("an ApprovalRequest is pending", || {
        let kubectl = Kubectl {
            kubeconfig: kubeconfig.to_owned(),
        };
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
async fn succeeds(agent: &Agent, what: &str, tool: &str, arguments: Value) -> Value {
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

fn clone_agent(agent: &Agent) -> Agent {
    Agent::resume(agent.addr, &agent.session)
}

/// The sidecar in Kubernetes mode, pointed at the operator on `grpc`.
fn start_sidecar(ca: &Path, grpc: u16, token_file: &Path) -> Proc {
    let mut c = Command::new(binary("aip-sidecar"));
    c.args(["--log-format", "json", "run"])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .arg("--operator")
        .arg(format!("https://127.0.0.1:{grpc}"))
        .arg("--operator-ca")
        .arg(ca)
        .args(["--operator-server-name", "localhost"])
        .arg("--token-file")
        .arg(token_file);
    Proc::start("aip-sidecar", c)
}

/// The operator's ports: gRPC and webhooks fixed (it comes back on them).
#[derive(Clone, Copy)]
struct Ports {
    grpc: u16,
    webhook: u16,
}

fn start_operator(kubeconfig: &Path, tls: &TlsFiles, ports: Ports) -> Proc {
    let mut c = Command::new(binary("aip-operator"));
    c.env("KUBECONFIG", kubeconfig)
        .args(["--grpc-listen", &format!("127.0.0.1:{}", ports.grpc)])
        .args(["--webhook-listen", &format!("127.0.0.1:{}", ports.webhook)])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"])
        .args(["--namespace", "aip-system", "--pod-name", "operator-0"])
        .arg("--tls-cert")
        .arg(&tls.cert)
        .arg("--tls-key")
        .arg(&tls.key);
    Proc::start("aip-operator", c)
}

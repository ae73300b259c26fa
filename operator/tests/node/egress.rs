//! The egress lock in real pods: the chart's aip-cni DaemonSet installed
//! the plugin into the node's own CNI directories (support.rs); a namespace
//! with an EgressLock has its governed pods locked when their sandboxes are
//! made. The agent container here is aip-probe (an agent that ignores its
//! gateway), probed with `kubectl exec` as its own user.
//!
//! - with the lock, the agent's direct TCP and UDP to a tool server's
//!   ClusterIP and pod IP, IPv4 and IPv6 (addresses the test gives the
//!   pods, the node having none), are refused within 1 s; DNS, an allowed
//!   destination and the call through its gateway work; the gateway's own
//!   user reaches what the agent may not;
//! - without an EgressLock nothing changes;
//! - an agent container as the gateway's user, as root or with NET_ADMIN is
//!   refused at admission, naming the field;
//! - with the plugin gone from the node (the DaemonSet's pod stopped, which
//!   takes it out of the node's CNI configuration), a new locked pod proves
//!   its lock missing and never runs its agent; an ungoverned pod starts.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::{
    OPERATOR_NAMESPACE, POD_PATIENCE, Story, cluster, cluster_alone, container_id, container_pid,
    describe, eventually, wait_for,
};

const PROBE_IMAGE: &str = "localhost/aip-node/aip-probe:1.0";
/// A refusal comes at once: within this, not after a timeout.
const AT_ONCE: u64 = 1000;
/// The prefix the test gives the pods' own IPv6 addresses.
const V6_PREFIX: &str = "fd00:a1b:0:1";

/// The echo server (TCP and UDP on 8090, both families), ungoverned.
fn echo_server(story: &Story) {
    let ns = &story.namespace;
    story.admin.apply(&format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo, aip.io/inject: disabled}}}}
    spec:
      automountServiceAccountToken: false
      containers:
        - name: echo
          image: {PROBE_IMAGE}
          args: [serve, \"8090\"]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {ns}}}
spec:
  selector: {{app: echo}}
  ports:
    - {{name: tcp, port: 8090, protocol: TCP}}
    - {{name: udp, port: 8090, protocol: UDP}}
"
    ));
    wait_for(
        &story.admin,
        "deployment/echo",
        "condition=Available",
        POD_PATIENCE,
    );
}

/// The governed agent pod `name`: aip-probe idling as user 1000.
fn agent_text(story: &Story, name: &str, security: &str) -> String {
    let ns = &story.namespace;
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{app: agent}}}}
spec:
  restartPolicy: Never
  containers:
    - name: agent
      image: {PROBE_IMAGE}
      args: [idle]
      securityContext: {security}
"
    )
}

const AGENT_SECURITY: &str = "{runAsUser: 1000, runAsGroup: 1000, allowPrivilegeEscalation: false}";

/// The attempts `aip-probe KIND TARGETS...` made from `container` of `pod`.
fn probe(story: &Story, pod: &str, container: &str, kind: &str, targets: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "exec",
        pod,
        "-n",
        &story.namespace,
        "-c",
        container,
        "--",
        "/usr/local/bin/aip-probe",
        kind,
    ];
    args.extend_from_slice(targets);
    let out = story.admin.ok(&args, None);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn outcome(attempt: &Value) -> &str {
    attempt["outcome"].as_str().unwrap_or_default()
}

fn refused_at_once(attempts: &[Value]) {
    for a in attempts {
        assert_eq!(outcome(a), "refused", "{a}");
        let ms = a["ms"].as_u64().unwrap();
        assert!(ms < AT_ONCE, "refused only after {ms} ms: {a}");
    }
}

fn reached(attempts: &[Value]) {
    for a in attempts {
        assert_eq!(outcome(a), "reached", "{a}");
    }
}

/// A Service's ClusterIP and its one pod's IP.
fn addresses(story: &Story, app: &str) -> (String, String) {
    let cluster_ip = story
        .admin
        .get(&format!("service/{app}"), "{.spec.clusterIP}");
    let pod_ip = story.admin.get(
        "pods",
        &format!("{{.items[?(@.metadata.labels.app==\"{app}\")].status.podIP}}"),
    );
    (cluster_ip, pod_ip)
}

/// Gives the network namespace of `container` of pod `pod` an IPv6 address
/// on its interface: `V6_PREFIX::` and the last two octets of its IPv4
/// address, unique on the node as those are (the pods share the node's
/// bridge, so they reach each other at these addresses; the node itself has
/// none).
fn give_ipv6(story: &Story, pod: &str, container: &str) -> String {
    let pid = container_pid(&container_id(story, pod, container));
    let v4: std::net::Ipv4Addr = story.pod_json(pod)["status"]["podIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let [_, _, high, low] = v4.octets();
    let address = format!("{V6_PREFIX}::{:x}", u16::from(high) << 8 | u16::from(low));
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "ip", "-6", "addr", "add"])
        .args([&format!("{address}/64"), "dev", "eth0", "nodad"])
        .output()
        .expect("nsenter and ip");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    address
}

/// The name of the echo Deployment's pod.
fn echo_pod(story: &Story) -> String {
    story.admin.get(
        "pods",
        "{.items[?(@.metadata.labels.app==\"echo\")].metadata.name}",
    )
}

/// A namespace with the tool server, the echo server, the policy, and (when
/// `lock` is given) an EgressLock allowing `lock`'s destinations, which may
/// name the echo Service's ClusterIP as `ECHO`.
async fn setup(cluster: &super::common::Cluster, prefix: &str, lock: Option<&str>) -> Story {
    let story = Story::new(cluster, prefix).await;
    story.tools("tool-token", "tool-token");
    echo_server(&story);
    story.policy(&["fs_read_file"], "");
    if let Some(allow) = lock {
        let (echo, _) = addresses(&story, "echo");
        let allow = allow.replace("ECHO", &echo);
        story.admin.apply(&format!(
            "apiVersion: aip.io/v1alpha1
kind: EgressLock
metadata: {{name: default, namespace: {}}}
spec:
  allow: {allow}
",
            story.namespace
        ));
    }
    story
}

/// Creates the agent pod and waits until it is Ready.
fn agent(story: &Story, name: &str) {
    story.admin.apply(&agent_text(story, name, AGENT_SECURITY));
    wait_for(
        &story.admin,
        &format!("pod/{name}"),
        "condition=Ready",
        POD_PATIENCE,
    );
}

#[tokio::test]
async fn with_the_lock_the_agent_is_refused_at_once_everywhere_but_its_gateway() {
    let cluster = cluster().await;
    let story = setup(
        &cluster,
        "locked",
        Some("[{cidr: ECHO/32, protocol: TCP, port: 8090}]"),
    )
    .await;
    agent(&story, "agent");
    let pod = story.pod_json("agent");
    let annotations = &pod["metadata"]["annotations"];
    let lock: Value =
        serde_json::from_str(annotations["aip.io/egress-lock"].as_str().unwrap()).unwrap();
    assert_eq!(lock["sidecarUid"], 7301, "{lock}");
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "aip-lock-check");
    let check = super::support::logs(&story.admin, "pod/agent", "aip-lock-check");
    assert!(check.contains("the egress lock is in place"), "{check}");

    let ns = &story.namespace;
    let (files_ip, files_pod) = addresses(&story, "files");
    let (echo_ip, echo_pod_ip) = addresses(&story, "echo");
    // The tool server, by Service and by pod, TCP; the echo server UDP.
    refused_at_once(&probe(
        &story,
        "agent",
        "agent",
        "tcp",
        &[
            &format!("{files_ip}:8080"),
            &format!("{files_pod}:8080"),
            &format!("files.{ns}.svc.cluster.local:8080"),
            &format!("{echo_pod_ip}:8090"),
        ],
    ));
    refused_at_once(&probe(
        &story,
        "agent",
        "agent",
        "udp",
        &[&format!("{echo_ip}:8090"), &format!("{echo_pod_ip}:8090")],
    ));
    // DNS works, the allowed destination (TCP to the echo Service) too.
    reached(&probe(
        &story,
        "agent",
        "agent",
        "dns",
        &[&format!("files.{ns}.svc.cluster.local")],
    ));
    reached(&probe(
        &story,
        "agent",
        "agent",
        "tcp",
        &[&format!("{echo_ip}:8090")],
    ));
    // The same tool through the gateway.
    let through = probe(
        &story,
        "agent",
        "agent",
        "mcp",
        &[
            "http://127.0.0.1:15001/mcp",
            "fs_read_file",
            r#"{"path": "/q3"}"#,
        ],
    );
    assert_eq!(outcome(&through[0]), "reached", "{}", through[0]);
    assert_eq!(through[0]["detail"], "Q3: revenue up 12%", "{}", through[0]);

    // IPv6, on addresses of the test's own: refused for the agent.
    let echo = echo_pod(&story);
    let echo_v6 = give_ipv6(&story, &echo, "echo");
    give_ipv6(&story, "agent", "agent");
    refused_at_once(&probe(
        &story,
        "agent",
        "agent",
        "tcp",
        &[&format!("[{echo_v6}]:8090")],
    ));
    refused_at_once(&probe(
        &story,
        "agent",
        "agent",
        "udp",
        &[&format!("[{echo_v6}]:8090")],
    ));
    // The ungoverned echo pod is not locked: it reaches the agent's gateway
    // pod's neighbours as before.
    reached(&probe(
        &story,
        &echo,
        "echo",
        "tcp",
        &[&format!("{files_ip}:8080")],
    ));

    // The policy counts the locked pod, and so does the EgressLock.
    eventually("the policy counts one locked pod", POD_PATIENCE, || async {
        (story.admin.get("agentpolicy/files", "{.status.lockedPods}") == "1").then_some(())
    })
    .await;
    let counts = |story: &Story| {
        story.admin.get(
            "egresslock/default",
            "{.status.destinations} {.status.lockedPods} {.status.stalePods}",
        )
    };
    eventually(
        "the EgressLock counts one locked pod",
        POD_PATIENCE,
        || async { (counts(&story) == "1 1 0").then_some(()) },
    )
    .await;
    // A changed setting applies to new pods: the running one is counted as
    // on the older one.
    story.admin.ok(
        &[
            "patch",
            "egresslock/default",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"allow":[{"cidr":"203.0.113.0/24","port":443}]}}"#,
        ],
        None,
    );
    eventually("the running pod counts as stale", POD_PATIENCE, || async {
        (counts(&story) == "1 1 1").then_some(())
    })
    .await;
}

#[tokio::test]
async fn without_an_egress_lock_nothing_changes() {
    let cluster = cluster().await;
    let story = setup(&cluster, "unlocked", None).await;
    agent(&story, "agent");
    let pod = story.pod_json("agent");
    assert!(
        pod["metadata"]["annotations"]["aip.io/egress-lock"].is_null(),
        "{pod}"
    );
    assert_ne!(pod["spec"]["initContainers"][0]["name"], "aip-lock-check");
    let (files_ip, _) = addresses(&story, "files");
    let (echo_ip, echo_pod_ip) = addresses(&story, "echo");
    reached(&probe(
        &story,
        "agent",
        "agent",
        "tcp",
        &[&format!("{files_ip}:8080"), &format!("{echo_pod_ip}:8090")],
    ));
    reached(&probe(
        &story,
        "agent",
        "agent",
        "udp",
        &[&format!("{echo_ip}:8090")],
    ));
    let echo = echo_pod(&story);
    let echo_v6 = give_ipv6(&story, &echo, "echo");
    give_ipv6(&story, "agent", "agent");
    reached(&probe(
        &story,
        "agent",
        "agent",
        "tcp",
        &[&format!("[{echo_v6}]:8090")],
    ));
    reached(&probe(
        &story,
        "agent",
        "agent",
        "udp",
        &[&format!("[{echo_v6}]:8090")],
    ));
}

#[tokio::test]
async fn an_agent_that_could_go_around_the_lock_is_refused_naming_the_field() {
    let cluster = cluster().await;
    let story = setup(&cluster, "refused", Some("[]")).await;
    for (security, field) in [
        (
            "{runAsUser: 7301, allowPrivilegeEscalation: false}",
            "spec.containers[0].securityContext.runAsUser is 7301, the gateway's user",
        ),
        (
            "{runAsUser: 0, allowPrivilegeEscalation: false}",
            "spec.containers[0].securityContext.runAsUser is 0 (root)",
        ),
        (
            "{runAsUser: 1000, allowPrivilegeEscalation: false, capabilities: {add: [NET_ADMIN]}}",
            "spec.containers[0].securityContext.capabilities.add adds NET_ADMIN",
        ),
        (
            "{runAsUser: 1000}",
            "spec.containers[0].securityContext.allowPrivilegeEscalation must be set to false",
        ),
    ] {
        let (ok, out, err) = story.admin.run(
            &["apply", "-f", "-"],
            Some(&agent_text(&story, "bad", security)),
        );
        assert!(!ok, "{security} was admitted: {out}");
        assert!(err.contains(field), "{security}: {err}");
    }
    // A debug container added to a running locked pod is held to the same
    // rules, and the pod's lock record cannot be taken off it.
    agent(&story, "agent");
    let (ok, out, err) = story.admin.run(
        &[
            "debug",
            "agent",
            "-n",
            &story.namespace,
            "--image",
            PROBE_IMAGE,
            "--",
            "/usr/local/bin/aip-probe",
            "idle",
        ],
        None,
    );
    assert!(
        !ok,
        "a debug container as the image's user was admitted: {out}"
    );
    assert!(
        err.contains("spec.ephemeralContainers[0].securityContext.runAsUser is not set"),
        "{err}"
    );
    let (ok, out, err) = story.admin.run(
        &[
            "annotate",
            "pod",
            "agent",
            "-n",
            &story.namespace,
            "aip.io/egress-lock-",
        ],
        None,
    );
    assert!(!ok, "the lock record was removed: {out}");
    assert!(
        err.contains("metadata.annotations[aip.io/egress-lock]"),
        "{err}"
    );
}

/// The node's CNI directories, as the node's containerd reads them.
fn node_cni() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(std::env::var_os(aip_kube_test::node::ENV).unwrap());
    (
        dir.join(aip_kube_test::node::CNI_BIN),
        dir.join(aip_kube_test::node::CNI_CONF),
    )
}

fn chained(conf: &Path) -> bool {
    std::fs::read_dir(conf)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "conflist"))
        .any(|e| {
            std::fs::read_to_string(e.path())
                .unwrap()
                .contains("\"aip-cni\"")
        })
}

#[tokio::test]
async fn without_the_plugin_a_locked_pod_never_runs_its_agent() {
    let cluster = cluster_alone().await;
    let story = setup(&cluster, "noplugin", Some("[]")).await;
    let (bin, conf) = node_cni();
    assert!(bin.join("aip-cni").is_file() && chained(&conf));
    let list = conf.join("10-aip-node.conflist");
    let original = std::fs::read_to_string(conf.join("aip-cni.d/10-aip-node.conflist.original"))
        .expect("the installer keeps the list as it found it");
    assert!(!original.contains("aip-cni"), "{original}");
    let system = cluster.kubectl(aip_kube_test::User::Admin, OPERATOR_NAMESPACE);
    // The DaemonSet's pod stops (it runs on no node): it takes the plugin
    // out of the node's configuration and its binary away.
    let away = r#"{"spec":{"template":{"spec":{"nodeSelector":{"aip.io/no-such-node":"true"}}}}}"#;
    system.ok(
        &[
            "patch",
            "daemonset/aip-cni",
            "-n",
            OPERATOR_NAMESPACE,
            "-p",
            away,
        ],
        None,
    );
    eventually("the plugin leaves the node", POD_PATIENCE, || async {
        (!bin.join("aip-cni").exists() && !chained(&conf) && !conf.join("aip-cni.d").exists())
            .then_some(())
    })
    .await;

    // The node's configuration is what it was before the chart, byte for
    // byte, and the plugin never wrote to the node's own tables.
    assert_eq!(std::fs::read_to_string(&list).unwrap(), original);
    let node_rules = Command::new("iptables-save").output().unwrap();
    assert!(!String::from_utf8_lossy(&node_rules.stdout).contains("AIP-EGRESS"));

    story
        .admin
        .apply(&agent_text(&story, "agent", AGENT_SECURITY));
    let reason = eventually("the lock check fails", POD_PATIENCE, || async {
        let pod = story.pod_json("agent");
        let check = pod["status"]["initContainerStatuses"][0].clone();
        let terminated = check["lastState"]["terminated"].clone();
        let terminated = if terminated.is_null() {
            check["state"]["terminated"].clone()
        } else {
            terminated
        };
        (check["name"] == "aip-lock-check"
            && terminated["exitCode"].as_i64().is_some_and(|c| c != 0))
        .then(|| {
            terminated["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
    })
    .await;
    assert!(
        reason.contains("the egress lock is not in place"),
        "{reason}"
    );
    // And the pod's events say so.
    let said = eventually(
        "an EgressLockMissing Event on the pod",
        POD_PATIENCE,
        || async {
            let events = story.admin.get(
                "events",
                "{.items[?(@.reason==\"EgressLockMissing\")].message}",
            );
            (!events.is_empty()).then_some(events)
        },
    )
    .await;
    assert!(said.contains("the egress lock is not in place"), "{said}");
    let pod = story.pod_json("agent");
    let status = &pod["status"]["containerStatuses"][0];
    assert!(
        status["state"]["running"].is_null() && status["lastState"]["terminated"].is_null(),
        "the agent ran: {pod}\n{}",
        describe(&story.admin)
    );
    // An ungoverned pod starts all the same.
    let echo = echo_pod(&story);
    assert!(!echo.is_empty());

    let back = r#"{"spec":{"template":{"spec":{"nodeSelector":null}}}}"#;
    system.ok(
        &[
            "patch",
            "daemonset/aip-cni",
            "-n",
            OPERATOR_NAMESPACE,
            "-p",
            back,
        ],
        None,
    );
    system.ok(
        &[
            "rollout",
            "status",
            "daemonset/aip-cni",
            "-n",
            OPERATOR_NAMESPACE,
            "--timeout=120s",
        ],
        None,
    );
    assert!(bin.join("aip-cni").is_file() && chained(&conf));
    // A pod made now is locked again (the stuck one keeps its sandbox).
    story.admin.ok(
        &[
            "delete",
            "pod",
            "agent",
            "-n",
            &story.namespace,
            "--wait=false",
        ],
        None,
    );
    agent(&story, "again");
}

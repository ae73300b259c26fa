//! The operator's CA rotates under running sidecars. The operator runs as
//! the chart runs it (its certificate made in its TLS Secret), with
//! lifetimes short enough to watch: made valid for 60 s, it stages a new CA
//! two thirds in, hands both CAs to the connected sidecars and to the
//! webhook configurations, serves the new certificate an overlap later and
//! ends every stream so that each sidecar meets it at once. Both sidecars
//! reconnect on their own and go on receiving configuration (through the
//! validating webhook, which the API server now reaches on the new
//! certificate) and approval decisions; no process is restarted for it. A
//! sidecar container restarted afterwards, with only the CA of its pod spec,
//! connects through the bundle it kept; one that was never handed the
//! bundle cannot, which is what makes the rotation a real one.

use std::ffi::OsStr;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use aip_kube_test::User;

use crate::common::Cluster;
use crate::common::kubectl::tempdir;
use crate::support::*;

const STAGED: &str = "staged a new operator CA";
const PROMOTED: &str = "serving the certificate of the new operator CA";
const TRUSTED: &str = "trusting the CA bundle the operator handed out";
const CONNECTED: &str = "sidecar connected";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecars_follow_a_rotation_of_the_operators_ca() {
    let dir = tempdir();
    let cluster = Cluster::dedicated().await;
    if !cluster.calls_back_here("sidecars_follow_a_rotation_of_the_operators_ca") {
        return;
    }
    let admin = cluster.kubectl(User::Admin, "agents");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (fault_url, attempts) = start_fault_server(&dir, &shutdown).await;
    let (installed, operator) = Installed::start_with(
        &cluster,
        &admin,
        &dir,
        &["--tls-validity=60s", "--tls-overlap=10s"],
    )
    .await;
    let first_ca = installed.ca.clone();

    admin.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: agents}\n");
    admin.apply(&secret("tok-A"));
    admin.apply(&connection(&fault_url));
    let (ok, out, err) = admin.aip(&["grant", "fs", "-n", "agents"]);
    assert!(ok, "{out}{err}");
    let asking = format!(
        "{}  tool_rules: [{{tool: fs_delete_file, action: ask}}]\n",
        policy(&["fs_read_file", "fs_delete_file"])
    );
    admin.apply(&asking);
    cluster.service_account("agents", "agent").await;
    let mut sidecars = Vec::new();
    for (i, pod) in ["agent-1", "agent-2"].into_iter().enumerate() {
        let uid = cluster
            .pod("agents", pod, "agent", json!({"app": "agent"}))
            .await;
        let pod_dir = dir.join(pod);
        std::fs::create_dir(&pod_dir).unwrap();
        let token = sidecar_token(&cluster, &pod_dir, "agent", pod, &uid).await;
        // The emptyDir the injector gives each sidecar for its bundle.
        let cache = pod_dir.join("operator-ca.crt");
        let extra = [OsStr::new("--operator-ca-cache"), cache.as_os_str()];
        let sidecar = start_sidecar_with(&first_ca, installed.ports.grpc, &token, &extra);
        let agent = agent_of(&sidecar).await;
        lists(&agent, "fs_delete_file").await;
        sidecars.push((sidecar, agent, token, cache));
        operator.lines_with(CONNECTED, i + 1).await;
    }

    // Two thirds into the certificate's life: both CAs handed out, while
    // the old certificate is still the one served.
    operator.lines_within(STAGED, 1, 2 * PATIENCE).await;
    for (sidecar, ..) in &sidecars {
        sidecar.line(TRUSTED).await;
    }
    assert_eq!(operator.count(PROMOTED), 0, "served only an overlap later");
    let bundle = std::fs::read_to_string(&sidecars[0].3).unwrap();
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2, "{bundle}");

    // The new certificate: every stream ends and each sidecar reconnects,
    // on the channel that trusts the bundle.
    operator.line(PROMOTED).await;
    operator.lines_with(CONNECTED, 4).await;

    // Configuration still arrives, through the validating webhook, which
    // the API server reaches on the new certificate: the read tool goes.
    admin.apply(&format!(
        "{}  tool_rules: [{{tool: fs_delete_file, action: ask}}]\n",
        policy(&["fs_delete_file"])
    ));
    for (_, agent, ..) in &sidecars {
        eventually("the new policy reaches the sidecar", || {
            let mut agent = clone_agent(agent);
            async move {
                let names = agent.tool_names().await;
                (!names.iter().any(|t| t == "fs_read_file")).then_some(())
            }
        })
        .await;
    }

    // An approval decided now reaches the held call, which runs once.
    let (_, agent, ..) = &sidecars[0];
    let held = {
        let agent = clone_agent(agent);
        tokio::spawn(async move {
            agent
                .held_call_as(7, "fs_delete_file", json!({"path": "after"}), 4 * PATIENCE)
                .await
        })
    };
    let name = pending_request(&admin).await;
    let (ok, said) = admin.decide(&name, "Approved", "");
    assert!(ok, "{said}");
    let answer = tokio::time::timeout(PATIENCE, held).await.unwrap().unwrap();
    assert_eq!(
        answer["result"]["content"][0]["text"], "deleted",
        "{answer}"
    );
    assert_eq!(deletes(&attempts), 1);

    // The first sidecar's container restarts: its pod spec still names
    // only the first CA, the bundle it kept names the new one too.
    let (mut first, _, token, cache) = sidecars.remove(0);
    first.terminate();
    let extra = [OsStr::new("--operator-ca-cache"), cache.as_os_str()];
    let restarted = start_sidecar_with(&first_ca, installed.ports.grpc, &token, &extra);
    lists(&agent_of(&restarted).await, "fs_delete_file").await;

    // Without the kept bundle, the CA of the pod spec alone no longer
    // verifies the operator.
    let lost = dir.join("lost");
    std::fs::create_dir(&lost).unwrap();
    std::fs::copy(&token, lost.join("token")).unwrap();
    // Said once when lost, then (at debug) at every attempt that fails.
    let stranded = start_sidecar_logging(
        &first_ca,
        installed.ports.grpc,
        &lost.join("token"),
        &[],
        "info,aip_sidecar::control::watch=debug",
    );
    stranded
        .lines_with("configuration stream from the operator lost", 1)
        .await;
    stranded
        .lines_with("configuration stream not back yet", 1)
        .await;
    assert_eq!(
        stranded.count("configuration stream from the operator lost"),
        1,
        "one warning for one outage"
    );
    assert_eq!(
        stranded.count(TRUSTED),
        0,
        "a sidecar that was never handed the bundle stays stranded"
    );
}

//! What the injector admits on a real node: an injected pod in a namespace
//! that enforces the `restricted` Pod Security Standard is admitted and
//! runs (the sidecar's securityContext meets it); a pod that opts out gets
//! no gateway; a pod that no AgentPolicy governs fails closed: its agent
//! container never starts, and an Event on the pod says why.

use aip_kube_test::User;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_pod_runs_under_the_restricted_pod_security_standard() {
    let cluster = cluster().await;
    let story = Story::new(&cluster, "restricted").await;
    let ns = &story.namespace;
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");
    story.admin.ok(
        &[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    let pod = |name: &str, labels: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{app: agent{labels}}}}}
spec:
  securityContext: {{runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
    - name: agent
      image: {PAUSE}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {{drop: [ALL]}}
"
        )
    };
    // Bob, who may create pods here and nothing more, as a team would.
    story.admin.ok(
        &[
            "create",
            "rolebinding",
            "bob-edit",
            "-n",
            ns,
            "--clusterrole=edit",
            "--user=bob",
        ],
        None,
    );
    let bob = cluster.kubectl(User::Bob, ns);
    bob.apply(&pod("agent-1", ""));
    wait_for(&story.admin, "pod/agent-1", "condition=Ready", POD_PATIENCE);
    let injected = story.pod_json("agent-1");
    let sidecar = &injected["spec"]["initContainers"][0];
    assert_eq!(sidecar["name"], "aip-sidecar", "{injected}");
    assert_eq!(sidecar["restartPolicy"], "Always", "{injected}");
    assert_eq!(
        injected["status"]["initContainerStatuses"][0]["ready"], true,
        "{injected}"
    );

    bob.apply(&pod("agent-2", ", aip.io/inject: disabled"));
    wait_for(&story.admin, "pod/agent-2", "condition=Ready", POD_PATIENCE);
    let plain = story.pod_json("agent-2");
    assert!(plain["spec"]["initContainers"].is_null(), "{plain}");
    assert!(plain["spec"]["containers"][0]["env"].is_null(), "{plain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_no_policy_governs_never_starts_its_agent_and_an_event_says_why() {
    let cluster = cluster().await;
    let story = Story::new(&cluster, "ungoverned").await;
    let ns = story.namespace.clone();
    // A policy for other pods only.
    story.tools("tok-1", "tok-1");
    story.policy(&["fs_read_file"], "");
    story.admin.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: loose-1, namespace: {ns}, labels: {{app: other}}}}
spec:
  containers: [{{name: agent, image: {PAUSE}}}]
"
    ));
    let needle = format!("no AgentPolicy in namespace {ns} selects this pod");
    let events = eventually("an Ungoverned Event on the pod", POD_PATIENCE, || {
        let admin = story.admin.clone();
        let needle = needle.clone();
        async move {
            let (_, out, _) = admin.run(
                &[
                    "get",
                    "events",
                    "-n",
                    &admin.namespace,
                    "--field-selector",
                    "involvedObject.name=loose-1,reason=Ungoverned",
                    "-o",
                    "json",
                ],
                None,
            );
            out.contains(&needle).then_some(out)
        }
    })
    .await;
    assert!(events.contains("Warning"), "{events}");
    let pod = story.pod_json("loose-1");
    assert_eq!(
        pod["status"]["initContainerStatuses"][0]["ready"], false,
        "{pod}"
    );
    assert!(
        pod["status"]["containerStatuses"][0]["state"]["waiting"].is_object(),
        "the agent container started without a governing policy: {pod}"
    );
}

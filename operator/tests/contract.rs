//! What the operator counts on the API server for, asked of the genuine
//! kube-apiserver with the operator's own kinds (each test in a namespace
//! of its own): a status write never moves `metadata.generation` and a
//! spec write always does (the policy status writer's observedGeneration),
//! neither write changes the other half; and a status write carrying the
//! resourceVersion it read loses to a decision made in between (what makes
//! `set_decision_if_pending` safe against a person deciding at the same
//! moment as the operator expires or withdraws).

#![allow(clippy::unwrap_used)]

mod common;

use aip_api::approval_request::Decision;
use aip_api::{AgentPolicy, ApprovalRequest};
use aip_operator::approvals::set_decision_if_pending;
use common::Cluster;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn status_writes_keep_the_generation_and_spec_writes_move_it() {
    let cluster = Cluster::shared().await;
    common::install_crds(&cluster.admin).await;
    let ns = cluster.fresh_namespace("generation").await;
    let api: Api<AgentPolicy> = Api::namespaced(cluster.admin.clone(), &ns);
    let policy: AgentPolicy = serde_json::from_value(json!({
        "apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
        "metadata": {"name": "p"}, "spec": {"allowed_tools": ["read_file"]},
        "status": {"mode": "ignored on create"}}))
    .unwrap();
    let created = api.create(&PostParams::default(), &policy).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status, None, "status is not written by a create");

    // As the operator writes it: server-side apply of the status.
    let status = json!({"apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
        "status": {"observedGeneration": 1, "mode": "enforce", "synced": "0/0"}});
    let applied = api
        .patch_status(
            "p",
            &PatchParams::apply("aip-operator").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.generation, Some(1));
    assert_eq!(
        applied.status.as_ref().unwrap().observed_generation,
        Some(1)
    );

    // A spec write through the main resource moves the generation and
    // leaves the status alone, even when it names one.
    let edit = json!({"spec": {"allowed_tools": ["read_file", "ls"]},
        "status": {"mode": "monitor"}});
    let edited = api
        .patch("p", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    assert_eq!(edited.metadata.generation, Some(2));
    assert_eq!(
        edited.status.as_ref().unwrap().mode.as_deref(),
        Some("enforce")
    );

    // A status write that names a spec changes only the status.
    let sneaky = json!({"spec": {"allowed_tools": []}, "status": {"synced": "1/1"}});
    let after = api
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&sneaky))
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(
        after.spec.allowed_tools,
        Some(vec!["read_file".to_owned(), "ls".to_owned()])
    );
    assert_eq!(after.status.unwrap().synced.as_deref(), Some("1/1"));
}

#[tokio::test]
async fn a_decision_made_in_between_wins_over_the_operators_write() {
    let cluster = Cluster::shared().await;
    common::install_crds(&cluster.admin).await;
    let ns = cluster.fresh_namespace("race").await;
    let api: Api<ApprovalRequest> = Api::namespaced(cluster.admin.clone(), &ns);
    let request: ApprovalRequest = serde_json::from_value(json!({
        "apiVersion": "aip.io/v1alpha1", "kind": "ApprovalRequest",
        "metadata": {"name": "r1"},
        "spec": {"policy": "p", "pod": "agent-1", "podUid": "u1", "serviceAccount": "runner",
                 "connection": "fs", "tool": "fs_write", "arguments": "{}",
                 "argumentsHash": "sha256:00", "expiresAt": "2099-01-01T00:00:00Z"}}))
    .unwrap();
    api.create(&PostParams::default(), &request).await.unwrap();
    let pending = json!({"status": {"decision": "Pending"}});
    let read = api
        .patch_status("r1", &PatchParams::default(), &Patch::Merge(&pending))
        .await
        .unwrap();

    // A person decides after the operator read the request...
    let approved = json!({"status": {"decision": "Approved", "decidedBy": "alice"}});
    api.patch_status("r1", &PatchParams::default(), &Patch::Merge(&approved))
        .await
        .unwrap();
    // ...so the operator's write, carrying what it read, is refused.
    let stale = json!({"metadata": {"resourceVersion": read.metadata.resource_version},
        "status": {"decision": "Expired"}});
    let refused = api
        .patch_status("r1", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409, "{status:?}");
            assert_eq!(
                status.message,
                "Operation cannot be fulfilled on approvalrequests.aip.io \"r1\": the object has been modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // And read afresh, a decided request is left as it is.
    set_decision_if_pending(&api, "r1", Decision::Expired, None)
        .await
        .unwrap();
    let now = api.get("r1").await.unwrap().status.unwrap();
    assert_eq!(now.decision, Decision::Approved);
    assert_eq!(now.decided_by.as_deref(), Some("alice"));
}

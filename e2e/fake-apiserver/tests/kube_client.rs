//! The fake API server through kube-rs, as the operator will use it: CRUD
//! on built-in kinds, optimistic concurrency, the status subresource,
//! finalizers holding a delete, selectors, paging, and watches that resume
//! from a resourceVersion or get 410 Gone.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, Config};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(10);

async fn client(running: &Running) -> Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&running.kubeconfig(ADMIN_TOKEN)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn config_map(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn create_get_update_and_conflicts() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let client = client(&running).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &config_map("a", json!({})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    let again = cms
        .create(&PostParams::default(), &config_map("a", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(again, kube::Error::Api(ref e) if e.code == 409 && e.reason == "AlreadyExists"),
        "{again:?}"
    );

    let mut changed = created.clone();
    changed.data = Some([("k".to_owned(), "w".to_owned())].into());
    let updated = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv, "one global, increasing resourceVersion");
    // The same stale object again: 409 Conflict.
    let stale = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, kube::Error::Api(ref e) if e.code == 409 && e.reason == "Conflict"),
        "{stale:?}"
    );

    let missing = cms.get("nope").await.unwrap_err();
    assert!(matches!(missing, kube::Error::Api(ref e) if e.code == 404 && e.reason == "NotFound"));
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-namespace");
    let refused = elsewhere
        .create(&PostParams::default(), &config_map("a", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref e) if e.code == 404),
        "{refused:?}"
    );

    let mut generated = config_map("", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let named = cms
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(named.metadata.name.unwrap().starts_with("gen-"));
}

#[tokio::test]
async fn the_status_subresource_and_generation() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client(&running).await, "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Ignored"}}))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // Status goes through /status only; spec through the main resource only.
    let status =
        Patch::Merge(json!({"status": {"phase": "Running"}, "spec": {"nodeName": "sneaky"}}));
    let patched = pods
        .patch_status("p", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(
        patched.spec.unwrap().node_name,
        None,
        "a status write ignores spec"
    );
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "status is not a spec change"
    );
    let main = Patch::Merge(json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}}));
    let patched = pods
        .patch("p", &PatchParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(
        patched.status.unwrap().phase.as_deref(),
        Some("Running"),
        "a main write ignores status"
    );
    assert_eq!(
        patched.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );
}

#[tokio::test]
async fn finalizers_hold_a_delete_until_removed() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client(&running).await, "default");
    let mut cm = config_map("held", json!({}));
    cm.metadata.finalizers = Some(vec!["aip.io/test".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = cms.get("held").await.unwrap();
    assert!(
        marked.metadata.deletion_timestamp.is_some(),
        "marked, not gone"
    );
    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    cms.patch("held", &PatchParams::default(), &release)
        .await
        .unwrap();
    let gone = cms.get("held").await.unwrap_err();
    assert!(matches!(gone, kube::Error::Api(ref e) if e.code == 404));
}

#[tokio::test]
async fn selectors_and_paging() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client(&running).await, "default");
    for (name, app) in [("a", "web"), ("b", "api"), ("c", "web"), ("d", "db")] {
        cms.create(
            &PostParams::default(),
            &config_map(name, json!({"app": app})),
        )
        .await
        .unwrap();
    }
    let names = |list: kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let web = cms
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(names(web), ["a", "c"]);
    let not_web = cms
        .list(&ListParams::default().labels("app notin (web)"))
        .await
        .unwrap();
    assert_eq!(names(not_web), ["b", "d"]);
    let by_name = cms
        .list(&ListParams::default().fields("metadata.name=d"))
        .await
        .unwrap();
    assert_eq!(names(by_name), ["d"]);
    let first = cms.list(&ListParams::default().limit(3)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(names(first), ["a", "b", "c"]);
    let rest = cms
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert!(rest.metadata.continue_.as_deref().is_none_or(str::is_empty));
    assert_eq!(names(rest), ["d"]);
}

#[tokio::test]
async fn watches_resume_from_a_resource_version_and_expire() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let client = client(&running).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let listed = namespaces.list(&ListParams::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &config_map("w", json!({})))
        .await
        .unwrap();
    let params = WatchParams::default().timeout(5);
    let mut events = Box::pin(cms.watch(&params, &from).await.unwrap());
    let first = tokio::time::timeout(PATIENCE, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(first, WatchEvent::Added(ref c) if c.metadata.name.as_deref() == Some("w")),
        "{first:?}"
    );
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    let second = tokio::time::timeout(PATIENCE, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(second, WatchEvent::Deleted(_)), "{second:?}");

    // After compaction, resuming from the old version is 410 Gone.
    running.server.store.compact();
    let mut expired = Box::pin(cms.watch(&params, &from).await.unwrap());
    let error = tokio::time::timeout(PATIENCE, expired.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(error, WatchEvent::Error(ref e) if e.code == 410),
        "{error:?}"
    );
}

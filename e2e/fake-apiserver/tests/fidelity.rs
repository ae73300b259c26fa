//! Behaviour the operator relies on, through kube-rs: CRUD, optimistic
//! concurrency, the status subresource and generation, finalizers holding
//! a delete, selectors, paging, and watches that resume from a
//! resourceVersion or get 410 Gone.
//!
//! Against the fake by default. With `AIP_FIDELITY_KUBECONFIG=/path` the
//! same tests run against a real cluster (each in its own namespace,
//! deleted afterwards; the fidelity CRD `fidelitywidgets.aip.io` is left
//! installed), so anyone with a cluster can confirm the fake behaves the
//! same. Steps only the fake can stage (forcing a compaction) are skipped
//! there.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(10);

/// Where the tests run: the fake (started here) or a real cluster.
struct Target {
    client: Client,
    /// A namespace of the test's own.
    namespace: String,
    fake: Option<Running>,
}

impl Target {
    async fn new(test: &str) -> Target {
        let (kubeconfig, fake) = match std::env::var_os("AIP_FIDELITY_KUBECONFIG") {
            Some(path) => (kube::config::Kubeconfig::read_from(path).unwrap(), None),
            None => {
                let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
                let kubeconfig =
                    kube::config::Kubeconfig::from_yaml(&running.kubeconfig(ADMIN_TOKEN)).unwrap();
                (kubeconfig, Some(running))
            }
        };
        let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = Client::try_from(config).unwrap();
        let namespace = format!("aip-fidelity-{test}-{:08x}", rand::random::<u32>());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let object: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        Target {
            client,
            namespace,
            fake,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Deletes the test's namespace.
    async fn finish(self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}

/// The fidelity CRD (installed if absent) and its resource.
async fn widgets(t: &Target) -> Api<DynamicObject> {
    let crds: Api<CustomResourceDefinition> = Api::all(t.client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "fidelitywidgets.aip.io"},
        "spec": {"group": "aip.io", "scope": "Namespaced",
            "names": {"plural": "fidelitywidgets", "singular": "fidelitywidget", "kind": "FidelityWidget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    }))
    .unwrap();
    if crds
        .get_opt("fidelitywidgets.aip.io")
        .await
        .unwrap()
        .is_none()
    {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let established = conditions::is_crd_established();
    tokio::time::timeout(
        PATIENCE,
        await_condition(crds, "fidelitywidgets.aip.io", established),
    )
    .await
    .unwrap()
    .unwrap();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("aip.io", "v1", "FidelityWidget"));
    Api::namespaced_with(t.client.clone(), &t.namespace, &resource)
}

fn config_map(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn create_get_update_and_conflicts() {
    let t = Target::new("crud").await;
    let client = t.client.clone();
    let cms: Api<ConfigMap> = t.api();
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
    let elsewhere: Api<ConfigMap> =
        Api::namespaced(client.clone(), "aip-fidelity-no-such-namespace");
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
    t.finish().await;
}

#[tokio::test]
async fn the_status_subresource_and_generation() {
    let t = Target::new("status").await;
    let widgets = widgets(&t).await;
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "aip.io/v1", "kind": "FidelityWidget",
        "metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"phase": "Ignored"}}))
    .unwrap();
    let created = widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is not written on create"
    );
    // Status goes through /status only; spec through the main resource only.
    let status = Patch::Merge(json!({"status": {"phase": "Running"}, "spec": {"size": 9}}));
    let patched = widgets
        .patch_status("w", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Running");
    assert_eq!(
        patched.data["spec"]["size"], 1,
        "a status write ignores spec"
    );
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "status is not a spec change"
    );
    let main = Patch::Merge(json!({"spec": {"size": 2}, "status": {"phase": "Failed"}}));
    let patched = widgets
        .patch("w", &PatchParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["size"], 2);
    assert_eq!(
        patched.data["status"]["phase"], "Running",
        "a main write ignores status"
    );
    assert_eq!(
        patched.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );
    let labels = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    let patched = widgets
        .patch("w", &PatchParams::default(), &labels)
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2), "metadata is not spec");
    t.finish().await;
}

#[tokio::test]
async fn finalizers_hold_a_delete_until_removed() {
    let t = Target::new("finalizers").await;
    let cms: Api<ConfigMap> = t.api();
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
    t.finish().await;
}

#[tokio::test]
async fn selectors_and_paging() {
    let t = Target::new("selectors").await;
    let cms: Api<ConfigMap> = t.api();
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
    t.finish().await;
}

#[tokio::test]
async fn watches_resume_from_a_resource_version_and_expire() {
    let t = Target::new("watch").await;
    let cms: Api<ConfigMap> = t.api();
    let listed = cms.list(&ListParams::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
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

    // After compaction, resuming from the old version is 410 Gone (only
    // the fake can be made to compact on demand).
    let Some(running) = &t.fake else {
        return t.finish().await;
    };
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
    t.finish().await;
}

#[tokio::test]
async fn secret_string_data_is_merged_into_data() {
    let t = Target::new("secrets").await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = t.api();
    let secret = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "data": {"kept": "a2VwdA==", "token": "b2xk"},
        "stringData": {"token": "new"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let stored = serde_json::to_value(secrets.get("s").await.unwrap()).unwrap();
    assert_eq!(stored["data"], json!({"kept": "a2VwdA==", "token": "bmV3"}));
    assert!(stored.get("stringData").is_none(), "{stored}");
}

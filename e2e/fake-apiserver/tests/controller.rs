//! A kube-rs `Controller` (reflector and watcher underneath) against the
//! fake API server: it reconciles a custom resource, writes status with
//! server-side apply, survives every watch being expired (410) and resumes,
//! and sees a delete wait on its finalizer. Runs for `AIP_SOAK_SECONDS`
//! (default 5) of steady churn at the end, and fails on any reconcile error
//! or on more watch errors than it forced expiries.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::mpsc;

const PATIENCE: Duration = Duration::from_secs(20);
const FINALIZER: &str = "example.io/cleanup";

struct Ctx {
    client: Client,
    resource: ApiResource,
    errors: AtomicUsize,
    cleaned: mpsc::UnboundedSender<String>,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Error(#[from] kube::Error);

async fn reconcile(widget: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = widget.metadata.name.clone().unwrap();
    let ns = widget.metadata.namespace.clone().unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ctx.resource);
    let finalizers = widget.metadata.finalizers.clone().unwrap_or_default();
    if widget.metadata.deletion_timestamp.is_some() {
        if finalizers.iter().any(|f| f == FINALIZER) {
            let _ = ctx.cleaned.send(name.clone());
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
            let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": widget.metadata.resource_version}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        return Ok(Action::await_change());
    }
    if !finalizers.iter().any(|f| f == FINALIZER) {
        let patch = json!({"metadata": {"finalizers": [FINALIZER]}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        return Ok(Action::await_change());
    }
    let size = widget.data["spec"]["size"].clone();
    let status = json!({
        "apiVersion": ctx.resource.api_version, "kind": ctx.resource.kind,
        "status": {"observedSize": size},
    });
    api.patch_status(
        &name,
        &PatchParams::apply("widget-controller").force(),
        &Patch::Apply(status),
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<DynamicObject>, error: &Error, ctx: Arc<Ctx>) -> Action {
    eprintln!("reconcile error: {error}");
    ctx.errors.fetch_add(1, Ordering::Relaxed);
    Action::requeue(Duration::from_secs(1))
}

async fn client(running: &Running) -> Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&running.kubeconfig(ADMIN_TOKEN)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn observed(api: &Api<DynamicObject>, name: &str, size: i64) {
    let cond = move |o: Option<&DynamicObject>| {
        o.is_some_and(|o| o.data["status"]["observedSize"] == size)
    };
    tokio::time::timeout(PATIENCE, await_condition(api.clone(), name, cond))
        .await
        .unwrap_or_else(|_| panic!("{name} never observed size {size}"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_survives_expiry_and_finalizes() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let client = client(&running).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.io"},
        "spec": {"group": "example.io", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    tokio::time::timeout(
        PATIENCE,
        await_condition(crds, "widgets.example.io", conditions::is_crd_established()),
    )
    .await
    .unwrap()
    .unwrap();

    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.io", "v1", "Widget"));
    let (cleaned, mut cleanups) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        resource: resource.clone(),
        errors: AtomicUsize::new(0),
        cleaned,
    });
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    // Every item the controller yields is counted: reconcile errors, and
    // watch errors (a forced expiry surfaces as one 410 per watch, then a
    // re-list). An error loop would show as many more than the expiries.
    let stream_errors = Arc::new(AtomicUsize::new(0));
    let counted = stream_errors.clone();
    let controller = Controller::new_with(all, watcher::Config::default(), resource.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(move |item| {
            if let Err(e) = item {
                eprintln!("controller stream error: {e}");
                counted.fetch_add(1, Ordering::Relaxed);
            }
            async {}
        });
    let controller = tokio::spawn(controller);

    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let widget = |name: &str, size: i64| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "example.io/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": size}}))
        .unwrap()
    };
    widgets
        .create(&PostParams::default(), &widget("w1", 3))
        .await
        .unwrap();
    observed(&widgets, "w1", 3).await;

    // Every watch is expired (410): the controller lists again and goes on.
    running.server.expire_watches();
    let bigger = Patch::Merge(json!({"spec": {"size": 5}}));
    widgets
        .patch("w1", &PatchParams::default(), &bigger)
        .await
        .unwrap();
    observed(&widgets, "w1", 5).await;

    // A delete waits for the controller's finalizer.
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    let name = tokio::time::timeout(PATIENCE, cleanups.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "w1");
    tokio::time::timeout(
        PATIENCE,
        await_condition(widgets.clone(), "w1", conditions::is_deleted("")),
    )
    .await
    .unwrap()
    .unwrap();

    // Steady churn, with an expiry now and then, and no reconcile errors.
    let soak = std::env::var("AIP_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5u64);
    let until = tokio::time::Instant::now() + Duration::from_secs(soak);
    let mut round = 0i64;
    let mut expiries = 0usize;
    let errors_before = stream_errors.load(Ordering::Relaxed);
    while tokio::time::Instant::now() < until {
        round += 1;
        let name = format!("soak-{}", round % 3);
        match widgets.get_opt(&name).await.unwrap() {
            None => {
                widgets
                    .create(&PostParams::default(), &widget(&name, round))
                    .await
                    .unwrap();
            }
            Some(_) => {
                let patch = Patch::Merge(json!({"spec": {"size": round}}));
                widgets
                    .patch(&name, &PatchParams::default(), &patch)
                    .await
                    .unwrap();
            }
        }
        observed(&widgets, &name, round).await;
        if round % 5 == 0 {
            running.server.expire_watches();
            expiries += 1;
        }
    }
    assert_eq!(ctx.errors.load(Ordering::Relaxed), 0, "no reconcile errors");
    let soak_errors = stream_errors.load(Ordering::Relaxed) - errors_before;
    eprintln!("soak: {round} rounds, {expiries} forced expiries, {soak_errors} watch errors");
    assert!(
        soak_errors <= expiries,
        "{soak_errors} watch errors for {expiries} forced expiries: an error loop"
    );
    controller.abort();
}

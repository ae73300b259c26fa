//! Admission webhooks through the real kubectl: a mutating webhook's patch
//! is applied on create; a validating webhook on the `/status`
//! subresource sees who is asking, and its denial reaches kubectl with its
//! message.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::process::Command;
use std::sync::{Arc, Mutex};

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running, Tokens};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The userInfo of every review the validating webhook saw.
type Seen = Arc<Mutex<Vec<Value>>>;

/// A webhook server on loopback over HTTPS; its URL and CA.
async fn webhook_server(seen: Seen) -> (String, String) {
    let pki = aip_fake_apiserver::tls::pki().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.config.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap();
                        let answer = answer(&path, &review["request"], &seen);
                        let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer});
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            out.to_string(),
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, pki.ca_pem)
}

fn answer(path: &str, request: &Value, seen: &Seen) -> Value {
    let uid = request["uid"].clone();
    match path {
        "/mutate" => {
            let mut labels = request
                .pointer("/object/metadata/labels")
                .cloned()
                .unwrap_or(json!({}));
            labels["mutated"] = json!("yes");
            let patch = json!([{"op": "add", "path": "/metadata/labels", "value": labels}]);
            let patch = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
        }
        _ => {
            seen.lock()
                .unwrap()
                .push(json!({"user": request["userInfo"], "subResource": request["subResource"]}));
            let user = request["userInfo"]["username"].as_str().unwrap_or_default();
            if user == "alice" {
                json!({"uid": uid, "allowed": false,
                       "status": {"code": 403, "message": format!("{user} may not set the status of a widget")}})
            } else {
                json!({"uid": uid, "allowed": true})
            }
        }
    }
}

fn kubectl(running: &Running, token: &str, dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let config = dir.join(format!("kubeconfig-{}", &token[..5]));
    std::fs::write(&config, running.kubeconfig(token)).unwrap();
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &config)
        .env("HOME", dir)
        .current_dir(dir)
        .output()
        .expect("kubectl must be installed to run this test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_mutate_and_validate_with_the_requesters_identity() {
    let seen: Seen = Arc::default();
    let (hook, ca) = webhook_server(seen.clone()).await;
    let tokens = Tokens::parse("alice-token,alice,1001,\"dev\"\n").unwrap();
    let running = Arc::new(
        aip_fake_apiserver::start(Options {
            tokens,
            ..Options::default()
        })
        .await
        .unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("aip-admission-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let manifests = format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: widgets.example.io}}
spec:
  group: example.io
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {{status: {{}}}}
      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {{name: label-widgets}}
webhooks:
  - name: label.example.io
    clientConfig: {{url: '{hook}/mutate', caBundle: {ca}}}
    rules: [{{operations: [CREATE], apiGroups: [example.io], apiVersions: [v1], resources: [widgets]}}]
    sideEffects: None
    admissionReviewVersions: [v1]
    failurePolicy: Fail
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: guard-status}}
webhooks:
  - name: status.example.io
    clientConfig: {{url: '{hook}/validate', caBundle: {ca}}}
    rules: [{{operations: [UPDATE], apiGroups: [example.io], apiVersions: [v1], resources: [widgets/status]}}]
    sideEffects: None
    admissionReviewVersions: [v1]
    failurePolicy: Fail
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: widget-editor}}
rules: [{{apiGroups: [example.io], resources: [widgets, widgets/status], verbs: ['*']}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: alice-edits-widgets}}
subjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{kind: ClusterRole, name: widget-editor, apiGroup: rbac.authorization.k8s.io}}
"
    );
    std::fs::write(dir.join("setup.yaml"), manifests).unwrap();
    std::fs::write(
        dir.join("w.yaml"),
        "apiVersion: example.io/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n",
    )
    .unwrap();
    let r = running.clone();
    tokio::task::spawn_blocking(move || {
        let admin = |args: &[&str]| kubectl(&r, ADMIN_TOKEN, &dir, args);
        let alice = |args: &[&str]| kubectl(&r, "alice-token", &dir, args);
        let (ok, text) = admin(&["apply", "-f", "setup.yaml"]);
        assert!(ok, "{text}");
        assert!(admin(&["wait", "--for=condition=Established", "crd/widgets.example.io"]).0);
        let (ok, text) = admin(&["apply", "-f", "w.yaml"]);
        assert!(ok, "{text}");
        let (_, label) = admin(&["get", "widget", "w1", "-o", "jsonpath={.metadata.labels.mutated}"]);
        assert_eq!(label, "yes", "the mutating webhook's patch was applied");

        let status = r#"{"status":{"phase":"Ready"}}"#;
        let (ok, text) = alice(&["patch", "widget", "w1", "--subresource=status", "--type=merge", "-p", status]);
        assert!(!ok);
        assert!(
            text.contains(r#"admission webhook "status.example.io" denied the request: alice may not set the status of a widget"#),
            "{text}"
        );
        let (ok, text) = admin(&["patch", "widget", "w1", "--subresource=status", "--type=merge", "-p", status]);
        assert!(ok, "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["user"]["username"], "alice");
    assert_eq!(
        seen[0]["user"]["groups"],
        json!(["dev", "system:authenticated"])
    );
    assert_eq!(seen[0]["subResource"], "status");
    assert_eq!(seen[1]["user"]["username"], "admin");
}

//! Service-account tokens as the operator will check sidecars: a minted,
//! pod-bound token passes a TokenReview for its audience; a wrong audience,
//! an expired token, a forged signature and a deleted pod do not. Minted
//! tokens for the API server's own audience also authenticate requests, and
//! SubjectAccessReview answers from RBAC.

#![allow(clippy::unwrap_used)]

use aip_fake_apiserver::tokens::{Bound, Claims, ISSUER, Ref};
use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Config};
use serde_json::{Value, json};

async fn client(running: &Running, token: &str) -> Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&running.kubeconfig(token)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn review(client: &Client, token: &str, audience: &str) -> Value {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review: TokenReview =
        serde_json::from_value(json!({"spec": {"token": token, "audiences": [audience]}})).unwrap();
    let answered = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    serde_json::to_value(answered.status.unwrap()).unwrap()
}

#[tokio::test]
async fn minted_tokens_are_reviewed_strictly() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let admin = client(&running, ADMIN_TOKEN).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "sidecar"}})).unwrap(),
        )
        .await
        .unwrap();
    let pod = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "agent-1"},
                "spec": {"containers": [{"name": "a", "image": "agent"}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let request: TokenRequest = serde_json::from_value(json!({"spec": {
        "audiences": ["aip.io/operator"], "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent-1", "uid": uid}}}))
    .unwrap();
    let minted = accounts
        .create_token_request("sidecar", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = minted.status.unwrap().token.unwrap();

    let ok = review(&admin, &token, "aip.io/operator").await;
    assert_eq!(ok["authenticated"], true, "{ok}");
    assert_eq!(
        ok["user"]["username"],
        "system:serviceaccount:default:sidecar"
    );
    assert_eq!(
        ok["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["agent-1"])
    );
    assert_eq!(
        ok["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([uid])
    );

    let wrong = review(&admin, &token, "someone-else").await;
    assert_eq!(wrong["authenticated"], false, "{wrong}");
    assert!(
        wrong["error"].as_str().unwrap().contains("audience"),
        "{wrong}"
    );

    // Same claims, expired, correctly signed.
    let claims = Claims {
        iss: ISSUER.into(),
        sub: "system:serviceaccount:default:sidecar".into(),
        aud: vec!["aip.io/operator".into()],
        exp: 1_000,
        iat: 900,
        nbf: 900,
        kubernetes: Bound {
            namespace: "default".into(),
            serviceaccount: Ref {
                name: "sidecar".into(),
                uid: String::new(),
            },
            pod: None,
        },
    };
    let expired = running.server.signer.sign(&claims).unwrap();
    let answer = review(&admin, &expired, "aip.io/operator").await;
    assert_eq!(answer["authenticated"], false);
    assert!(
        answer["error"].as_str().unwrap().contains("expired"),
        "{answer}"
    );

    // The signature of a token altered after signing no longer holds.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut signature = parts[2].clone().into_bytes();
    signature[0] = if signature[0] == b'A' { b'B' } else { b'A' };
    parts[2] = String::from_utf8(signature).unwrap();
    let forged = review(&admin, &parts.join("."), "aip.io/operator").await;
    assert_eq!(forged["authenticated"], false, "{forged}");

    // A token outlives nothing it is bound to.
    pods.delete("agent-1", &DeleteParams::default())
        .await
        .unwrap();
    let orphan = review(&admin, &token, "aip.io/operator").await;
    assert_eq!(orphan["authenticated"], false, "{orphan}");
}

#[tokio::test]
async fn service_account_tokens_authenticate_and_rbac_applies() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let admin = client(&running, ADMIN_TOKEN).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "operator"}})).unwrap(),
        )
        .await
        .unwrap();
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [ISSUER]}})).unwrap();
    let token = accounts
        .create_token_request("operator", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap();
    let operator = client(&running, &token).await;
    let cms: Api<ConfigMap> = Api::namespaced(operator, "default");
    let denied = cms.list(&Default::default()).await.unwrap_err();
    assert!(
        matches!(denied, kube::Error::Api(ref e) if e.code == 403 && e.message.contains("system:serviceaccount:default:operator")),
        "{denied:?}"
    );
    let sars: Api<SubjectAccessReview> = Api::all(admin);
    let ask = |user: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({"spec": {"user": user,
            "resourceAttributes": {"namespace": "default", "verb": "get", "resource": "secrets", "name": "s"}}}))
        .unwrap()
    };
    let answer = sars
        .create(&PostParams::default(), &ask("nobody"))
        .await
        .unwrap();
    assert!(!answer.status.unwrap().allowed);
}

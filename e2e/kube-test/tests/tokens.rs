//! Service-account tokens as the sidecar gets them: asymmetric JWTs from
//! TokenRequest, bound to a pod and to the audience `aip.io/sidecar`,
//! accepted by TokenReview for that audience only and only while the pod
//! exists, and verifiable offline with the issuer's published JWKS.

use std::time::{Duration, Instant};

use aip_kube_test::{User, fresh_namespace, shared};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
    TokenReviewStatus,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;

const AUDIENCE: &str = "aip.io/sidecar";

#[tokio::test]
async fn pod_bound_sidecar_token_is_accepted_for_its_audience_until_the_pod_goes() {
    let control_plane = shared().await;
    let admin = control_plane.client(User::Admin).await;
    let namespace = fresh_namespace("tokens").await;
    let pod = agent_pod(&admin, &namespace).await;
    let uid = pod.metadata.uid.clone().expect("a created pod has a uid");
    let token = request_token(&admin, &namespace, Some(&pod)).await;

    let accepted = review(&admin, &token, &[AUDIENCE]).await;
    assert_eq!(accepted.authenticated, Some(true), "{accepted:?}");
    assert_eq!(
        accepted.audiences.as_deref(),
        Some(&[AUDIENCE.to_owned()][..])
    );
    let user = accepted.user.expect("an accepted review names the user");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{namespace}:agent").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["agent-1".to_owned()])
    );
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![uid.clone()])
    );

    // Another audience, and the API server's own (a review without
    // audiences asks for those), are refused.
    let other = review(&admin, &token, &["aip.io/other"]).await;
    assert_eq!(other.authenticated, None, "{other:?}");
    assert_eq!(
        other.error.as_deref(),
        Some(
            "[invalid bearer token, token audiences [\"aip.io/sidecar\"] is invalid for the target audiences [\"aip.io/other\"]]"
        ),
    );
    let own = review(&admin, &token, &[]).await;
    assert_eq!(own.authenticated, None, "{own:?}");
    if control_plane.is_local() {
        // `--api-audiences` defaults to the issuer, which is the URL.
        assert_eq!(
            own.error,
            Some(format!(
                "[invalid bearer token, token audiences [\"aip.io/sidecar\"] is invalid for the target audiences [\"{}\"]]",
                control_plane.url()
            ))
        );
    }

    Api::<Pod>::namespaced(admin.clone(), &namespace)
        .delete("agent-1", &DeleteParams::default())
        .await
        .expect("the pod is deleted");
    // An unscheduled pod goes at once (no kubelet to wait for), and a
    // review the API server has not answered before refuses its token —
    // once the server's own view of pods has the deletion (it reads them
    // from its informer, which a loaded machine delays by a moment).
    let invalidated = Some("[invalid bearer token, service account token has been invalidated]");
    let gone = Instant::now();
    let fresh = loop {
        let status = review(&admin, &token, &[AUDIENCE, "aip.io/unused"]).await;
        if status.authenticated != Some(true) || gone.elapsed() > Duration::from_secs(10) {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(fresh.authenticated, None, "{fresh:?}");
    assert_eq!(fresh.error.as_deref(), invalidated);
    // A review it answered before is served from its token cache
    // (success entries live 10 s), then refused too.
    let deleted = Instant::now();
    let cached = loop {
        let status = review(&admin, &token, &[AUDIENCE]).await;
        if status.authenticated != Some(true) {
            break status;
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(20),
            "the token of a deleted pod is still accepted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "the cached review of a deleted pod's token was refused after {:?}",
        deleted.elapsed()
    );
    assert_eq!(cached.error.as_deref(), invalidated);
}

#[tokio::test]
async fn issuer_publishes_discovery_and_keys_that_verify_its_tokens() {
    let control_plane = shared().await;
    let admin = control_plane.client(User::Admin).await;

    let discovery: Value = get(&admin, "/.well-known/openid-configuration").await;
    let issuer = discovery["issuer"]
        .as_str()
        .expect("discovery names the issuer")
        .to_owned();
    if control_plane.is_local() {
        assert_eq!(issuer, control_plane.url());
    }
    assert_eq!(discovery["jwks_uri"], format!("{issuer}/openid/v1/jwks"));
    assert_eq!(
        discovery["response_types_supported"],
        serde_json::json!(["id_token"])
    );
    assert_eq!(
        discovery["subject_types_supported"],
        serde_json::json!(["public"])
    );

    let keys: JwkSet = get(&admin, "/openid/v1/jwks").await;
    assert!(!keys.keys.is_empty(), "the JWKS has keys");

    let namespace = fresh_namespace("jwks").await;
    let token = request_token(&admin, &namespace, None).await;
    let header = jsonwebtoken::decode_header(&token).expect("the token is a JWT");
    let kid = header.kid.expect("the token names its key");
    let key = keys.find(&kid).expect("the JWKS holds the token's key");
    let algorithm = if control_plane.is_local() {
        assert_eq!(
            header.alg,
            Algorithm::ES256,
            "the local signing key is ECDSA P-256"
        );
        assert_eq!(
            discovery["id_token_signing_alg_values_supported"],
            serde_json::json!(["ES256"])
        );
        Algorithm::ES256
    } else {
        header.alg
    };
    let mut validation = Validation::new(algorithm);
    validation.set_audience(&[AUDIENCE]);
    validation.set_issuer(&[issuer.as_str()]);
    let claims = jsonwebtoken::decode::<Value>(
        &token,
        &DecodingKey::from_jwk(key).expect("a usable JWK"),
        &validation,
    )
    .expect("the token verifies offline against the published key")
    .claims;
    assert_eq!(
        claims["sub"],
        format!("system:serviceaccount:{namespace}:agent")
    );
    assert_eq!(claims["kubernetes.io"]["namespace"], namespace.as_str());
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "agent");
}

/// ServiceAccount `agent` and its pod `agent-1` (Pending for ever: there is
/// no scheduler).
async fn agent_pod(admin: &kube::Client, namespace: &str) -> Pod {
    create_agent_account(admin, namespace).await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("agent-1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some("agent".into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("registry.invalid/agent:1".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("the pod is created")
}

async fn create_agent_account(admin: &kube::Client, namespace: &str) {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("agent".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount agent: {e}"),
    }
}

/// A token for `agent` with the sidecar's audience, bound to `pod` if given.
async fn request_token(admin: &kube::Client, namespace: &str, pod: Option<&Pod>) -> String {
    if pod.is_none() {
        create_agent_account(admin, namespace).await;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![AUDIENCE.into()]),
            bound_object_ref: pod.map(|pod| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let granted = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .expect("TokenRequest for agent");
    granted
        .status
        .and_then(|s| s.token)
        .expect("a granted TokenRequest has a token")
}

async fn review(admin: &kube::Client, token: &str, audiences: &[&str]) -> TokenReviewStatus {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: (!audiences.is_empty())
                .then(|| audiences.iter().map(|a| (*a).to_owned()).collect()),
        },
        ..TokenReview::default()
    };
    Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("the admin may review tokens")
        .status
        .expect("a review has a status")
}

async fn get<T: serde::de::DeserializeOwned>(client: &kube::Client, path: &str) -> T {
    let request = http::Request::get(path)
        .body(Vec::new())
        .expect("a valid request");
    client
        .request(request)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

//! The operator's admission webhooks over HTTPS: `POST /validate` for
//! AgentPolicy and ToolConnection writes. Invalid objects are refused at
//! `kubectl apply` time with aip-policy's field-path errors; a
//! ToolConnection is also refused unless its author may `get` every Secret
//! it references (a SubjectAccessReview per Secret), so that no one can aim
//! a Secret they cannot read at a host of their choosing.

pub mod approvals;
pub mod inject;
pub mod lock;
pub mod tool_acceptance;
pub mod validate;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use aip_service::budget::Budget;
use aip_service::serve::{Limits, accept_loop, http1};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionResponse, AdmissionReview};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// Largest AdmissionReview accepted (the API server's own request limit is
/// 3 MiB; a policy is far smaller).
const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;
/// What the reviews being read and decided may hold together: each reserves
/// four times its declared size (the body, its parse, the object) before
/// its body is read, so 512 connections declaring 3 MiB cannot take the
/// operator past its memory limit.
const IN_FLIGHT_BUDGET: usize = 64 * 1024 * 1024;
const EXPANSION: usize = 4;
/// How long a review waits for room in the budget before it is answered
/// 503 (the API server's own webhook timeout is 10 s by default).
const BUDGET_WAIT: Duration = Duration::from_secs(5);

pub struct Webhooks {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// The operator's own user name, as the API server authenticates it.
    pub operator: String,
    /// What `/inject` adds to pods; None: it refuses them, saying so.
    pub injection: Option<inject::Injection>,
    /// The cluster as the operator knows it: which projected tokens a
    /// namespace's connections authenticate with (None: none).
    pub index: Option<Arc<std::sync::Mutex<crate::index::Index>>>,
}

/// A rustls server configuration from PEM text.
pub fn tls_config(cert_pem: &str, key_pem: &str) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Arc::new(config))
}

pub async fn serve(
    webhooks: Arc<Webhooks>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let limits = Limits::default();
    let budget = Budget::new(IN_FLIGHT_BUDGET);
    accept_loop(
        listener,
        limits,
        shutdown,
        TaskTracker::new(),
        move |stream| {
            let webhooks = webhooks.clone();
            let acceptor = acceptor.clone();
            let budget = budget.clone();
            async move {
                // The handshake gets the same deadline as a request's headers.
                let handshake =
                    tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
                let Ok(Ok(tls)) = handshake.await else {
                    return;
                };
                let service = service_fn(move |req| route(webhooks.clone(), budget.clone(), req));
                let _ = http1(&limits)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            }
        },
    )
    .await;
}

async fn route(
    webhooks: Arc<Webhooks>,
    budget: Budget,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let hook = match (req.method(), req.uri().path()) {
        (&Method::POST, "/validate") => Hook::Validate,
        (&Method::POST, "/mutate") => Hook::Mutate,
        (&Method::POST, "/inject") => Hook::Inject,
        _ => return Ok(plain(StatusCode::NOT_FOUND, "not found\n")),
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(MAX_REVIEW_BYTES)
        .min(MAX_REVIEW_BYTES);
    let Ok(_held) = tokio::time::timeout(BUDGET_WAIT, budget.reserve(EXPANSION * declared)).await
    else {
        let mut busy = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many reviews in flight\n",
        );
        let headers = busy.headers_mut();
        headers.insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
        // Its body was never read: the connection cannot carry another.
        headers.insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        return Ok(busy);
    };
    let reading = Limited::new(req.into_body(), MAX_REVIEW_BYTES).collect();
    let body = match tokio::time::timeout(Limits::default().body_timeout, reading).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, "review too large\n")),
        Err(_) => {
            return Ok(plain(
                StatusCode::REQUEST_TIMEOUT,
                "the review's body did not arrive in time\n",
            ));
        }
    };
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return Ok(plain(
                StatusCode::BAD_REQUEST,
                &format!("not an AdmissionReview: {e}\n"),
            ));
        }
    };
    let response = match (review.try_into(), hook) {
        (Ok(request), Hook::Mutate) => mutation(&webhooks.operator, &request),
        (Ok(request), Hook::Validate) => validate::review(&webhooks, &request).await,
        (Ok(request), Hook::Inject) => match &webhooks.injection {
            Some(injection) => {
                let namespace = request.namespace.clone().unwrap_or_default();
                let known = webhooks.index.as_ref().map(|index| {
                    let index = index
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    (index.is_synced(), index.upstream_tokens(&namespace))
                });
                // The namespace's EgressLocks are read from the API server
                // for every pod: one created a moment before the pod (in
                // the same `kubectl apply`) locks it, whether or not the
                // index has seen it yet. Unreadable, the pod is refused.
                let egress = if request.operation == kube::core::admission::Operation::Create {
                    lock::namespace_allow(&webhooks.client, &namespace).await
                } else {
                    Ok(None)
                };
                match (known, egress) {
                    (_, Err(e)) => AdmissionResponse::from(&request).deny(format!(
                        "cannot read the EgressLocks of namespace {namespace}, so the pod could not be locked as they may require: {}",
                        crate::errors::api_reason(&e)
                    )),
                    // Before the connections are known, the pod could miss
                    // their tokens: its creation is retried.
                    (Some((false, _)), _) => AdmissionResponse::from(&request).deny(
                        "the operator is still loading the cluster's state (ToolConnections); try again in a moment",
                    ),
                    (Some((true, tokens)), Ok(egress)) => {
                        inject::review(injection, &request, &tokens, egress.as_deref())
                    }
                    (None, Ok(egress)) => inject::review(injection, &request, &[], egress.as_deref()),
                }
            }
            None => AdmissionResponse::from(&request).deny(
                "sidecar injection is not configured on this operator (start it with --sidecar-image)",
            ),
        },
        (Err(e), _) => AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")),
    };
    let body = serde_json::to_vec(&wire_review(response)).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    if let Ok(v) = "application/json".parse() {
        r.headers_mut().insert("content-type", v);
    }
    Ok(r)
}

/// The AdmissionReview as the API server reads it: `response.patch` is a
/// `[]byte` in Go, so JSON carries it as base64 text (kube-core serializes
/// its `Vec<u8>` as an array of numbers, which the API server refuses).
fn wire_review(response: AdmissionResponse) -> serde_json::Value {
    use base64::Engine;
    let mut review = serde_json::to_value(response.into_review()).unwrap_or_default();
    if let Some(bytes) = review.pointer("/response/patch").and_then(|p| p.as_array()) {
        let bytes: Vec<u8> = bytes
            .iter()
            .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect();
        review["response"]["patch"] =
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    review
}

/// `/mutate`: stamps who decided an ApprovalRequest, and who accepted a
/// tool of a ToolConnection.
fn mutation(
    operator: &str,
    request: &kube::core::admission::AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let stamp = match request.kind.kind.as_str() {
        "ToolConnection" => tool_acceptance::stamp(operator, request),
        _ => approvals::stamp(request),
    };
    match stamp {
        None => response,
        Some(patch) => response
            .with_patch(patch)
            .unwrap_or_else(|e| AdmissionResponse::invalid(e.to_string())),
    }
}

#[derive(Clone, Copy)]
enum Hook {
    Validate,
    Mutate,
    Inject,
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_owned())));
    *r.status_mut() = status;
    r
}

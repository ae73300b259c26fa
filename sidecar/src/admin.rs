//! The admin port, separate from the agent's: /healthz, /readyz (a policy is
//! loaded), /metrics, /connections (health per connection), and, standalone
//! only, /approvals: `GET` lists pending asks and `POST /approvals/{id}` with
//! `{"decision": "approve"|"deny"}` decides one. Approval routes need the
//! bearer token from a file only the machine's operator can read.
//!
//! The same routes can be served on a second listener as the [`Surface::Probes`]
//! surface: /healthz, /readyz and /metrics only. In a pod the admin port stays
//! on loopback (its /connections names every upstream URL and catalog) and
//! the probes surface is the one on the pod's IP, for the kubelet and
//! Prometheus, which cannot reach the pod's loopback.

use std::convert::Infallible;
use std::sync::Arc;

use aip_service::serve::{Limits, accept_loop, http1};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gate::Gateway;

type Body = BoxBody<Bytes, Infallible>;

pub struct Admin {
    pub gateway: Arc<Gateway>,
    /// Bearer token for the approval routes; None: there are none (in
    /// Kubernetes mode decisions come only through the API server, since
    /// anything on loopback is reachable by the agent).
    pub approval_token: Option<SecretString>,
}

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    /// Every route: for loopback, where only the pod's own containers (or a
    /// `kubectl port-forward`) reach it.
    Admin,
    /// Only [`PROBE_PATHS`]: nothing that names a connection, an upstream
    /// or an approval, so it may listen where others can connect.
    Probes,
}

/// What the probes surface serves; everything else there is 404, as if the
/// route did not exist.
pub const PROBE_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Serves `surface`'s routes until `shutdown`.
pub async fn serve(
    admin: Arc<Admin>,
    listener: TcpListener,
    surface: Surface,
    shutdown: CancellationToken,
) {
    let limits = Limits::default();
    let tracker = TaskTracker::new();
    accept_loop(listener, limits, shutdown, tracker, move |stream| {
        let admin = admin.clone();
        async move {
            let service = service_fn(move |req| route(admin.clone(), surface, req));
            let _ = http1(&limits)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    })
    .await;
}

async fn route(
    admin: Arc<Admin>,
    surface: Surface,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    if surface == Surface::Probes && !PROBE_PATHS.contains(&path.as_str()) {
        return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
    }
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if admin.gateway.ready() => text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/readyz") => {
            text(StatusCode::SERVICE_UNAVAILABLE, "no valid policy loaded\n")
        }
        (&Method::GET, "/metrics") => {
            let mut r =
                Response::new(Full::new(Bytes::from(admin.gateway.metrics.encode())).boxed());
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        (&Method::GET, "/connections") => {
            json_response(StatusCode::OK, &connections(&admin.gateway))
        }
        (_, p)
            if admin.approval_token.is_some()
                && (p == "/approvals" || p.starts_with("/approvals/")) =>
        {
            approvals(&admin, req).await
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

fn connections(gateway: &Gateway) -> Value {
    let colliding = gateway.colliding_tools();
    let list: Vec<Value> = gateway
        .connections()
        .iter()
        .map(|c| {
            let catalog = c.catalog();
            let tools: Vec<&str> = catalog
                .iter()
                .filter(|t| t.standing.served())
                .map(|t| t.name())
                .collect();
            let withheld: Vec<Value> = catalog
                .iter()
                .filter_map(|t| Some(json!({"name": t.name(), "reason": t.standing.reason()?})))
                .collect();
            let name = &c.connection().name;
            let hidden: Vec<&String> = colliding
                .iter()
                .filter(|(connection, _)| connection == name)
                .map(|(_, tool)| tool)
                .collect();
            json!({
                "name": name,
                "health": c.health(),
                "tools": tools,
                "withheld_tools": withheld,
                "gated_tools": c.gates(),
                "colliding_tools": hidden,
                "standalone_stream": c.stream_state().map(|s| *s.borrow()),
            })
        })
        .collect();
    json!({ "connections": list })
}

async fn approvals(admin: &Admin, req: Request<Incoming>) -> Response<Body> {
    if !authorized(admin, &req) {
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            "approval routes need the operator's bearer token\n",
        );
        r.headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        return r;
    }
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.strip_prefix("/approvals/")) {
        (Method::GET, None) => json_response(
            StatusCode::OK,
            &json!({"pending": admin.gateway.approvals.list()}),
        ),
        (Method::POST, Some(id)) if !id.is_empty() => {
            let body = match Limited::new(req.into_body(), 4096).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n"),
            };
            let decision: Option<String> = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("decision").and_then(Value::as_str).map(str::to_owned));
            let approve = match decision.as_deref() {
                Some("approve") => true,
                Some("deny") => false,
                _ => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "body must be {\"decision\": \"approve\"} or {\"decision\": \"deny\"}\n",
                    );
                }
            };
            match admin.gateway.approvals.decide(id, approve) {
                Ok(pending) => json_response(
                    StatusCode::OK,
                    &json!({"decided": pending, "approved": approve}),
                ),
                Err(e) => json_response(StatusCode::NOT_FOUND, &json!({"error": e.to_string()})),
            }
        }
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /approvals or POST /approvals/{id}\n",
        ),
    }
}

/// Compares digests so the comparison does not leak the token by timing.
fn authorized(admin: &Admin, req: &Request<Incoming>) -> bool {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    admin.approval_token.as_ref().is_some_and(|token| {
        Sha256::digest(presented.as_bytes()) == Sha256::digest(token.expose_secret().as_bytes())
            && !presented.is_empty()
    })
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

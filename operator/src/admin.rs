//! The admin port: /healthz (the process answers), /readyz (the cluster's
//! state is loaded and the gRPC service listens), /metrics (Prometheus).

use std::convert::Infallible;
use std::sync::Arc;

use aip_service::serve::{Limits, accept_loop, http1};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub ready: watch::Receiver<bool>,
}

pub async fn serve(admin: Arc<Admin>, listener: TcpListener, shutdown: CancellationToken) {
    let limits = Limits::default();
    accept_loop(
        listener,
        limits,
        shutdown,
        TaskTracker::new(),
        move |stream| {
            let admin = admin.clone();
            async move {
                let service = service_fn(move |req| route(admin.clone(), req));
                let _ = http1(&limits)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        },
    )
    .await;
}

async fn route(
    admin: Arc<Admin>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if *admin.ready.borrow() => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "loading the cluster's state\n".to_owned(),
        ),
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            admin.metrics.encode(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert("content-type", v);
    }
    Ok(response)
}

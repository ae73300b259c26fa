//! `aip-fake-apiserver`: a small Kubernetes API server for tests. It speaks
//! the real wire protocol — discovery, CRUD, list/watch with
//! resourceVersions, the status subresource, patches, CRDs — to kube-rs
//! and kubectl, from memory. It is test infrastructure: README.md says
//! exactly what it supports.
//!
//! Start it in-process with [`start`]; it stops when the returned handle
//! is dropped.

#![forbid(unsafe_code)]

pub mod admission;
pub mod auth;
pub mod http;
pub mod kinds;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod rbac;
pub mod schema;
pub mod select;
pub mod server;
pub mod ssa;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod tokens;
pub mod values;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::{Tokens, User};
pub use server::Server;

/// The bootstrap administrator's token in every server (group
/// `system:masters`).
pub const ADMIN_TOKEN: &str = "aip-fake-admin-token";

pub struct Options {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Users besides the bootstrap administrator.
    pub tokens: Tokens,
    /// HTTPS with a fresh self-signed CA (the default), or plain HTTP.
    pub tls: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens: Tokens::default(),
            tls: true,
        }
    }
}

/// A running server; dropping it stops it (connections and watches end).
pub struct Running {
    pub addr: SocketAddr,
    pub server: Arc<Server>,
    /// The CA that signed the serving certificate (PEM), when serving HTTPS.
    pub ca_pem: Option<String>,
    shutdown: CancellationToken,
}

impl Running {
    /// `https://ADDR` (or `http://` without TLS).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig that reaches this server as the user of `token`.
    pub fn kubeconfig(&self, token: &str) -> String {
        use base64::Engine;
        let ca = self.ca_pem.as_ref().map_or(String::new(), |pem| {
            let data = base64::engine::general_purpose::STANDARD.encode(pem);
            format!("    certificate-authority-data: {data}\n")
        });
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n{ca}contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: user\n    namespace: default\ncurrent-context: fake\nusers:\n- name: user\n  user:\n    token: {token}\n",
            self.url()
        )
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a server on `options.listen` (must be called inside a Tokio
/// runtime).
pub async fn start(options: Options) -> std::io::Result<Running> {
    let shutdown = CancellationToken::new();
    let mut tokens = options.tokens;
    tokens.insert(
        ADMIN_TOKEN,
        User {
            name: "admin".into(),
            uid: "admin".into(),
            groups: vec!["system:masters".into()],
            ..User::default()
        },
    );
    let server = Server::new(tokens, shutdown.clone());
    let listener = TcpListener::bind(options.listen).await?;
    let addr = listener.local_addr()?;
    let pki = if options.tls {
        Some(tls::pki().map_err(std::io::Error::other)?)
    } else {
        None
    };
    let acceptor = pki
        .as_ref()
        .map(|p| tokio_rustls::TlsAcceptor::from(p.config.clone()));
    tokio::spawn(serve(server.clone(), listener, acceptor, shutdown.clone()));
    Ok(Running {
        addr,
        server,
        ca_pem: pki.map(|p| p.ca_pem),
        shutdown,
    })
}

async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let server = server.clone();
        let stop = shutdown.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                None => connection(server, stream, stop).await,
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => connection(server, tls, stop).await,
                    Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                },
            }
        });
    }
}

/// Serves one connection until it ends or the server stops.
async fn connection<S>(server: Arc<Server>, stream: S, stop: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| http::handle(server.clone(), req));
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stop.cancelled() => connection.as_mut().graceful_shutdown(),
    }
}

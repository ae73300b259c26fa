//! https upstreams: a real TLS handshake (rustls) with a test CA, the
//! built-in roots refusing an unknown CA, and a server-name override.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use aip_fault_server::core::Core;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use aip_mcp::Failure;
use aip_mcp::http::HttpUpstream;
use aip_policy::CompileOptions;
use aip_sidecar::config::file;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A certificate chain and its private key.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

struct Pki {
    ca_pem: String,
    /// Issues an identity for a server name.
    server: Box<dyn Fn(&str) -> Identity>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca_pem = ca_cert.pem();
    let issuer = Arc::new(Issuer::new(ca_params, ca_key));
    Pki {
        ca_pem,
        server: Box::new(move |name| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_owned()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (
                vec![cert.der().clone()],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
            )
        }),
    }
}

/// The fault server behind a TLS terminator; returns (port, core).
async fn tls_fault_server(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    shutdown: &CancellationToken,
) -> (u16, Arc<Core>) {
    let yaml = "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {name: tls}\nspec:\n  tools:\n    - name: t\n      responses: [{sequence: [{return: over tls}]}]\n";
    let core = Core::new(
        Script::from_yaml(yaml, Transport::Http).unwrap(),
        AttemptLog::new(Box::new(std::io::sink()), false),
    );
    let plain = aip_fault_server::http::start_on_loopback(core.clone(), shutdown.clone())
        .await
        .unwrap();
    let backend: std::net::SocketAddr = plain
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix("/mcp"))
        .unwrap()
        .parse()
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = front.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = front.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut backend = tokio::net::TcpStream::connect(backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut backend).await;
            });
        }
    });
    (port, core)
}

fn upstream(url: &str, tls: &str) -> HttpUpstream {
    let text = format!(
        "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: secure}}\nspec:\n  url: {url}\n  timeoutSeconds: 5\n{tls}"
    );
    let config = file::parse(&text, &CompileOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    HttpUpstream::new(config.connections[0].clone()).unwrap()
}

fn call() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_connections_ca_and_server_name() {
    let shutdown = CancellationToken::new();
    let pki = pki();
    let tmp = tempfile::Builder::new()
        .prefix("aip-tls-ca-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let tls = format!("  tls:\n    caFile: {}\n", ca.display());

    let (chain, key) = (pki.server)("localhost");
    let (port, core) = tls_fault_server(chain, key, &shutdown).await;
    let up = upstream(&format!("https://localhost:{port}/mcp"), &tls);
    let x = up.request(&call(), None).await.unwrap();
    assert_eq!(x.response()["result"]["content"][0]["text"], "over tls");
    assert_eq!(core.log.lines().len(), 1);

    // The built-in web roots do not know this CA: refused before any call.
    let untrusted = upstream(&format!("https://localhost:{port}/mcp"), "");
    let failure = untrusted.request(&call(), None).await.unwrap_err();
    assert!(
        matches!(failure, Failure::InitFailed(ref inner) if matches!(**inner, Failure::Network(_))),
        "{failure:?}"
    );
    assert_eq!(core.log.lines().len(), 1, "nothing was sent");

    // A certificate for another name, verified through serverName.
    let (chain, key) = (pki.server)("upstream.internal");
    let (port, _) = tls_fault_server(chain, key, &shutdown).await;
    let wrong_name = upstream(&format!("https://127.0.0.1:{port}/mcp"), &tls);
    assert!(
        wrong_name.request(&call(), None).await.is_err(),
        "the URL's host does not match the certificate"
    );
    let named = upstream(
        &format!("https://127.0.0.1:{port}/mcp"),
        &format!("{tls}    serverName: upstream.internal\n"),
    );
    assert_eq!(
        named.request(&call(), None).await.unwrap().response()["result"]["content"][0]["text"],
        "over tls"
    );
    shutdown.cancel();
}

#[test]
fn tls_settings_are_validated() {
    let parse = |spec: &str| {
        let text = format!(
            "apiVersion: aip.io/v1alpha1\nkind: ToolConnection\nmetadata: {{name: c}}\nspec:\n{spec}"
        );
        file::parse(&text, &CompileOptions::default())
            .map(drop)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        parse("  url: http://x/mcp\n  tls: {serverName: a}\n").unwrap_err(),
        "document 1 (ToolConnection c): spec.tls: applies to https:// URLs only"
    );
    assert_eq!(
        parse("  url: https://x/mcp\n  tls: {caFile: /nonexistent/ca.pem}\n").unwrap_err(),
        "document 1 (ToolConnection c): spec.tls.caFile: cannot read /nonexistent/ca.pem: entity not found"
    );
    assert_eq!(
        parse("  url: https://x/mcp\n  tls: {serverName: 'not a name!'}\n").unwrap_err(),
        "document 1 (ToolConnection c): spec.tls.serverName: \"not a name!\" is not a valid DNS name or IP address"
    );
}

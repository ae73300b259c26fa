//! How the gateway finds its authorization server when the connection
//! names none, as MCP authorization says: the resource's 401 names its
//! RFC 9728 metadata (`WWW-Authenticate: Bearer resource_metadata=...`),
//! which names the authorization server, whose RFC 8414 metadata names the
//! token endpoint. Here one loopback server plays the resource, its
//! metadata at a path no well-known rule would guess, and the
//! authorization server; it records what it was asked, in order.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant, OAuth, TokenSource};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

type Seen = Arc<Mutex<Vec<String>>>;

async fn serve(
    addr: std::net::SocketAddr,
    req: Request<hyper::body::Incoming>,
    seen: Seen,
) -> Response<Full<Bytes>> {
    let line = format!("{} {}", req.method(), req.uri().path());
    let authorized = req.headers().contains_key("authorization");
    let body =
        String::from_utf8(req.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    seen.lock().unwrap().push(if line.ends_with("/token") {
        format!("{line} {body}")
    } else {
        line.clone()
    });
    let json = |v: serde_json::Value| {
        let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        r
    };
    let base = format!("http://{addr}");
    match line.as_str() {
        "POST /mcp" if !authorized => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"unauthorized")));
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r.headers_mut().insert(
                "www-authenticate",
                format!("Bearer resource_metadata=\"{base}/meta/files\"")
                    .parse()
                    .unwrap(),
            );
            r
        }
        "GET /meta/files" => json(serde_json::json!({
            "resource": format!("{base}/mcp"),
            "authorization_servers": [format!("{base}/as")],
        })),
        "GET /.well-known/oauth-authorization-server/as" => json(serde_json::json!({
            "issuer": format!("{base}/as"),
            "token_endpoint": format!("{base}/as/token"),
        })),
        "POST /as/token" => json(serde_json::json!({
            "access_token": "tok-1", "token_type": "Bearer", "expires_in": 300,
        })),
        _ => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    }
}

#[tokio::test]
async fn the_authorization_server_is_found_from_the_resources_401() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let served = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = served.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let seen = seen.clone();
                    async move { Ok::<_, Infallible>(serve(addr, req, seen).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let resource = format!("http://{addr}/mcp");
    let source = TokenSource::new(OAuth {
        server: AuthorizationServer::FromResource,
        grant: Grant::ClientCredentials,
        client_id: "gw".into(),
        client_auth: ClientAuth::SecretPost("s3cret".to_owned().into()),
        scopes: vec![],
        resource: resource.clone(),
        send_resource: true,
        timeout: Duration::from_secs(5),
        tls: aip_mcp::Tls::default(),
    })
    .unwrap();
    let token = source.bearer().await.unwrap();
    assert_eq!(token.header().to_str().unwrap(), "Bearer tok-1");
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "client_credentials")
        .append_pair("resource", &resource)
        .append_pair("client_id", "gw")
        .append_pair("client_secret", "s3cret")
        .finish();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "POST /mcp".to_owned(),
            "GET /meta/files".to_owned(),
            "GET /.well-known/oauth-authorization-server/as".to_owned(),
            format!("POST /as/token {form}"),
        ]
    );
}

//! The Streamable HTTP MCP server the agent talks to, on loopback: POST per
//! client message (JSON, or SSE when the client accepts only SSE), sessions
//! issued at initialize, DELETE to end one. It answers as an MCP server must:
//! 404 for an unknown session, 400 for an unsupported MCP-Protocol-Version,
//! 403 for an Origin that is not loopback. Failures of upstreams are never
//! HTTP errors here: they are JSON-RPC errors in a 200.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gate::{AGENT_VERSIONS, Caller, Gateway, Reply};

pub const MCP_PATH: &str = "/mcp";
/// Sessions kept at once; past this the least recently used one ends.
pub const MAX_SESSIONS: usize = 256;
const MAX_BODY: usize = 4 * 1024 * 1024;

type Body = BoxBody<Bytes, Infallible>;

struct State {
    gateway: Arc<Gateway>,
    /// Session id -> negotiated protocol version.
    sessions: Mutex<Sessions>,
}

/// Agent sessions: id -> (negotiated protocol version, last use), bounded.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, (String, u64)>,
    clock: u64,
}

impl Sessions {
    /// Marks a session used; false if it does not exist.
    fn touch(&mut self, id: &str) -> bool {
        self.clock += 1;
        match self.map.get_mut(id) {
            Some(entry) => {
                entry.1 = self.clock;
                true
            }
            None => false,
        }
    }

    /// Adds a session; returns the one evicted to make room, if any.
    fn insert(&mut self, id: String, version: String) -> Option<String> {
        self.clock += 1;
        let evicted = (self.map.len() >= MAX_SESSIONS)
            .then(|| {
                self.map
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone())
            })
            .flatten();
        if let Some(old) = &evicted {
            self.map.remove(old);
        }
        self.map.insert(id, (version, self.clock));
        evicted
    }

    fn remove(&mut self, id: &str) -> bool {
        self.map.remove(id).is_some()
    }
}

/// Serves agents until `shutdown`; then stops accepting and lets requests in
/// flight finish (the caller bounds how long it waits on `tracker`).
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> std::io::Result<()> {
    let state = Arc::new(State {
        gateway,
        sessions: Mutex::new(Sessions::default()),
    });
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = shutdown.cancelled() => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tracker.spawn(async move {
            let service = service_fn(move |req| route(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if req.uri().path() != MCP_PATH {
        return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
    }
    if let Some(origin) = req.headers().get("origin").and_then(|v| v.to_str().ok())
        && !is_loopback_origin(origin)
    {
        return Ok(text(StatusCode::FORBIDDEN, "origin not allowed\n"));
    }
    Ok(match *req.method() {
        Method::POST => post(&state, req).await,
        Method::DELETE => delete(&state, &req),
        Method::GET => {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "this gateway offers no server-to-client stream\n",
            );
            r.headers_mut()
                .insert("allow", HeaderValue::from_static("POST, DELETE"));
            r
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "use POST or DELETE\n"),
    })
}

async fn post(state: &State, req: Request<Incoming>) -> Response<Body> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (session_header, version_header) =
        (header("mcp-session-id"), header("mcp-protocol-version"));
    let accept = header("accept");
    let (sse, accepts) = (wants_sse(accept.as_deref()), accepts_sse(accept.as_deref()));
    if let Some(v) = &version_header
        && !AGENT_VERSIONS.contains(&v.as_str())
    {
        return text(
            StatusCode::BAD_REQUEST,
            "unsupported MCP-Protocol-Version\n",
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return rpc(
                StatusCode::PAYLOAD_TOO_LARGE,
                &json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": -32700, "message": format!("message is larger than {MAX_BODY} bytes")}}),
                false,
            );
        }
    };
    let message = match state.gateway.parse(&body) {
        Ok(m) => m,
        Err(refused) => return reply(state.gateway.refuse(&refused), sse, accepts),
    };
    let is_initialize = message.method() == Some("initialize");
    let session = if is_initialize {
        format!("{:032x}", rand::random::<u128>())
    } else {
        match session_header {
            None => return text(StatusCode::BAD_REQUEST, "missing Mcp-Session-Id\n"),
            Some(s) if !lock(&state.sessions).touch(&s) => {
                return text(StatusCode::NOT_FOUND, "unknown session\n");
            }
            Some(s) => s,
        }
    };
    let caller = Caller {
        session: session.clone(),
    };
    let outcome = state.gateway.handle_message(message, &caller).await;
    if is_initialize {
        let version = match &outcome {
            Reply::Message(v) | Reply::Stream(_, v) => v
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_owned),
            Reply::Nothing => None,
        };
        let Some(version) = version else {
            return reply(outcome, sse, accepts); // initialize refused: no session
        };
        let evicted = lock(&state.sessions).insert(session.clone(), version);
        if let Some(old) = evicted {
            state.gateway.end_session(&old);
        }
        let mut response = reply(outcome, sse, accepts);
        if let Ok(v) = HeaderValue::from_str(&session) {
            response.headers_mut().insert("mcp-session-id", v);
        }
        return response;
    }
    reply(outcome, sse, accepts)
}

fn delete(state: &State, req: &Request<Incoming>) -> Response<Body> {
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok());
    match session.and_then(|s| lock(&state.sessions).remove(s).then(|| s.to_owned())) {
        Some(s) => {
            state.gateway.end_session(&s);
            empty(StatusCode::NO_CONTENT)
        }
        None => text(StatusCode::NOT_FOUND, "unknown session\n"),
    }
}

fn reply(outcome: Reply, sse: bool, accepts_sse: bool) -> Response<Body> {
    match outcome {
        Reply::Message(v) => rpc(StatusCode::OK, &v, sse),
        Reply::Stream(notes, response) if accepts_sse => events(&notes, &response),
        Reply::Stream(_, response) => rpc(StatusCode::OK, &response, sse),
        Reply::Nothing => empty(StatusCode::ACCEPTED),
    }
}

/// `http(s)://localhost`, `127.0.0.0/8` or `[::1]`, any port.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or_default()
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Notifications, then the response, as one SSE stream.
fn events(notes: &[Value], response: &Value) -> Response<Body> {
    let mut body = String::new();
    for message in notes.iter().chain(std::iter::once(response)) {
        body.push_str("event: message\ndata: ");
        body.push_str(&message.to_string());
        body.push_str("\n\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

fn accepts_sse(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("text/event-stream"))
}

fn wants_sse(accept: Option<&str>) -> bool {
    let accept = accept.unwrap_or("");
    accept.contains("text/event-stream")
        && !(accept.contains("application/json") || accept.contains("*/*"))
}

fn rpc(status: StatusCode, message: &Value, sse: bool) -> Response<Body> {
    let (body, content_type) = if sse {
        (format!("data: {message}\n\n"), "text/event-stream")
    } else {
        (message.to_string(), "application/json")
    };
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
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

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = status;
    r
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::{MAX_SESSIONS, Sessions, is_loopback_origin};

    #[test]
    fn sessions_are_bounded_and_the_least_recently_used_goes() {
        let mut s = Sessions::default();
        for i in 0..MAX_SESSIONS {
            assert_eq!(s.insert(format!("s{i}"), "v".into()), None);
        }
        assert!(s.touch("s0"), "s0 is now the most recently used");
        assert_eq!(s.insert("new".into(), "v".into()), Some("s1".into()));
        assert!(!s.touch("s1"));
        assert!(s.touch("s0") && s.touch("new"));
        assert!(s.remove("new") && !s.remove("new"));
    }

    #[test]
    fn loopback_origins() {
        for ok in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8443",
            "http://127.1.2.3",
            "http://[::1]:80",
        ] {
            assert!(is_loopback_origin(ok), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "null",
            "file://",
            "http://10.0.0.1",
            "http://[::2]",
        ] {
            assert!(!is_loopback_origin(bad), "{bad}");
        }
    }
}

//! The Streamable HTTP MCP server the agent talks to, on loopback: POST per
//! client message (JSON; SSE when the client accepts only SSE, or once a
//! message about the request must reach the agent before its response),
//! sessions issued at initialize, a GET stream per session for
//! `notifications/tools/list_changed`, DELETE to end a session. It answers
//! as an MCP server must:
//! 404 for an unknown session, 400 for an unsupported MCP-Protocol-Version,
//! 403 for an Origin that is not loopback. Failures of upstreams are never
//! HTTP errors here: they are JSON-RPC errors in a 200.

use aip_service::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use aip_policy::codes;
use aip_service::budget::{Budget, Reserved};
use aip_service::serve::{Limits, accept_loop, http1};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gate::{AGENT_VERSIONS, Caller, Gateway, Reply};

pub const MCP_PATH: &str = "/mcp";
/// Sessions kept at once; past this the least recently used one ends.
pub const MAX_SESSIONS: usize = 256;
const MAX_BODY: usize = 4 * 1024 * 1024;
/// What all the requests in flight may hold together, and what a request
/// reserves per byte of its body: the body, its parsed value (at most a few
/// times its size, see `Limits::max_values`) and the bytes forwarded. Past
/// it a request is answered 503 with Retry-After, before its body is read.
const IN_FLIGHT_BUDGET: usize = 40 * 1024 * 1024;
const EXPANSION: usize = 4;
/// Requests of at most this many bytes have a lane of their own (8 MiB of
/// the budget), so a burst of large ones never turns ordinary calls away.
const SMALL_REQUEST: usize = 64 * 1024;
const SMALL_LANE: usize = 8 * 1024 * 1024;
/// What a body of unknown length reserves to begin with; it grows as the
/// body comes.
const FIRST_CHUNK: usize = 64 * 1024;
/// How long a client may take to send a request's body.
const BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);
/// The agent listener's bounds by default: connections served at once (the
/// agent's own loopback; idle and slow ones are closed by the header
/// deadline), and that deadline.
pub fn default_limits() -> Limits {
    Limits {
        max_connections: 2048,
        ..Limits::default()
    }
}
/// Messages about one request queued for the agent, at most (past this,
/// notifications are dropped and relayed requests refused).
const MAX_QUEUED_EVENTS: usize = 256;

type Body = UnsyncBoxBody<Bytes, Infallible>;

struct State {
    gateway: Arc<Gateway>,
    /// Bodies of unknown length or over `SMALL_REQUEST` ...
    budget: Budget,
    /// ... and the small ones.
    small: Budget,
    sessions: Mutex<Sessions>,
    shutdown: CancellationToken,
}

/// Agent sessions, bounded.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, Session>,
    clock: u64,
}

struct Session {
    /// Last use, on the `Sessions` clock.
    used: u64,
    /// Cancelled when the session ends: its GET stream closes.
    ended: CancellationToken,
    /// Whether its GET stream is open (one at a time).
    streaming: bool,
}

impl Sessions {
    /// Marks a session used; false if it does not exist.
    fn touch(&mut self, id: &str) -> bool {
        self.clock += 1;
        match self.map.get_mut(id) {
            Some(session) => {
                session.used = self.clock;
                true
            }
            None => false,
        }
    }

    /// Adds a session; returns the one evicted to make room, if any.
    fn insert(&mut self, id: String) -> Option<String> {
        self.clock += 1;
        let evicted = (self.map.len() >= MAX_SESSIONS)
            .then(|| {
                self.map
                    .iter()
                    .min_by_key(|(_, s)| s.used)
                    .map(|(k, _)| k.clone())
            })
            .flatten();
        if let Some(old) = &evicted {
            self.remove(old);
        }
        let session = Session {
            used: self.clock,
            ended: CancellationToken::new(),
            streaming: false,
        };
        self.map.insert(id, session);
        evicted
    }

    fn remove(&mut self, id: &str) -> bool {
        self.map.remove(id).inspect(|s| s.ended.cancel()).is_some()
    }
}

/// Serves agents until `shutdown`; then stops accepting and lets requests in
/// flight finish (the caller bounds how long it waits on `tracker`).
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> std::io::Result<()> {
    let state = Arc::new(State {
        gateway,
        budget: Budget::new(IN_FLIGHT_BUDGET - SMALL_LANE),
        small: Budget::new(SMALL_LANE),
        sessions: Mutex::new(Sessions::default()),
        shutdown: shutdown.clone(),
    });
    accept_loop(listener, limits, shutdown, tracker, move |stream| {
        let state = state.clone();
        async move {
            let service = service_fn(move |req| route(state.clone(), req));
            let _ = http1(&limits)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    })
    .await;
    Ok(())
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if req.uri().path() != MCP_PATH {
        return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("\u{fffd}"))
    };
    if let Some(origin) = header("origin")
        && !is_loopback_origin(origin)
    {
        return Ok(text(StatusCode::FORBIDDEN, "origin not allowed\n"));
    }
    if !header("host").is_some_and(is_loopback_host_header) {
        return Ok(text(
            StatusCode::FORBIDDEN,
            "host not allowed: address this server as localhost or a loopback IP\n",
        ));
    }
    Ok(match *req.method() {
        Method::POST => post(&state, req).await,
        Method::DELETE => delete(&state, &req),
        Method::GET => listen(&state, &req),
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE\n"),
    })
}

async fn post(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
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
    let declared = header("content-length").and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return too_large();
    }
    let lane = match declared {
        Some(n) if n <= SMALL_REQUEST => &state.small,
        _ => &state.budget,
    };
    let Some(mut reserved) = lane.try_reserve(EXPANSION * declared.unwrap_or(FIRST_CHUNK)) else {
        return busy();
    };
    let reading = read_body(req.into_body(), lane, &mut reserved, declared);
    let body = match tokio::time::timeout(BODY_DEADLINE, reading).await {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => return too_large(),
        Ok(Err(BodyError::Busy)) => return busy(),
        Ok(Err(BodyError::Broken)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "the request body could not be read\n",
            );
        }
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time\n",
            );
        }
    };
    let message = match state.gateway.parse(&body) {
        Ok(m) => m,
        Err(refused) => return reply(state.gateway.refuse(&refused), sse),
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
    // Only requests that reach an upstream (or wait for a person) can have
    // anything to say before their response.
    let may_stream = matches!(
        message.method(),
        Some("tools/call" | "prompts/get" | "resources/read")
    );
    if may_stream && accepts && message.id().is_some() {
        return answer_live(state, message, session, sse, reserved).await;
    }
    let caller = Caller::new(session.clone());
    let outcome = state.gateway.handle_message(message, &caller).await;
    if is_initialize {
        let accepted = matches!(&outcome, Reply::Message(v) if v.get("result").is_some());
        if !accepted {
            return reply(outcome, sse); // initialize refused: no session
        }
        let evicted = lock(&state.sessions).insert(session.clone());
        if let Some(old) = evicted {
            state.gateway.end_session(&old);
        }
        let mut response = reply(outcome, sse);
        if let Ok(v) = HeaderValue::from_str(&session) {
            response.headers_mut().insert("mcp-session-id", v);
        }
        return response;
    }
    reply(outcome, sse)
}

enum BodyError {
    TooLarge,
    Busy,
    Broken,
}

/// Reads a request body of at most `MAX_BODY` bytes, growing `reserved`
/// as a body of unknown length comes (503 when the budget is spent).
async fn read_body(
    mut body: Incoming,
    budget: &Budget,
    reserved: &mut Reserved,
    declared: Option<usize>,
) -> Result<Bytes, BodyError> {
    let mut data = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY));
    let mut covered = declared.unwrap_or(FIRST_CHUNK);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Broken)?;
        let Ok(chunk) = frame.into_data() else {
            continue; // trailers
        };
        if data.len() + chunk.len() > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        data.extend_from_slice(&chunk);
        if data.len() > covered {
            let more = (data.len() - covered).max(FIRST_CHUNK);
            if !budget.try_grow(reserved, EXPANSION * more) {
                return Err(BodyError::Busy);
            }
            covered += more;
        }
    }
    Ok(Bytes::from(data))
}

fn too_large() -> Response<Body> {
    rpc(
        StatusCode::PAYLOAD_TOO_LARGE,
        &json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": codes::PARSE_ERROR, "message": format!("message is larger than {MAX_BODY} bytes")}}),
        false,
    )
}

/// Past the in-flight budget: come back in a moment.
fn busy() -> Response<Body> {
    let mut r = rpc(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": codes::INTERNAL_ERROR, "message": "the gateway is holding as many large requests as it may; retry in a second"}}),
        false,
    );
    r.headers_mut()
        .insert("retry-after", HeaderValue::from_static("1"));
    r
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

/// Handles a request of a client that accepts SSE so that messages about
/// it (progress, logging, a server's requests) reach the agent while it
/// runs. The answer is plain JSON when nothing came before it; otherwise it
/// is an SSE stream of those messages and then the response, and the
/// handling goes on inside the response body (dropped, with whatever it was
/// doing, if the agent hangs up).
async fn answer_live(
    state: &Arc<State>,
    message: aip_mcp::jsonrpc::Message,
    session: String,
    sse: bool,
    reserved: Reserved,
) -> Response<Body> {
    let (events, mut heard) = mpsc::channel(MAX_QUEUED_EVENTS);
    let caller = Caller {
        session,
        events: Some(events),
    };
    let gateway = state.gateway.clone();
    let mut handling: Handling = Box::pin(async move {
        // The request's memory is held as long as its handling.
        let _reserved = reserved;
        gateway.handle_message(message, &caller).await
    });
    let first = tokio::select! {
        biased;
        outcome = &mut handling => return reply(outcome, sse),
        first = heard.recv() => match first {
            Some(first) => first,
            // Nothing more can come; the response is still to come.
            None => return reply(handling.await, sse),
        },
    };
    let mut live = Live {
        queued: VecDeque::new(),
        heard,
        handling: Some(handling),
    };
    live.queued.push_back(event(&first));
    let mut r = Response::new(live.boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// A request being handled, movable into a response body.
type Handling = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// The SSE body of a request answered live: each message about it as it
/// comes, then its response (none if the agent cancelled it).
struct Live {
    queued: VecDeque<Bytes>,
    heard: mpsc::Receiver<Value>,
    handling: Option<Handling>,
}

impl hyper::body::Body for Live {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(bytes) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            let Some(handling) = this.handling.as_mut() else {
                return Poll::Ready(None);
            };
            if let Poll::Ready(Some(message)) = this.heard.poll_recv(cx) {
                this.queued.push_back(event(&message));
                continue;
            }
            let Poll::Ready(outcome) = handling.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            while let Ok(message) = this.heard.try_recv() {
                this.queued.push_back(event(&message));
            }
            if let Reply::Message(response) = outcome {
                this.queued.push_back(event(&response));
            }
            this.handling = None;
        }
    }
}

/// `GET /mcp`: the session's stream of messages that belong to no request:
/// `notifications/tools/list_changed` whenever the tools the agent may see
/// change. One stream per session (409 for a second); it ends with the
/// session or the gateway.
fn listen(state: &Arc<State>, req: &Request<Incoming>) -> Response<Body> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if !accepts_sse(header("accept")) {
        return text(
            StatusCode::NOT_ACCEPTABLE,
            "the stream is text/event-stream\n",
        );
    }
    let Some(id) = header("mcp-session-id") else {
        return text(StatusCode::BAD_REQUEST, "missing Mcp-Session-Id\n");
    };
    let ended = {
        let mut sessions = lock(&state.sessions);
        let Some(session) = sessions.map.get_mut(id) else {
            return text(StatusCode::NOT_FOUND, "unknown session\n");
        };
        if session.streaming {
            return text(
                StatusCode::CONFLICT,
                "this session already has a stream open\n",
            );
        }
        session.streaming = true;
        session.ended.clone()
    };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let mut changes = state.gateway.tools_changed();
    let (state, id) = (state.clone(), id.to_owned());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                () = ended.cancelled() => break,
                () = state.shutdown.cancelled() => break,
                () = tx.closed() => break,
            }
            let note = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
            if tx.send(event(&note)).await.is_err() {
                break;
            }
        }
        if let Some(session) = lock(&state.sessions).map.get_mut(&id) {
            session.streaming = false;
        }
    });
    let mut r = Response::new(Channel(rx).boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// A body made of what a channel carries, ending when its sender goes.
struct Channel(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|bytes| bytes.map(|b| Ok(Frame::data(b))))
    }
}

fn event(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

fn reply(outcome: Reply, sse: bool) -> Response<Body> {
    match outcome {
        Reply::Message(v) => rpc(StatusCode::OK, &v, sse),
        Reply::Nothing => empty(StatusCode::ACCEPTED),
    }
}

/// An Origin of a page served from this machine: `http(s)://` with a
/// loopback host (`localhost`, `127.0.0.0/8`, `[::1]`), any port, parsed as
/// a URL (so `http://localhost:80@evil.example` is evil.example's).
fn is_loopback_origin(origin: &str) -> bool {
    let Ok(uri) = origin.parse::<hyper::Uri>() else {
        return false;
    };
    let plain = matches!(uri.scheme_str(), Some("http" | "https"))
        && uri
            .path_and_query()
            .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    plain
        && uri
            .authority()
            .is_some_and(|a| !a.as_str().contains('@') && is_loopback_host(a.host()))
}

/// The Host header names this listener by a loopback name: a page on
/// another origin that rebinds its DNS name to 127.0.0.1 still sends its
/// own name, and is refused.
fn is_loopback_host_header(host: &str) -> bool {
    host.parse::<hyper::http::uri::Authority>()
        .is_ok_and(|a| !a.as_str().contains('@') && is_loopback_host(a.host()))
}

fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
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
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use super::{MAX_SESSIONS, Sessions, is_loopback_host_header, is_loopback_origin};

    #[test]
    fn sessions_are_bounded_and_the_least_recently_used_goes() {
        let mut s = Sessions::default();
        for i in 0..MAX_SESSIONS {
            assert_eq!(s.insert(format!("s{i}")), None);
        }
        assert!(s.touch("s0"), "s0 is now the most recently used");
        assert_eq!(s.insert("new".into()), Some("s1".into()));
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
            "http://localhost:80@evil.example",
            "http://127.0.0.1@evil.example",
            "http://evil.example#@localhost",
            "http://localhost/path",
        ] {
            assert!(!is_loopback_origin(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts_and_dns_rebinding() {
        for ok in [
            "localhost",
            "localhost:8808",
            "127.0.0.1:8808",
            "[::1]:8808",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host_header(ok), "{ok}");
        }
        for bad in [
            "evil.example:8808",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "user@localhost",
            "",
            "10.0.0.1:8808",
        ] {
            assert!(!is_loopback_host_header(bad), "{bad}");
        }
    }
}

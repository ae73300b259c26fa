//! The Streamable HTTP MCP server the agent talks to, on loopback, in both
//! eras on one endpoint. This is framing only: Origin and Host (403 for one
//! that is not loopback), the in-flight memory budget (503 past it, 413 for
//! a body over the limit), reading the body, then the gate's one entry,
//! `Gateway::handle`, with the request's headers; the gate decides the era,
//! the session and the status (gate/edge.rs), and this turns its answer
//! into HTTP: JSON, or SSE when the client accepts only SSE or once a
//! message about the request must reach the agent before its response;
//! the stream of a 2026-07-28 subscription; a legacy session's GET stream
//! and its DELETE. Failures of upstreams are never HTTP errors here: they
//! are JSON-RPC errors in a 200.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use aip_policy::codes;
use aip_service::budget::{Budget, Reserved};
use aip_service::lanes::{self, Spread};
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

use crate::gate::{Answer, Caller, Era, Gateway, Input, Listen, Reply, StreamRefused, Transport};

pub const MCP_PATH: &str = "/mcp";
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
/// The agent listener's bounds by default: connections served at once (the
/// agent's own loopback; idle and slow ones are closed by the header
/// deadline), and that deadline.
pub fn default_limits() -> Limits {
    Limits {
        max_connections: 2048,
        body_timeout: std::time::Duration::from_secs(30),
        ..Limits::default()
    }
}
/// How often an idle subscription stream gets a comment.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);
/// Messages about one request queued for the agent, at most (past this,
/// notifications are dropped and relayed requests refused).
const MAX_QUEUED_EVENTS: usize = 256;

type Body = UnsyncBoxBody<Bytes, Infallible>;

struct State {
    /// How long a request's body may take once its headers arrived.
    body_timeout: std::time::Duration,
    gateway: Arc<Gateway>,
    /// Bodies of unknown length or over `SMALL_REQUEST` ...
    budget: Budget,
    /// ... and the small ones.
    small: Budget,
    shutdown: CancellationToken,
}

/// Serves agents until `shutdown`, each connection on the least busy lane
/// (`aip_service::lanes`: the caller's runtime is lane 0, the others get a
/// thread each); then stops accepting and lets requests in flight finish
/// (the caller bounds how long it waits on `tracker`). The lanes run until
/// the returned value is dropped.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> std::io::Result<Arc<Spread>> {
    let state = Arc::new(State {
        gateway,
        budget: Budget::new(IN_FLIGHT_BUDGET - SMALL_LANE),
        small: Budget::new(SMALL_LANE),
        shutdown: shutdown.clone(),
        body_timeout: limits.body_timeout,
    });
    let serve_one: lanes::ServeFn = Arc::new(move |stream| {
        let state = state.clone();
        Box::pin(async move {
            let service = service_fn(move |req| route(state.clone(), req));
            let _ = http1(&limits)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        })
    });
    let spread = Arc::new(Spread::start(serve_one)?);
    let lanes = spread.clone();
    accept_loop(listener, limits, shutdown, tracker, move |stream| {
        lanes.dispatch(stream)
    })
    .await;
    Ok(spread)
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
    // The headers go to the gate with the body: a modern request's are
    // checked against it, a legacy one's name its session.
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let accept = header("accept");
    let (sse, accepts) = (wants_sse(accept), accepts_sse(accept));
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
    let reading = read_body(body, lane, &mut reserved, declared);
    let body = match tokio::time::timeout(state.body_timeout, reading).await {
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
    if accepts {
        return answer_live(state, body, headers, sse, reserved).await;
    }
    let caller = Caller {
        transport: Transport::Http(headers),
        events: None,
    };
    let answer = state.gateway.handle(Input::Bytes(body), caller).await;
    respond(answer, sse)
}

/// The gate's answer as HTTP: a JSON-RPC message with the status its era
/// gives it (a legacy one as SSE for a client that accepts only that), a
/// new session's id in its header, a subscription's stream.
fn respond(answer: Answer, sse: bool) -> Response<Body> {
    match answer {
        Answer::Reply {
            reply: Reply::Message(message),
            status,
            era,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            rpc(
                status,
                &message,
                sse && era == Era::Legacy && status == StatusCode::OK,
            )
        }
        Answer::Reply {
            reply: Reply::Text(text),
            era,
            ..
        } => rpc_text(text, sse && era == Era::Legacy),
        Answer::Reply {
            reply: Reply::Nothing,
            ..
        } => empty(StatusCode::ACCEPTED),
        Answer::Session { reply, session } => {
            let mut response = rpc(StatusCode::OK, &reply, sse);
            if let Ok(v) = HeaderValue::from_str(&session) {
                response.headers_mut().insert("mcp-session-id", v);
            }
            response
        }
        Answer::Listen(listen) => subscribe(listen),
        Answer::Plain { status, text: body } => text(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            body,
        ),
    }
}

/// A `subscriptions/listen` stream: its acknowledgement first, then each
/// notification as it comes (an SSE comment every `KEEPALIVE` so idle
/// proxies keep it open), and its closing result when the gateway stops.
fn subscribe(mut listen: Box<Listen>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let acknowledgement = listen.subscription.acknowledgement();
        if tx.send(event(&acknowledgement)).await.is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                next = listen.subscription.next() => next,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = listen.ended.cancelled() => return,
                () = tx.closed() => return,
            };
            let Some(note) = next else {
                let _ = tx.send(event(&listen.subscription.closing())).await;
                return;
            };
            if tx.send(event(&note)).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(Channel(rx).boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

enum BodyError {
    TooLarge,
    Busy,
    Broken,
}

/// Reads a request body of at most `MAX_BODY` bytes, growing `reserved`
/// as a body of unknown length comes (503 when the budget is spent). A
/// body that comes in one chunk, as most do, is kept as it came.
async fn read_body(
    mut body: Incoming,
    budget: &Budget,
    reserved: &mut Reserved,
    declared: Option<usize>,
) -> Result<Bytes, BodyError> {
    let mut first: Option<Bytes> = None;
    let mut data = Vec::new();
    let mut covered = declared.unwrap_or(FIRST_CHUNK);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Broken)?;
        let Ok(chunk) = frame.into_data() else {
            continue; // trailers
        };
        let len = first.as_ref().map_or(data.len(), Bytes::len) + chunk.len();
        if len > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        if len > covered {
            let more = (len - covered).max(FIRST_CHUNK);
            if !budget.try_grow(reserved, EXPANSION * more) {
                return Err(BodyError::Busy);
            }
            covered += more;
        }
        match first.take() {
            None if data.is_empty() => first = Some(chunk),
            None => data.extend_from_slice(&chunk),
            Some(earlier) => {
                data.reserve(declared.unwrap_or(0).clamp(len, MAX_BODY));
                data.extend_from_slice(&earlier);
                data.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(data)))
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
    // The body it refused to read is not read later either: closing the
    // connection tells a client still sending it to stop, instead of
    // leaving it blocked on a full socket.
    r.headers_mut()
        .insert("connection", HeaderValue::from_static("close"));
    r
}

fn delete(state: &State, req: &Request<Incoming>) -> Response<Body> {
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok());
    match session {
        Some(s) if state.gateway.end_session(s) => empty(StatusCode::NO_CONTENT),
        _ => text(StatusCode::NOT_FOUND, "unknown session\n"),
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
    body: Bytes,
    headers: hyper::HeaderMap,
    sse: bool,
    reserved: Reserved,
) -> Response<Body> {
    let (events, heard) = mpsc::channel(MAX_QUEUED_EVENTS);
    let caller = Caller {
        transport: Transport::Http(headers),
        events: Some(events),
    };
    let gateway = state.gateway.clone();
    let mut handling: Handling = Box::pin(async move {
        // The request's memory is held as long as its handling.
        let _reserved = reserved;
        gateway.handle(Input::Bytes(body), caller).await
    });
    let mut live = Live {
        queued: VecDeque::new(),
        heard,
        handling: None,
    };
    tokio::select! {
        biased;
        answer = &mut handling => {
            // What was sent just before the response goes out before it:
            // then the answer is a stream after all.
            let Ok(first) = live.heard.try_recv() else {
                return respond(answer, sse);
            };
            live.queued.push_back(event(&first));
            while let Ok(message) = live.heard.try_recv() {
                live.queued.push_back(event(&message));
            }
            live.queued.extend(final_event(answer));
        }
        first = live.heard.recv() => match first {
            Some(first) => {
                live.queued.push_back(event(&first));
                live.handling = Some(handling);
            }
            // Nothing more can come (the gate keeps the stream only for
            // requests that may stream); the response is still to come.
            None => return respond(handling.await, sse),
        },
    }
    let mut r = Response::new(live.boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// The response that ends a live stream (none when the call was cancelled).
fn final_event(answer: Answer) -> Option<Bytes> {
    match answer {
        Answer::Reply {
            reply: Reply::Message(response),
            ..
        } => Some(event(&response)),
        Answer::Reply {
            reply: Reply::Text(text),
            ..
        } => Some(event_text(&text)),
        _ => None,
    }
}

/// A request being handled, movable into a response body.
type Handling = Pin<Box<dyn Future<Output = Answer> + Send>>;

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
            this.queued.extend(final_event(outcome));
            this.handling = None;
        }
    }
}

/// `GET /mcp`: the session's stream of messages that belong to no request:
/// `notifications/tools/list_changed` whenever the tools the agent may see
/// change, and the session's notes (its servers' prompts and resources
/// list changes, updates of resources it subscribed to). One stream per session (409 for a second); it ends with the
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
    let (stream, mut notes) = match state.gateway.session_stream(id) {
        Ok(opened) => opened,
        Err(StreamRefused::UnknownSession) => {
            return text(StatusCode::NOT_FOUND, "unknown session\n");
        }
        Err(StreamRefused::AlreadyStreaming) => {
            return text(
                StatusCode::CONFLICT,
                "this session already has a stream open\n",
            );
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        loop {
            let note = tokio::select! {
                note = notes.next() => match note {
                    Some(note) => note,
                    None => break,
                },
                () = stream.ended.cancelled() => break,
                () = shutdown.cancelled() => break,
                () = tx.closed() => break,
            };
            if tx.send(event(&note)).await.is_err() {
                break;
            }
        }
        drop(stream); // the session may open its stream again
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

/// [`event`] for a message kept as JSON text.
fn event_text(text: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 32);
    out.extend_from_slice(b"event: message\ndata: ");
    push_one_line(&mut out, text);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// JSON text on one line, as an SSE `data:` field needs it: a line break
/// in valid JSON can only be white space between tokens (one inside a
/// string is escaped), so each becomes a space.
fn push_one_line(out: &mut Vec<u8>, text: &[u8]) {
    out.extend(text.iter().map(|&b| match b {
        b'\n' | b'\r' => b' ',
        b => b,
    }));
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
/// Whether a Host header names this machine: `localhost` or a loopback
/// address (an IPv6 one in brackets), with or without a port; read by hand,
/// as every request passes here.
fn is_loopback_host_header(host: &str) -> bool {
    let port_ok = |port: &str| {
        !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) => ip,
            Some((ip, after)) if after.strip_prefix(':').is_some_and(port_ok) => ip,
            _ => return false,
        },
        None => match host.split_once(':') {
            Some((name, port)) if port_ok(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    match host.starts_with('[') {
        true => name
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback()),
        false => is_loopback_host(name),
    }
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

/// A 200 whose body is a server's response kept as JSON text (as SSE for a
/// legacy client that accepts only that).
fn rpc_text(text: Bytes, sse: bool) -> Response<Body> {
    let (body, content_type) = if sse {
        let mut out = Vec::with_capacity(text.len() + 8);
        out.extend_from_slice(b"data: ");
        push_one_line(&mut out, &text);
        out.extend_from_slice(b"\n\n");
        (Bytes::from(out), "text/event-stream")
    } else {
        (text, "application/json")
    };
    let mut r = Response::new(Full::new(body).boxed_unsync());
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
    use super::{is_loopback_host_header, is_loopback_origin};

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
            "[::1]",
            "LOCALHOST",
            "127.0.0.2",
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
            "localhost:",
            "localhost:80:80",
            "localhost:8o",
            "[::1",
            "[::1]x",
            "::1",
            "[127.0.0.1]:80",
            "[localhost]",
            "127.0.0.1:123456",
        ] {
            assert!(!is_loopback_host_header(bad), "{bad}");
        }
    }
}

//! The Streamable HTTP MCP server the agent talks to, on loopback, in both
//! eras on one endpoint, chosen per request by its body: a request whose
//! `_meta` names a protocol version is 2026-07-28 ("modern": stateless, its
//! mirrored headers checked against its body before anything acts on
//! either, refusals as that revision has them: 400 with -32602, -32020 or
//! -32022, 404 with -32601); anything else is the legacy era: sessions
//! issued at initialize, a GET stream per session for
//! `notifications/tools/list_changed`, DELETE to end a session, 404 for an
//! unknown session. A response is JSON, or SSE when the client accepts only
//! SSE or once a message about the request must reach the agent before its
//! response. 403 for an Origin or Host that is not loopback. Failures of
//! upstreams are never HTTP errors here: they are JSON-RPC errors in a 200.

use aip_service::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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

use aip_mcp::modern::{self, Invalid};

use crate::gate::{AGENT_VERSIONS, Caller, Era, Gateway, Reply};

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
/// Subscriptions streamed at once, at most, and how often an idle one gets
/// a comment.
const MAX_LISTENERS: usize = 256;
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
    sessions: Mutex<Sessions>,
    listeners: Arc<tokio::sync::Semaphore>,
    shutdown: CancellationToken,
}

/// Agent sessions, bounded.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, Session, foldhash::fast::RandomState>,
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
        sessions: Mutex::new(Sessions::default()),
        listeners: Arc::new(tokio::sync::Semaphore::new(MAX_LISTENERS)),
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
    // The headers are kept, not cloned: a modern request's are checked
    // against its body once it is read.
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (session_header, version_header) =
        (header("mcp-session-id"), header("mcp-protocol-version"));
    let accept = header("accept");
    let (sse, accepts) = (wants_sse(accept), accepts_sse(accept));
    let modern_header = version_header.is_some_and(|v| !AGENT_VERSIONS.contains(&v));
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
    let message = match state.gateway.parse(&body) {
        Ok(m) => m,
        Err(refused) if modern_header => {
            let Reply::Message(refusal) = state.gateway.refuse(&refused) else {
                return empty(StatusCode::BAD_REQUEST);
            };
            return rpc(StatusCode::BAD_REQUEST, &refusal, false);
        }
        Err(refused) => return reply(state.gateway.refuse(&refused), sse),
    };
    if Era::of(&message.value) == Era::Modern {
        return modern_post(state, message, &headers, accepts, reserved).await;
    }
    if modern_header {
        // A version header the legacy era does not know, on a request that
        // claims no era in its body: refused as a modern request missing
        // its `_meta` (or, for initialize, as a header that contradicts it).
        let invalid = match message.method() {
            Some("initialize") => Invalid::Header(format!(
                "Header mismatch: MCP-Protocol-Version {:?} is not a version initialize negotiates",
                version_header.unwrap_or_default()
            )),
            _ => Invalid::Meta(format!(
                "params._meta must carry {} and {}",
                modern::META_VERSION,
                modern::META_CAPABILITIES
            )),
        };
        return refuse_modern(state, &invalid, message.id());
    }
    let is_initialize = message.method() == Some("initialize");
    let session = if is_initialize {
        format!("{:032x}", rand::random::<u128>())
    } else {
        match session_header {
            None => return text(StatusCode::BAD_REQUEST, "missing Mcp-Session-Id\n"),
            Some(s) if !lock(&state.sessions).touch(s) => {
                return text(StatusCode::NOT_FOUND, "unknown session\n");
            }
            Some(s) => s.to_owned(),
        }
    };
    // Only requests that reach an upstream (or wait for a person) can have
    // anything to say before their response.
    let may_stream = matches!(
        message.method(),
        Some("tools/call" | "prompts/get" | "resources/read")
    );
    if may_stream && accepts && message.id().is_some() {
        return answer_live(state, message, Caller::new(session), sse, reserved).await;
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

/// A 2026-07-28 request: checked as the revision says (then its annotated
/// arguments' headers, for a tools/call), served without a session, its
/// refusals with the revision's HTTP statuses. A notification is accepted
/// and dropped: the revision defines none a client sends over HTTP.
async fn modern_post(
    state: &Arc<State>,
    message: aip_mcp::jsonrpc::Message,
    headers: &hyper::HeaderMap,
    accepts: bool,
    reserved: Reserved,
) -> Response<Body> {
    if let Err(invalid) = modern::check_request(&message.value, Some(headers)) {
        return refuse_modern(state, &invalid, message.id());
    }
    if message.method() == Some("tools/call") {
        let params = message.params();
        let name = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let annotations = state.gateway.param_headers(name);
        let arguments = params.and_then(|p| p.get("arguments"));
        if let Err(invalid) = modern::check_param_headers(headers, &annotations, arguments) {
            return refuse_modern(state, &invalid, message.id());
        }
    }
    if message.id().is_none() {
        return empty(StatusCode::ACCEPTED);
    }
    if message.method() == Some("subscriptions/listen") {
        return subscribe(state, &message).await;
    }
    let caller = Caller {
        session: format!("m-{:032x}", rand::random::<u128>()),
        events: None,
        era: Era::Modern,
    };
    let may_stream = modern::MAY_REQUIRE_INPUT.contains(&message.method().unwrap_or_default());
    if may_stream && accepts {
        return answer_live(state, message, caller, false, reserved).await;
    }
    modern_reply(state.gateway.handle_message(message, &caller).await)
}

/// A `subscriptions/listen` stream: its acknowledgement first, then each
/// notification as it comes (an SSE comment every `KEEPALIVE` so idle
/// proxies keep it open), and its closing result when the gateway stops.
/// At most `MAX_LISTENERS` at once.
async fn subscribe(state: &Arc<State>, message: &aip_mcp::jsonrpc::Message) -> Response<Body> {
    let mut subscription = match state.gateway.listen(message).await {
        Ok(s) => s,
        Err(refused) => return modern_reply(refused),
    };
    let Ok(permit) = state.listeners.clone().try_acquire_owned() else {
        let busy = json!({"jsonrpc": "2.0", "id": message.id(),
            "error": {"code": codes::INTERNAL_ERROR,
                "message": format!("the gateway holds {MAX_LISTENERS} subscriptions already; retry later")}});
        return rpc(StatusCode::SERVICE_UNAVAILABLE, &busy, false);
    };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _permit = permit;
        if tx
            .send(event(&subscription.acknowledgement()))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let next = tokio::select! {
                next = subscription.next() => next,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = tx.closed() => return,
            };
            let Some(note) = next else {
                let _ = tx.send(event(&subscription.closing())).await;
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

/// Refuses a modern request before the pipeline, audited.
fn refuse_modern(state: &State, invalid: &Invalid, id: Option<&Value>) -> Response<Body> {
    let response = invalid.response(id);
    let reason = response["error"]["message"].as_str().unwrap_or_default();
    state.gateway.record_refusal(reason, id);
    let status = StatusCode::from_u16(invalid.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    rpc(status, &response, false)
}

/// A modern request's answer: a JSON-RPC error the revision gives an HTTP
/// status (-32601: 404; -32020, -32021, -32022: 400) carries it; any other
/// answer, and every error of a tool or a policy, is a 200.
fn modern_reply(outcome: Reply) -> Response<Body> {
    let Reply::Message(response) = outcome else {
        return empty(StatusCode::ACCEPTED);
    };
    let code = response.pointer("/error/code").and_then(Value::as_i64);
    let status = match code {
        Some(-32601) => StatusCode::NOT_FOUND,
        Some(
            modern::HEADER_MISMATCH | modern::MISSING_CAPABILITY | modern::UNSUPPORTED_VERSION,
        ) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    rpc(status, &response, false)
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
    mut caller: Caller,
    sse: bool,
    reserved: Reserved,
) -> Response<Body> {
    let (events, heard) = mpsc::channel(MAX_QUEUED_EVENTS);
    caller.events = Some(events);
    let era = caller.era;
    let gateway = state.gateway.clone();
    let mut handling: Handling = Box::pin(async move {
        // The request's memory is held as long as its handling.
        let _reserved = reserved;
        gateway.handle_message(message, &caller).await
    });
    let answer = |outcome| match era {
        Era::Modern => modern_reply(outcome),
        Era::Legacy => reply(outcome, sse),
    };
    let mut live = Live {
        queued: VecDeque::new(),
        heard,
        handling: None,
    };
    tokio::select! {
        biased;
        outcome = &mut handling => {
            // What was sent just before the response goes out before it:
            // then the answer is a stream after all.
            let Ok(first) = live.heard.try_recv() else {
                return answer(outcome);
            };
            live.queued.push_back(event(&first));
            while let Ok(message) = live.heard.try_recv() {
                live.queued.push_back(event(&message));
            }
            if let Reply::Message(response) = outcome {
                live.queued.push_back(event(&response));
            }
        }
        first = live.heard.recv() => match first {
            Some(first) => {
                live.queued.push_back(event(&first));
                live.handling = Some(handling);
            }
            // Nothing more can come; the response is still to come.
            None => return answer(handling.await),
        },
    }
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
    let mut notes = state.gateway.session_notes(id);
    let (state, id) = (state.clone(), id.to_owned());
    tokio::spawn(async move {
        loop {
            let note = tokio::select! {
                note = notes.next() => match note {
                    Some(note) => note,
                    None => break,
                },
                () = ended.cancelled() => break,
                () = state.shutdown.cancelled() => break,
                () = tx.closed() => break,
            };
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

//! Streamable HTTP transport: one MCP endpoint (`/mcp`) for both eras.
//! POST per client message, answered as JSON or SSE per the Accept header.
//! A modern (2026-07-28) request stands alone: no session, its envelope and
//! routing headers checked before dispatch, closing its response cancels it.
//! A legacy one lives in a session: `Mcp-Session-Id` issued at initialize;
//! GET resumes a stream closed by `sse_close_after_event` (Last-Event-ID);
//! DELETE ends a session. Beside it: `/healthz`, `/readyz`, `/metrics` and
//! `/_fault/attempts` (the attempt log as JSON lines).

use aip_service::sync::lock;
use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use aip_service::serve::{Limits, accept_loop, http1};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::{CallContext, CallKey, Core, Handled, Reply, Wire, error};
use crate::era::{self, Era, Eras, RoutingHeaders};
use crate::log::sha256_hex;

pub const MCP_PATH: &str = "/mcp";
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

type HttpBody = BoxBody<Bytes, Infallible>;

/// Returned by the service to make hyper close the connection unanswered.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted drop")
    }
}

impl std::error::Error for DropConnection {}

#[derive(Debug, Clone, Copy, Default)]
pub struct HttpOptions {
    /// Answer with SSE when the client accepts both JSON and SSE.
    pub prefer_sse: bool,
}

struct State {
    core: Arc<Core>,
    options: HttpOptions,
    /// Session id -> negotiated protocol version.
    sessions: Mutex<HashMap<String, String>>,
    /// Event id -> (session, response) for streams closed after priming.
    resumable: Mutex<HashMap<String, (String, Value)>>,
    /// Senders of stalled bodies, kept so the bodies never finish.
    stalled: Mutex<Vec<mpsc::Sender<Bytes>>>,
    /// Modern requests served so far: each is its own exchange
    /// (`modern-N` in the attempt log), so that request ids of different
    /// clients never collide.
    exchanges: AtomicU64,
    /// The issuer's keys (requireJwt), and when they were fetched.
    jwks: Mutex<Option<(std::time::Instant, jsonwebtoken::jwk::JwkSet)>>,
    shutdown: CancellationToken,
}

/// Runs `core` and serves it over HTTP on an ephemeral loopback port until
/// `shutdown`, as tests and benchmarks embed it; the MCP endpoint's URL.
pub async fn start_on_loopback(
    core: Arc<Core>,
    shutdown: CancellationToken,
) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(core.clone().run(shutdown.clone()));
    tokio::spawn(serve(core, listener, HttpOptions::default(), shutdown));
    Ok(url)
}

/// For tests: a server on a loopback port, until `shutdown`, whose one
/// tool `tool` answers `contents` (to 100 calls) to callers with a JWT of
/// `issuer` for `audience` (None: the server's own URL), signed by a key
/// at `jwks_url`. Its URL (`http://ADDR/mcp`) and its core, whose attempt
/// log shows every call and the hash of each token it was given.
pub async fn jwt_protected(
    issuer: &str,
    jwks_url: &str,
    audience: Option<&str>,
    tool: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<(String, Arc<Core>)> {
    use crate::log::AttemptLog;
    use crate::script::{Script, Transport};
    // The URL is the audience before the server can start: a port is
    // taken, then the server started on it.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let audience = audience.unwrap_or(&url);
    let answers = vec!["{return: contents}"; crate::script::MAX_STEPS].join(", ");
    let yaml = format!(
        "apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: files}}\nspec:\n  requireJwt: {{issuer: '{issuer}', audience: '{audience}', jwksUrl: '{jwks_url}'}}\n  tools:\n    - {{name: {tool}, responses: [{{sequence: [{answers}]}}]}}\n"
    );
    let core = Core::new(
        Script::from_yaml(&yaml, Transport::Http)?,
        AttemptLog::new(Box::new(std::io::sink()), true),
    );
    tokio::spawn(serve(
        core.clone(),
        listener,
        HttpOptions::default(),
        shutdown.clone(),
    ));
    tokio::spawn(core.clone().run(shutdown.clone()));
    Ok((url, core))
}

/// Serves HTTP on `listener` until `shutdown`.
pub async fn serve(
    core: Arc<Core>,
    listener: TcpListener,
    options: HttpOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state = Arc::new(State {
        core,
        options,
        sessions: Mutex::new(HashMap::new()),
        resumable: Mutex::new(HashMap::new()),
        stalled: Mutex::new(Vec::new()),
        exchanges: AtomicU64::new(0),
        jwks: Mutex::new(None),
        shutdown: shutdown.clone(),
    });
    let limits = Limits::default();
    accept_loop(
        listener,
        limits,
        shutdown,
        TaskTracker::new(),
        move |stream| {
            let state = state.clone();
            async move {
                let service = service_fn(move |req| route(state.clone(), req));
                let conn = http1(&limits).serve_connection(TokioIo::new(stream), service);
                let _ = conn.await; // a scripted drop ends here, as an error
            }
        },
    )
    .await;
    Ok(())
}

async fn route(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<HttpBody>, DropConnection> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET, "/healthz" | "/readyz") => Ok(text(StatusCode::OK, "ok\n")),
        (&Method::GET, PROTECTED_RESOURCE) if state.core.script.require_jwt.is_some() => {
            Ok(protected_resource(&state, &req))
        }
        (&Method::GET, "/metrics") => Ok(metrics(&state)),
        (&Method::GET, "/_fault/attempts") => {
            let mut body = state.core.log.lines().join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            Ok(with_type(Response::new(full(body)), "application/x-ndjson"))
        }
        (&Method::POST, MCP_PATH) => post(&state, req).await,
        (_, MCP_PATH) if state.core.script.era == Eras::Modern => {
            // 2026-07-28 has no GET stream and no sessions to DELETE.
            if let Some(denied) = check_bearer(&state, &req) {
                return Ok(denied);
            }
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
            r.headers_mut()
                .insert("allow", HeaderValue::from_static("POST"));
            Ok(r)
        }
        (&Method::GET, MCP_PATH) => Ok(get(&state, &req)),
        (&Method::DELETE, MCP_PATH) => Ok(delete(&state, &req)),
        (_, MCP_PATH) => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE\n");
            r.headers_mut()
                .insert("allow", HeaderValue::from_static("GET, POST, DELETE"));
            Ok(r)
        }
        _ => Ok(text(StatusCode::NOT_FOUND, "not found\n")),
    }
}

async fn post(state: &State, req: Request<Incoming>) -> Result<Response<HttpBody>, DropConnection> {
    if let Some(denied) = check_bearer(state, &req) {
        return Ok(denied);
    }
    let wants_sse = wants_sse(&req, state.options.prefer_sse);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (session_header, auth, protocol) = (
        header("mcp-session-id"),
        header("authorization"),
        header("mcp-protocol-version"),
    );
    let routing = RoutingHeaders::from_pairs(
        req.headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
    );
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(rpc(
                StatusCode::PAYLOAD_TOO_LARGE,
                &error(&Value::Null, -32600, "request body too large", None),
            ));
        }
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return Ok(rpc(
                StatusCode::BAD_REQUEST,
                &error(&Value::Null, -32700, &format!("Parse error: {e}"), None),
            ));
        }
    };
    if message.is_array() {
        return Ok(rpc(
            StatusCode::BAD_REQUEST,
            &error(
                &Value::Null,
                -32600,
                "Invalid Request: batches are not supported",
                None,
            ),
        ));
    }
    let eras = state.core.script.era;
    let request_era = match eras {
        Eras::Legacy => Era::Legacy,
        Eras::Both | Eras::Modern => era::classify(&message, routing.protocol_version.as_deref()),
    };
    if request_era == Era::Modern {
        let auth_sha256 = auth.as_deref().map(sha256_hex);
        return post_modern(state, &message, &routing, auth_sha256, wants_sse).await;
    }
    if eras == Eras::Modern {
        let refused = state
            .core
            .refuse_legacy(&message, routing.protocol_version.as_deref());
        return Ok(immediate(refused, wants_sse));
    }
    let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
    let session = if is_initialize {
        let requested = message
            .pointer("/params/protocolVersion")
            .and_then(Value::as_str);
        let id = format!("{:032x}", rand::random::<u128>());
        lock(&state.sessions).insert(id.clone(), Core::negotiate(requested).to_owned());
        id
    } else {
        match session_header {
            None => {
                return Ok(rpc(
                    StatusCode::BAD_REQUEST,
                    &error(&Value::Null, -32600, "missing Mcp-Session-Id header", None),
                ));
            }
            Some(s) if !lock(&state.sessions).contains_key(&s) => {
                return Ok(text(StatusCode::NOT_FOUND, "unknown session\n"));
            }
            Some(s) => s,
        }
    };
    let ctx = CallContext {
        session: session.clone(),
        auth_sha256: auth.as_deref().map(sha256_hex),
        protocol_version: protocol,
        ..CallContext::default()
    };
    let mut response = match state.core.handle(&message, &ctx) {
        Handled::Later(pending) => {
            let reply = tokio::select! {
                r = pending => r.unwrap_or(Reply::Canceled),
                () = state.shutdown.cancelled() => Reply::Canceled,
            };
            play(state, &session, reply, wants_sse, Era::Legacy)?
        }
        Handled::Delayed { delay_ms, reply } => {
            let reply = after(state, delay_ms, reply).await;
            play(state, &session, reply, wants_sse, Era::Legacy)?
        }
        other => immediate(other, wants_sse),
    };
    if is_initialize && let Ok(v) = HeaderValue::from_str(&session) {
        response.headers_mut().insert("mcp-session-id", v);
    }
    Ok(response)
}

/// A modern request: its own exchange, no session; closing the response
/// before the reply cancels the call (2026-07-28 cancellation).
async fn post_modern(
    state: &State,
    message: &Value,
    routing: &RoutingHeaders,
    auth_sha256: Option<String>,
    wants_sse: bool,
) -> Result<Response<HttpBody>, DropConnection> {
    let exchange = state.exchanges.fetch_add(1, Ordering::Relaxed) + 1;
    let ctx = CallContext {
        session: format!("modern-{exchange}"),
        auth_sha256,
        protocol_version: routing.protocol_version.clone(),
        ..CallContext::default()
    };
    match state.core.handle_modern(message, Some(routing), &ctx) {
        Handled::Later(pending) => {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            let guard = CancelOnDrop {
                core: state.core.clone(),
                key: Some(Core::call_key(&ctx.session, &id)),
            };
            let reply = tokio::select! {
                r = pending => r.unwrap_or(Reply::Canceled),
                () = state.shutdown.cancelled() => Reply::Canceled,
            };
            guard.disarm();
            play(state, &ctx.session, reply, wants_sse, Era::Modern)
        }
        Handled::Delayed { delay_ms, reply } => {
            let reply = after(state, delay_ms, reply).await;
            play(state, &ctx.session, reply, wants_sse, Era::Modern)
        }
        other => Ok(immediate(other, wants_sse)),
    }
}

/// `reply` after `delay_ms`, or nothing if the server stops first.
async fn after(state: &State, delay_ms: u64, reply: Reply) -> Reply {
    tokio::select! {
        () = tokio::time::sleep(std::time::Duration::from_millis(delay_ms)) => reply,
        () = state.shutdown.cancelled() => Reply::Canceled,
    }
}

/// Cancels a modern call whose response future is dropped: hyper drops it
/// when the client closes the connection.
struct CancelOnDrop {
    core: Arc<Core>,
    key: Option<CallKey>,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.key = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.core.cancel(&key);
        }
    }
}

/// An answer that needs no waiting: a response, an accepted notification,
/// or a refusal with its status (always JSON, so that every client can read
/// the error).
fn immediate(handled: Handled, wants_sse: bool) -> Response<HttpBody> {
    match handled {
        Handled::Now(None) => empty(StatusCode::ACCEPTED),
        Handled::Now(Some(reply)) => answer(&reply, wants_sse),
        Handled::Refused { status, response } => rpc(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            &response,
        ),
        // Queued and delayed answers are awaited by the callers themselves.
        Handled::Later(_) | Handled::Delayed { .. } => empty(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// Renders a tools/call reply on the wire.
fn play(
    state: &State,
    session: &str,
    reply: Reply,
    wants_sse: bool,
    era: Era,
) -> Result<Response<HttpBody>, DropConnection> {
    Ok(match reply {
        Reply::Message(v) => answer(&v, wants_sse),
        Reply::Canceled if wants_sse => sse_response(full(Bytes::new())),
        Reply::Canceled => empty(StatusCode::ACCEPTED),
        Reply::Refused { status, response } => rpc(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            &response,
        ),
        Reply::Wire(Wire::Drop) => return Err(DropConnection),
        Reply::Wire(Wire::Http {
            status,
            headers,
            body,
        }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = Response::new(full(body.unwrap_or_default()));
            *r.status_mut() = status;
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                    r.headers_mut().append(k, v);
                }
            }
            r
        }
        Reply::Wire(Wire::RawBody(text)) => {
            with_type(Response::new(full(text)), "application/json")
        }
        Reply::Wire(Wire::StallBody {
            after_bytes,
            response,
        }) => stall(state, &response, after_bytes),
        Reply::Wire(Wire::SseCloseAfterEvent { .. }) if era == Era::Modern => {
            // 2026-07-28 streams have no event ids and no resumption: the
            // stream opens and ends without the response.
            sse_response(full(": stream opened\n\n"))
        }
        Reply::Wire(Wire::SseCloseAfterEvent { retry_ms, response }) => {
            let event = format!("{:016x}", rand::random::<u64>());
            lock(&state.resumable).insert(event.clone(), (session.to_owned(), response));
            sse_response(full(format!("id: {event}\nretry: {retry_ms}\ndata: \n\n")))
        }
    })
}

/// Headers and the first `after_bytes` of the body, then nothing: the
/// declared Content-Length is never reached.
fn stall(state: &State, response: &Value, after_bytes: usize) -> Response<HttpBody> {
    let bytes = Bytes::from(response.to_string());
    let total = bytes.len();
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(bytes.slice(..after_bytes.min(total)));
    lock(&state.stalled).push(tx);
    let mut r = Response::new(ChannelBody(rx).boxed());
    r.headers_mut()
        .insert("content-length", HeaderValue::from(total));
    with_type(r, "application/json")
}

fn get(state: &State, req: &Request<Incoming>) -> Response<HttpBody> {
    if let Some(denied) = check_bearer(state, req) {
        return denied;
    }
    let Some(session) = known_session(state, req) else {
        return text(StatusCode::NOT_FOUND, "unknown or missing session\n");
    };
    let last = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok());
    let Some(last) = last else {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "no standalone stream; GET resumes with Last-Event-ID\n",
        );
        r.headers_mut()
            .insert("allow", HeaderValue::from_static("POST, DELETE"));
        return r;
    };
    let mut resumable = lock(&state.resumable);
    match resumable.get(last) {
        Some((owner, _)) if *owner == session => {
            let (_, response) = resumable.remove(last).expect("present");
            sse_response(full(format!("id: {last}-1\ndata: {response}\n\n")))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "no stream to resume for that Last-Event-ID\n",
        ),
    }
}

fn delete(state: &State, req: &Request<Incoming>) -> Response<HttpBody> {
    if let Some(denied) = check_bearer(state, req) {
        return denied;
    }
    match known_session(state, req) {
        Some(session) => {
            lock(&state.sessions).remove(&session);
            state.core.cancel_session(&session);
            empty(StatusCode::NO_CONTENT)
        }
        None => text(StatusCode::NOT_FOUND, "unknown or missing session\n"),
    }
}

fn known_session(state: &State, req: &Request<Incoming>) -> Option<String> {
    let s = req.headers().get("mcp-session-id")?.to_str().ok()?;
    lock(&state.sessions).contains_key(s).then(|| s.to_owned())
}

/// 401 with a Bearer challenge unless the token's SHA-256 matches.
fn check_bearer(state: &State, req: &Request<Incoming>) -> Option<Response<HttpBody>> {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let challenge = if let Some(jwt) = &state.core.script.require_jwt {
        let metadata = format!(
            "resource_metadata=\"http://{}{PROTECTED_RESOURCE}\"",
            host(req)
        );
        match presented.map(|token| verify_jwt(state, jwt, token)) {
            Some(Ok(())) => return None,
            Some(Err(why)) => {
                tracing::info!(reason = %why, "access token refused");
                format!("Bearer error=\"invalid_token\", {metadata}")
            }
            None => format!("Bearer {metadata}"),
        }
    } else {
        let expected = state.core.script.require_bearer.as_deref()?;
        match presented {
            Some(token) if sha256_hex(token) == expected => return None,
            Some(_) => "Bearer error=\"invalid_token\"".to_owned(),
            None => "Bearer".to_owned(),
        }
    };
    let mut r = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        r.headers_mut().insert("www-authenticate", v);
    }
    Some(r)
}

/// Where RFC 9728 protected resource metadata is served (requireJwt).
const PROTECTED_RESOURCE: &str = "/.well-known/oauth-protected-resource";

/// How often the issuer's keys may be fetched again for a token signed by
/// a key not among them.
const JWKS_REFETCH: std::time::Duration = std::time::Duration::from_secs(2);

fn host(req: &Request<Incoming>) -> String {
    req.headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost")
        .to_owned()
}

/// The resource this server is, and who issues its tokens.
fn protected_resource(state: &State, req: &Request<Incoming>) -> Response<HttpBody> {
    let jwt = state.core.script.require_jwt.as_ref();
    let body = serde_json::json!({
        "resource": format!("http://{}{MCP_PATH}", host(req)),
        "authorization_servers": jwt.map(|j| vec![j.issuer.clone()]).unwrap_or_default(),
        "bearer_methods_supported": ["header"],
    });
    with_type(Response::new(full(body.to_string())), "application/json")
}

/// Checks an access token: a key of the issuer's JWKS signed it (RS256 or
/// ES256), for `audience`, by `issuer`, not expired. The keys are fetched
/// when a token names one not yet seen (at most every [`JWKS_REFETCH`]).
fn verify_jwt(state: &State, jwt: &crate::script::RequireJwt, token: &str) -> Result<(), String> {
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
    let kid = header.kid.clone().ok_or("the token names no key (kid)")?;
    let key = {
        let mut jwks = lock(&state.jwks);
        let known = jwks.as_ref().and_then(|(_, set)| set.find(&kid).cloned());
        match known {
            Some(k) => k,
            None => {
                let stale = jwks
                    .as_ref()
                    .is_none_or(|(at, _)| at.elapsed() >= JWKS_REFETCH);
                if !stale {
                    return Err(format!("no key {kid} in the issuer's JWKS"));
                }
                let set = fetch_jwks(&jwt.jwks_url)?;
                let found = set.find(&kid).cloned();
                *jwks = Some((std::time::Instant::now(), set));
                found.ok_or_else(|| format!("no key {kid} in the issuer's JWKS"))?
            }
        }
    };
    let key = DecodingKey::from_jwk(&key).map_err(|e| format!("key {kid}: {e}"))?;
    let algorithm = match header.alg {
        a @ (Algorithm::RS256 | Algorithm::ES256 | Algorithm::PS256) => a,
        other => return Err(format!("algorithm {other:?} is not accepted")),
    };
    let mut validation = Validation::new(algorithm);
    validation.set_issuer(&[&jwt.issuer]);
    validation.set_audience(&[&jwt.audience]);
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The issuer's JWKS, fetched on a thread of its own (a test peer may run
/// on a current-thread runtime).
fn fetch_jwks(url: &str) -> Result<jsonwebtoken::jwk::JwkSet, String> {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let mut response = ureq::get(&url)
            .call()
            .map_err(|e| format!("cannot fetch the JWKS {url}: {e}"))?;
        response
            .body_mut()
            .with_config()
            .limit(256 * 1024)
            .read_json::<jsonwebtoken::jwk::JwkSet>()
            .map_err(|e| format!("the JWKS {url}: {e}"))
    })
    .join()
    .map_err(|_| "the JWKS fetch panicked".to_owned())?
}

fn wants_sse(req: &Request<Incoming>, prefer_sse: bool) -> bool {
    let accept = req
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let sse = accept.contains("text/event-stream");
    let json = accept.contains("application/json") || accept.contains("*/*") || accept.is_empty();
    sse && (prefer_sse || !json)
}

fn answer(message: &Value, sse: bool) -> Response<HttpBody> {
    if sse {
        sse_response(full(format!("data: {message}\n\n")))
    } else {
        rpc(StatusCode::OK, message)
    }
}

fn rpc(status: StatusCode, message: &Value) -> Response<HttpBody> {
    let mut r = with_type(Response::new(full(message.to_string())), "application/json");
    *r.status_mut() = status;
    r
}

fn sse_response(body: HttpBody) -> Response<HttpBody> {
    let mut r = with_type(Response::new(body), "text/event-stream");
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

fn metrics(state: &State) -> Response<HttpBody> {
    with_type(
        Response::new(full(state.core.log.metrics_text())),
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
    )
}

fn text(status: StatusCode, body: &'static str) -> Response<HttpBody> {
    let mut r = with_type(Response::new(full(body)), "text/plain; charset=utf-8");
    *r.status_mut() = status;
    r
}

fn empty(status: StatusCode) -> Response<HttpBody> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn with_type(mut r: Response<HttpBody>, content_type: &'static str) -> Response<HttpBody> {
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    r
}

fn full(body: impl Into<Bytes>) -> HttpBody {
    Full::new(body.into()).boxed()
}

/// A body fed by a channel; it ends only when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

//! A Streamable HTTP MCP client for one ToolConnection: the server's era
//! found by probing (`server/discover` first, `initialize` when the server
//! does not speak 2026-07-28) and remembered until a failure could mean it
//! changed; for a legacy server a cached session (initialized
//! single-flight), for a modern one no session but every request's `_meta`
//! and mirrored headers; requests answered as JSON or SSE, legacy SSE
//! streams resumed with Last-Event-ID, and every failure classified.
//!
//! It never follows redirects, never sends a tools/call twice, and sends only
//! the connection's own credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, watch};

use crate::connection::{Connection, Endpoint, Tls};
use crate::failure::{Failure, insufficient_scope};
use crate::jsonrpc::{self, Limits};
use crate::modern::{self, MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, ParamHeader};
use crate::protocol::{ACCEPTED_VERSIONS, Exchange, Outgoing, PROTOCOL_VERSION, Related};
use crate::sse;

/// How long a best-effort cancellation of an abandoned request may take.
const CANCEL_DEADLINE: Duration = Duration::from_millis(500);
/// How many tools/list pages a health check follows.
/// How many times one request may resume a closed SSE stream.
const MAX_RESUMES: usize = 16;

/// A live upstream session. A modern server has none: its "session" is
/// the era the probe found, with no id.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: Option<String>,
    pub protocol_version: String,
    generation: u64,
    pub modern: bool,
}

impl Session {
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

/// The standalone stream as `/connections` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// No session yet, or between reconnects.
    Closed,
    Open,
    /// The server offers none for the current session (e.g. 405).
    Unsupported,
}

pub struct HttpUpstream {
    connection: Arc<Connection>,
    uri: Uri,
    /// One per lane, each with its own pool, so a pooled connection is
    /// driven by the lane whose requests use it (`aip_service::lanes`).
    clients: Vec<Client<HttpsConnector<HttpConnector>, Full<Bytes>>>,
    /// Access tokens, for a connection that gets them from an
    /// authorization server (`Connection::oauth`).
    tokens: Option<crate::oauth::TokenSource>,
    session: Mutex<Option<Session>>,
    /// The era the last probe found (true: 2026-07-28), until a failure
    /// says to probe again.
    era: std::sync::Mutex<Option<bool>>,
    /// The `x-mcp-header` annotations of each tool, from the last listing
    /// of a modern server.
    annotations: std::sync::Mutex<std::collections::HashMap<String, Vec<ParamHeader>>>,
    /// What the server last said it offers (initialize or server/discover).
    capabilities: std::sync::Mutex<Value>,
    /// The `_meta` members last written for a modern server, and what
    /// decided them.
    written_meta: std::sync::Mutex<Option<(MetaKey, Arc<modern::WrittenMeta>)>>,
    generation: AtomicU64,
    next_id: AtomicU64,
    /// The generation of each session initialized, for the listener.
    pub(super) sessions: watch::Sender<u64>,
    /// Signalled when the server says its tool list changed.
    list_changed: Notify,
    /// What the server says outside any call that agents may hear: its
    /// prompts or resources changed, a resource was updated.
    pub(super) notes: tokio::sync::broadcast::Sender<Value>,
    pub(super) stream_state: watch::Sender<StreamState>,
    /// The resources agents want updates of: the listener keeps the
    /// server's subscriptions in step with it.
    pub(super) watched: watch::Sender<std::collections::BTreeSet<String>>,
    /// The server's tasks agents want `notifications/tasks` of (a modern
    /// server's: its listen stream asks for them).
    pub(super) watched_tasks: watch::Sender<std::collections::BTreeSet<String>>,
}

impl HttpUpstream {
    pub fn new(connection: Arc<Connection>) -> Result<HttpUpstream, String> {
        let Endpoint::Http { url } = &connection.endpoint else {
            return Err(format!(
                "connection {} is not an HTTP connection",
                connection.name
            ));
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("connection {}: bad url: {e}", connection.name))?;
        let clients = (0..aip_service::lanes::count())
            .map(|_| Ok(Client::builder(TokioExecutor::new()).build(connector(&connection)?)))
            .collect::<Result<_, String>>()?;
        let tokens = connection
            .oauth
            .clone()
            .map(crate::oauth::TokenSource::new)
            .transpose()?;
        Ok(HttpUpstream {
            connection,
            uri,
            clients,
            tokens,
            session: Mutex::new(None),
            era: std::sync::Mutex::new(None),
            annotations: std::sync::Mutex::default(),
            capabilities: std::sync::Mutex::new(json!({})),
            written_meta: std::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            sessions: watch::Sender::new(0),
            list_changed: Notify::new(),
            notes: tokio::sync::broadcast::Sender::new(64),
            stream_state: watch::Sender::new(StreamState::Closed),
            watched: watch::Sender::new(std::collections::BTreeSet::new()),
            watched_tasks: watch::Sender::new(std::collections::BTreeSet::new()),
        })
    }

    /// The pool of the lane this request runs on.
    fn client(&self) -> &Client<HttpsConnector<HttpConnector>, Full<Bytes>> {
        &self.clients[aip_service::lanes::current() % self.clients.len()]
    }

    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    pub fn list_changed(&self) -> &Notify {
        &self.list_changed
    }

    /// Hears what the server says outside any call that agents may hear
    /// (see `notes`); a receiver that falls behind loses the oldest.
    pub fn notes(&self) -> tokio::sync::broadcast::Receiver<Value> {
        self.notes.subscribe()
    }

    /// The resources agents want `notifications/resources/updated` of:
    /// the listener subscribes the server to them (and unsubscribes it
    /// from those no longer wanted), and their updates go to `notes`.
    pub fn watch_resources(&self, uris: std::collections::BTreeSet<String>) {
        replace_if_changed(&self.watched, uris);
    }

    /// The server's tasks (its ids) agents want `notifications/tasks` of:
    /// a modern server's listen stream is opened again to ask for them.
    pub fn watch_tasks(&self, ids: std::collections::BTreeSet<String>) {
        replace_if_changed(&self.watched_tasks, ids);
    }

    /// The session's standalone stream (see `listen`), as it changes.
    pub fn stream_state(&self) -> watch::Receiver<StreamState> {
        self.stream_state.subscribe()
    }

    /// Sends one request (it must carry an id) and returns its response.
    /// The connection's timeout covers handshake, call and body. The request
    /// is sent at most once, whatever happens.
    pub async fn request(
        &self,
        message: impl Into<Outgoing<'_>>,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        let outgoing = message.into();
        let message = outgoing.message;
        let mut used: Option<Session> = None;
        let outcome = tokio::time::timeout(self.connection.timeout, async {
            let session = self.session().await?;
            used = Some(session.clone());
            self.exchange(&session, outgoing, related).await
        })
        .await
        .unwrap_or(Err(Failure::Timeout));
        if let (Err(Failure::Timeout), Some(session), Some(id)) =
            (&outcome, &used, message.get("id"))
            && !session.modern
        {
            // A modern server learns of it from the closed stream.
            self.cancel_abandoned(session, id).await;
        }
        if let (Err(failure), Some(session)) = (&outcome, &used) {
            let stale_session = *failure == Failure::HttpStatus(404) && session.id.is_some();
            if failure.session_effect() == crate::failure::SessionEffect::Discard || stale_session {
                self.discard(session).await;
            }
        }
        outcome
    }

    /// Tells the upstream that a request it may still be running was given
    /// up (MCP: the sender of a timed-out request should cancel it). Best
    /// effort, bounded, on the session that carried the request.
    async fn cancel_abandoned(&self, session: &Session, id: &Value) {
        let cancel = json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the gateway's deadline passed"}
        });
        let _ = tokio::time::timeout(CANCEL_DEADLINE, self.post(Some(session), &cancel)).await;
    }

    /// Sends a notification (no response expected). A modern server takes
    /// none over HTTP (cancelling is closing the stream), so none is sent.
    pub async fn notify(&self, message: &Value) -> Result<(), Failure> {
        tokio::time::timeout(self.connection.timeout, async {
            let session = self.session().await?;
            if session.modern {
                return Ok(());
            }
            let response = self.post(Some(&session), message).await?;
            match response.status() {
                s if s.is_success() => Ok(()),
                s => Err(status_failure(s, response.headers())),
            }
        })
        .await
        .unwrap_or(Err(Failure::Timeout))
    }

    /// A health check within the connection's health deadline: for a
    /// legacy server a fresh initialize, notifications/initialized and
    /// tools/list (the session it makes becomes the cached one); for a
    /// modern one the tools/list alone. Returns the tools listed; a modern
    /// server's tools whose `x-mcp-header` annotations are invalid are left
    /// out, as the revision requires of a client.
    pub async fn health_check(&self) -> Result<Vec<Value>, Failure> {
        let checked = tokio::time::timeout(self.connection.health_deadline, async {
            // A modern server's "session" is only its era: kept, so that
            // its listen stream is not reopened with every check.
            let kept = self.cached_session().await.filter(|s| s.modern);
            let session = match kept {
                Some(session) => session,
                None => {
                    let session = self.establish().await?;
                    self.cache(&mut *self.session.lock().await, &session);
                    session
                }
            };
            // Follow nextCursor: a paginated catalog is listed whole.
            let tools = crate::protocol::list_all_tools(|mut list| {
                list["id"] = json!(self.fresh_id("list"));
                let session = &session;
                async move { self.exchange(session, &list, None).await }
            })
            .await
            .map_err(check_failure)?;
            Ok(if session.modern {
                self.adopt_annotations(tools)
            } else {
                tools
            })
        })
        .await
        .unwrap_or(Err(Failure::Timeout));
        if checked.is_err() {
            // Whatever failed may mean the server changed eras.
            match self.cached_session().await.filter(|s| s.modern) {
                Some(session) => self.discard(&session).await,
                None => self.forget_era(),
            }
        }
        checked
    }

    /// Remembers each tool's `x-mcp-header` annotations and drops the
    /// tools whose annotations are invalid (logged).
    fn adopt_annotations(&self, tools: Vec<Value>) -> Vec<Value> {
        let mut annotations = std::collections::HashMap::new();
        let mut kept = Vec::with_capacity(tools.len());
        for tool in tools {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
            match modern::param_headers(schema) {
                Ok(found) => {
                    if !found.is_empty() {
                        annotations.insert(name.to_owned(), found);
                    }
                    kept.push(tool);
                }
                Err(why) => {
                    tracing::warn!(connection = %self.connection.name, tool = name, why, "a tool with an invalid x-mcp-header annotation is left out");
                }
            }
        }
        *aip_service::sync::lock(&self.annotations) = annotations;
        kept
    }

    /// The capabilities the server last declared.
    pub fn server_capabilities(&self) -> Value {
        aip_service::sync::lock(&self.capabilities).clone()
    }

    fn adopt_capabilities(&self, result: Option<&Value>) {
        if let Some(c) = result
            .and_then(|r| r.get("capabilities"))
            .filter(|c| c.is_object())
        {
            *aip_service::sync::lock(&self.capabilities) = c.clone();
        }
    }

    /// Whether the server was last found to speak 2026-07-28.
    pub fn modern(&self) -> Option<bool> {
        *aip_service::sync::lock(&self.era)
    }

    /// Whether `message` goes to the server with the tasks extension
    /// declared: the agent declared it and the server announced it.
    pub fn offers_tasks(&self, message: &Value) -> bool {
        // What the server offers first: it is a lookup in a small object,
        // and most servers offer no tasks.
        self.modern() == Some(true)
            && self.server_offers(&["extensions", modern::TASKS_EXTENSION])
            && modern::claims_modern(message)
            && modern::declares_tasks(message)
    }

    /// Whether the capabilities the server last declared have `path`,
    /// present and not `false`; read in place: this is asked on every call.
    pub fn server_offers(&self, path: &[&str]) -> bool {
        let capabilities = aip_service::sync::lock(&self.capabilities);
        let found = path.iter().try_fold(&*capabilities, |at, key| at.get(*key));
        found.is_some_and(|v| v.as_bool() != Some(false))
    }

    fn forget_era(&self) {
        *aip_service::sync::lock(&self.era) = None;
    }

    /// The cached session, initializing one if there is none. The lock is
    /// held while initializing, so concurrent callers wait for one handshake.
    pub async fn session(&self) -> Result<Session, Failure> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let fresh = self.establish().await?;
        self.cache(&mut slot, &fresh);
        Ok(fresh)
    }

    /// A session in the server's era: probed when it is not known (a
    /// legacy handshake that fails makes the next attempt probe again).
    async fn establish(&self) -> Result<Session, Failure> {
        let known = self.modern();
        let modern = match known {
            Some(era) => era,
            None => self.probe().await?,
        };
        if modern {
            return Ok(Session {
                id: None,
                protocol_version: modern::VERSION.to_owned(),
                generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
                modern: true,
            });
        }
        let session = self.initialize().await;
        if session.is_err() {
            self.forget_era();
        }
        session
    }

    /// Asks the server which era it speaks, as the revision has dual-era
    /// clients do: a `server/discover` answered with a result listing
    /// 2026-07-28 means modern; 401/403, a 5xx, a network failure or a
    /// timeout say nothing about the era and fail the attempt; any other
    /// answer (a 4xx, a JSON-RPC error, a result without 2026-07-28) means
    /// legacy.
    async fn probe(&self) -> Result<bool, Failure> {
        let discover = json!({"jsonrpc": "2.0", "id": self.fresh_id("discover"),
            "method": "server/discover", "params": {}});
        let probe = Session {
            id: None,
            protocol_version: modern::VERSION.to_owned(),
            generation: 0,
            modern: true,
        };
        let modern = match self.exchange(&probe, &discover, None).await {
            Ok(x) => {
                let modern = x
                    .response()
                    .pointer("/result/supportedVersions")
                    .and_then(Value::as_array)
                    .is_some_and(|v| v.iter().any(|v| v == modern::VERSION));
                if modern {
                    self.adopt_capabilities(x.response().get("result"));
                }
                modern
            }
            Err(Failure::HttpStatus(s)) if (400..500).contains(&s) => false,
            Err(Failure::Malformed(_)) => false,
            Err(failure) => return Err(init_failure(failure)),
        };
        tracing::debug!(connection = %self.connection.name, modern, "probed the server's era");
        *aip_service::sync::lock(&self.era) = Some(modern);
        Ok(modern)
    }

    /// Makes `session` the cached one and tells the listener.
    fn cache(&self, slot: &mut Option<Session>, session: &Session) {
        *slot = Some(session.clone());
        self.sessions.send_replace(session.generation);
    }

    /// The cached session, if there is one; never initializes.
    pub(super) async fn cached_session(&self) -> Option<Session> {
        self.session.lock().await.clone()
    }

    /// Ends the cached session with DELETE, as a client that no longer
    /// needs it should; a server that refuses (e.g. 405) is left alone.
    pub async fn close(&self) {
        let Some(Session {
            id: Some(id),
            protocol_version,
            modern: false,
            ..
        }) = self.session.lock().await.take()
        else {
            return;
        };
        let request = Request::builder()
            .method(Method::DELETE)
            .uri(self.uri.clone())
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", protocol_version);
        let Ok(request) = self.with_credentials(request) else {
            return;
        };
        let Ok(request) = request.body(Full::new(Bytes::new())) else {
            return;
        };
        let sent = tokio::time::timeout(self.connection.timeout, self.send(request));
        if let Ok(Err(e)) = sent.await {
            tracing::debug!(connection = %self.connection.name, error = %e.reason(), "session DELETE failed");
        }
    }

    /// Drops `session` if it is still the cached one (a newer one is kept);
    /// the era is probed again with the next session.
    pub async fn discard(&self, session: &Session) {
        let mut slot = self.session.lock().await;
        if slot
            .as_ref()
            .is_some_and(|s| s.generation == session.generation)
        {
            *slot = None;
            self.forget_era();
        }
    }

    async fn initialize(&self) -> Result<Session, Failure> {
        let capabilities = crate::protocol::client_capabilities(&self.connection);
        let init = json!({
            "jsonrpc": "2.0", "id": self.fresh_id("init"), "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": capabilities,
                "clientInfo": {"name": "aip-sidecar", "version": env!("CARGO_PKG_VERSION")},
            }
        });
        let bootstrap = Session {
            id: None,
            protocol_version: PROTOCOL_VERSION.to_owned(),
            generation: 0,
            modern: false,
        };
        let exchange = self
            .exchange(&bootstrap, &init, None)
            .await
            .map_err(init_failure)?;
        let session_id = exchange.session_id.clone();
        let result = exchange.response().get("result").ok_or_else(|| {
            init_failure(Failure::Malformed(
                "initialize was answered with an error".into(),
            ))
        })?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !ACCEPTED_VERSIONS.contains(&version) {
            return Err(init_failure(Failure::Malformed(format!(
                "unsupported protocol version {version:?}"
            ))));
        }
        self.adopt_capabilities(Some(result));
        let session = Session {
            id: session_id,
            protocol_version: version.to_owned(),
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            modern: false,
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let response = self
            .post(Some(&session), &initialized)
            .await
            .map_err(init_failure)?;
        if !response.status().is_success() {
            return Err(init_failure(status_failure(
                response.status(),
                response.headers(),
            )));
        }
        Ok(session)
    }

    pub(super) fn fresh_id(&self, kind: &str) -> String {
        format!(
            "aip-{kind}-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// One POST and its response (JSON, or SSE read until the matching id,
    /// resuming closed streams).
    pub(super) async fn exchange(
        &self,
        session: &Session,
        message: impl Into<Outgoing<'_>>,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        let outgoing = message.into();
        let id = outgoing.message.get("id").cloned().unwrap_or(Value::Null);
        let response = self
            .post(
                Some(session).filter(|s| s.generation != 0 || s.modern),
                outgoing,
            )
            .await?;
        let status = response.status();
        if session.modern && status.is_client_error() && !matches!(status.as_u16(), 401 | 403) {
            // A modern server refuses with a JSON-RPC error in a 4xx body
            // (-32601 in a 404, -32602 or -32021 in a 400): the refusal is
            // the server's answer, not a failure of the connection.
            let mut budget = self.connection.max_response_bytes;
            let limit = self.connection.max_response_bytes;
            let body = read_limited(response, &mut budget, limit).await?;
            return match parse_response(&body, &id, limit) {
                Ok(refusal) if refusal.get("error").is_some() => Ok(Exchange::new(refusal, None)),
                _ => Err(Failure::HttpStatus(status.as_u16())),
            };
        }
        if !status.is_success() {
            return Err(status_failure(status, response.headers()));
        }
        let session_id = header_text(response.headers(), MCP_SESSION_ID)
            .map(str::to_owned)
            .or_else(|| session.id.clone());
        let streamed = header_text(response.headers(), CONTENT_TYPE)
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let mut budget = self.connection.max_response_bytes;
        let response = if streamed {
            self.read_sse(
                response,
                &id,
                session_id.as_deref(),
                &session.protocol_version,
                &mut budget,
                related,
            )
            .await?
        } else {
            let body =
                read_limited(response, &mut budget, self.connection.max_response_bytes).await?;
            let parsed = parse_response(&body, &id, self.connection.max_response_bytes)?;
            return Ok(Exchange::parsed(parsed, body, session_id));
        };
        Ok(Exchange::new(response, session_id))
    }

    async fn read_sse(
        &self,
        mut response: Response<Incoming>,
        id: &Value,
        session_id: Option<&str>,
        protocol_version: &str,
        budget: &mut usize,
        related: Option<&Related>,
    ) -> Result<Value, Failure> {
        let limit = self.connection.max_response_bytes;
        let mut parser = sse::Parser::default();
        let mut retry = Duration::from_millis(1000);
        for _ in 0..=MAX_RESUMES {
            loop {
                let frame = match response.body_mut().frame().await {
                    None => break,
                    Some(Err(e)) => return Err(Failure::Network(e.to_string())),
                    Some(Ok(frame)) => frame,
                };
                let Some(chunk) = frame.data_ref() else {
                    continue;
                };
                *budget = budget
                    .checked_sub(chunk.len())
                    .ok_or(Failure::TooLarge { limit })?;
                for event in parser.push(chunk) {
                    if let Some(ms) = event.retry_ms {
                        retry = Duration::from_millis(ms);
                    }
                    if event.data.trim().is_empty() {
                        continue; // a priming event
                    }
                    let message = jsonrpc::parse_value(
                        event.data.as_bytes(),
                        Limits {
                            max_bytes: limit,
                            max_depth: 64,
                        },
                    )
                    .map_err(|e| Failure::Malformed(e.to_string()))?;
                    if message.get("id") == Some(id) && message.get("method").is_none() {
                        return check_response(message);
                    }
                    if message.get("method").and_then(Value::as_str)
                        == Some(crate::protocol::TOOLS_LIST_CHANGED)
                    {
                        self.list_changed.notify_one();
                        continue;
                    }
                    if let Some(related) = related {
                        let _ = related.send(message);
                    }
                }
            }
            // The stream closed without our response. With an event id that
            // is polling, not failure: resume after the server's retry (a
            // legacy server's: the modern revision has no resuming).
            let last = parser
                .last_id()
                .filter(|_| protocol_version != modern::VERSION);
            let Some(last) = last.map(str::to_owned) else {
                return Err(Failure::Network(
                    "the stream closed before any event id".into(),
                ));
            };
            tokio::time::sleep(retry).await;
            response = self.resume(session_id, protocol_version, &last).await?;
        }
        Err(Failure::Network(format!(
            "the stream was resumed {MAX_RESUMES} times without a response"
        )))
    }

    async fn resume(
        &self,
        session_id: Option<&str>,
        protocol_version: &str,
        last_event_id: &str,
    ) -> Result<Response<Incoming>, Failure> {
        let response = self
            .get_stream(session_id, protocol_version, Some(last_event_id))
            .await?;
        if !response.status().is_success() {
            // A resume that fails counts as the network failing.
            return Err(match response.status() {
                StatusCode::UNAUTHORIZED => Failure::AuthFailed,
                s => Failure::Network(format!("resume refused with HTTP {}", s.as_u16())),
            });
        }
        Ok(response)
    }

    /// A GET for an event stream: a resumed response stream (with
    /// `Last-Event-ID`) or the session's standalone stream.
    pub(super) async fn get_stream(
        &self,
        session_id: Option<&str>,
        protocol_version: &str,
        last_event_id: Option<&str>,
    ) -> Result<Response<Incoming>, Failure> {
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(self.uri.clone())
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", protocol_version);
        if let Some(last) = last_event_id {
            request = request.header("last-event-id", last);
        }
        if let Some(s) = session_id {
            request = request.header("mcp-session-id", s);
        }
        let request = self.with_credentials(request)?;
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| Failure::Network(e.to_string()))?;
        self.send(request).await
    }

    pub(super) async fn post(
        &self,
        session: Option<&Session>,
        message: impl Into<Outgoing<'_>>,
    ) -> Result<Response<Incoming>, Failure> {
        let Outgoing {
            message,
            text,
            meta_at,
        } = message.into();
        // Every call passes here: the headers go into one map with names
        // known in advance, not through a builder that parses each name.
        let mut headers = HeaderMap::with_capacity(8);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let body = match session {
            Some(s) if s.modern => {
                let meta = self.modern_meta(message, &mut headers)?;
                match text.and_then(|text| modern::meta_spliced(text, meta_at, &meta)) {
                    Some(spliced) => {
                        debug_assert_says(&spliced, || {
                            modern::with_meta(message, meta.members.clone())
                        });
                        spliced
                    }
                    None => serde_json::to_vec(&modern::with_meta(message, meta.members.clone()))
                        .unwrap_or_default(),
                }
            }
            Some(_) if modern::claims_modern(message) => {
                serde_json::to_vec(&without_modern_meta(message)).unwrap_or_default()
            }
            _ => match text {
                Some(text) => {
                    debug_assert_says(text, || message.clone());
                    text.to_vec()
                }
                None => serde_json::to_vec(message).unwrap_or_default(),
            },
        };
        if let Some(s) = session {
            if let Some(id) = &s.id {
                headers.insert(MCP_SESSION_ID, header_value(id)?);
            }
            headers.insert(MCP_PROTOCOL_VERSION, header_value(&s.protocol_version)?);
        }
        self.add_credentials(&mut headers)?;
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = headers;
        self.send(request).await
    }

    /// Sends `request` on this lane's pool, with an access token when the
    /// connection gets them from an authorization server. A 401 to a token
    /// drops it and the request goes again once with a new one: the server
    /// refused the token before acting on the request (RFC 6750 §3.1), so
    /// nothing is done twice; a second 401 stands.
    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, Failure> {
        let network = |e: hyper_util::client::legacy::Error| Failure::Network(network_text(&e));
        let Some(tokens) = &self.tokens else {
            return self.client().request(request).await.map_err(network);
        };
        let (parts, body) = request.into_parts();
        let with = |token: &crate::oauth::Token| {
            let mut r = Request::new(body.clone());
            *r.method_mut() = parts.method.clone();
            *r.uri_mut() = parts.uri.clone();
            *r.headers_mut() = parts.headers.clone();
            r.headers_mut()
                .insert(hyper::header::AUTHORIZATION, token.header().clone());
            r
        };
        let token = tokens.bearer().await.map_err(Failure::TokenUnavailable)?;
        let response = self.client().request(with(&token)).await.map_err(network)?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        tokens.refused(&token);
        let fresh = tokens.bearer().await.map_err(Failure::TokenUnavailable)?;
        if Arc::ptr_eq(&fresh, &token) {
            return Ok(response);
        }
        drop(response);
        self.client().request(with(&fresh)).await.map_err(network)
    }

    /// Redacts the access tokens this connection was given (see
    /// `TokenSource::redact`); how many were found.
    pub fn redact_tokens(&self, value: &mut Value) -> usize {
        self.tokens.as_ref().map_or(0, |t| t.redact(value))
    }

    /// The token requests made so far (tests and benchmarks count them).
    pub async fn token_requests(&self) -> u64 {
        match &self.tokens {
            Some(t) => t.requests().await,
            None => 0,
        }
    }

    /// What a modern server expects in a request's `_meta`: the version,
    /// the gateway as the client, and the client capabilities the request
    /// declared that the connection offers (for a legacy agent's, those the
    /// connection offers); the headers mirroring its method, name and
    /// annotated arguments go into `headers`. The members are written once
    /// for as long as what decides them stays the same (an agent declares
    /// the same capabilities call after call).
    fn modern_meta(
        &self,
        message: &Value,
        headers: &mut HeaderMap,
    ) -> Result<Arc<modern::WrittenMeta>, Failure> {
        let declared = match modern::claims_modern(message) {
            true => Some(
                modern::meta(message)
                    .and_then(|m| m.get(modern::META_CAPABILITIES))
                    .filter(|c| c.is_object()),
            ),
            false => None,
        };
        let tasks = self.offers_tasks(message);
        let meta = {
            let mut cache = aip_service::sync::lock(&self.written_meta);
            match &*cache {
                Some((key, meta))
                    if key.tasks == tasks
                        && key.declared.as_ref().map(|d| d.as_ref()) == declared =>
                {
                    meta.clone()
                }
                _ => {
                    let meta =
                        Arc::new(self.write_meta(declared.flatten(), declared.is_some(), tasks));
                    let key = MetaKey {
                        declared: declared.map(|d| d.cloned()),
                        tasks,
                    };
                    *cache = Some((key, meta.clone()));
                    meta
                }
            }
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if message.get("id").is_some() {
            headers.insert(MCP_METHOD, header_value(method)?);
        }
        let params = message.get("params");
        if let Some(source) = modern::name_source(method)
            && let Some(name) = params.and_then(|p| p.get(source)).and_then(Value::as_str)
        {
            headers.insert(MCP_NAME, header_value(&modern::encode_value(name))?);
            if method == "tools/call" {
                let annotations = aip_service::sync::lock(&self.annotations);
                if let Some(found) = annotations.get(name) {
                    let arguments = params.and_then(|p| p.get("arguments"));
                    for (name, value) in modern::param_header_values(found, arguments) {
                        let name = hyper::header::HeaderName::from_bytes(name.as_bytes())
                            .map_err(|e| Failure::Network(e.to_string()))?;
                        headers.append(name, header_value(&value)?);
                    }
                }
            }
        }
        Ok(meta)
    }

    /// The `_meta` members for a request that declared `declared` (an
    /// agent of the 2026-07-28 era: `modern`) with the tasks extension
    /// relayed or not.
    fn write_meta(
        &self,
        declared: Option<&Value>,
        modern: bool,
        tasks: bool,
    ) -> modern::WrittenMeta {
        let offered = crate::protocol::client_capabilities(&self.connection);
        // A legacy agent's request: the gateway answers the server's input
        // requests itself by asking the agent in its era, so it offers what
        // the connection offers.
        let declared = match modern {
            true => declared,
            false => Some(&offered),
        };
        let mut capabilities: serde_json::Map<String, Value> = declared
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| offered.get(k.as_str()).is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // Of the extensions, only tasks: the gateway relays those (and
        // nothing of an extension it does not know).
        if tasks {
            capabilities.insert("extensions".into(), json!({(modern::TASKS_EXTENSION): {}}));
        }
        modern::WrittenMeta::new(vec![
            (modern::META_VERSION, json!(modern::VERSION)),
            (modern::META_CAPABILITIES, Value::Object(capabilities)),
            (
                modern::META_CLIENT_INFO,
                json!({"name": "aip-sidecar", "version": env!("CARGO_PKG_VERSION")}),
            ),
        ])
    }

    /// Adds the connection's own credential headers (marked sensitive).
    fn with_credentials(
        &self,
        mut request: hyper::http::request::Builder,
    ) -> Result<hyper::http::request::Builder, Failure> {
        if let Some(headers) = request.headers_mut() {
            self.add_credentials(headers)?;
        }
        Ok(request)
    }

    fn add_credentials(&self, headers: &mut HeaderMap) -> Result<(), Failure> {
        let credentials = self
            .connection
            .credentials
            .as_ref()
            .map_err(|e| Failure::CredentialsMissing(e.clone()))?;
        for (name, value) in credentials {
            let name = hyper::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Failure::CredentialsMissing("a credential header name is not valid".into())
            })?;
            headers.append(name, sensitive(value)?);
        }
        Ok(())
    }
}

/// Sends `value` when it differs from what `sender` holds (the listener
/// reopens its stream only on a real change).
fn replace_if_changed<T: PartialEq>(sender: &watch::Sender<T>, value: T) {
    sender.send_if_modified(|held| {
        let changed = *held != value;
        *held = value;
        changed
    });
}

/// http:// or https:// (rustls: the connection's CA bundle or the built-in
/// web roots, its server name or the URL's host), without Nagle's delay for
/// small JSON-RPC messages.
fn connector(connection: &Connection) -> Result<HttpsConnector<HttpConnector>, String> {
    connector_for(&connection.name, &connection.tls)
}

/// The same for any server named `name` (in errors), verified as `tls`
/// says (an authorization server's token endpoint, say).
pub(crate) fn connector_for(
    name: &str,
    tls: &Tls,
) -> Result<HttpsConnector<HttpConnector>, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match &tls.ca_pem {
        None => builder.with_webpki_roots(),
        Some(pem) => {
            use rustls_pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| format!("connection {}: bad CA PEM: {e}", name))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("connection {}: bad CA certificate: {e}", name))?;
            }
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("connection {}: {e}", name))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            builder.with_tls_config(config)
        }
    };
    let builder = builder.https_or_http();
    let builder = match &tls.server_name {
        None => builder,
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|e| format!("connection {}: server name: {e}", name))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
    };
    Ok(builder.enable_http1().wrap_connector(http))
}

/// What decided the `_meta` members last written: the capabilities the
/// agent declared (None for a legacy agent, Some(None) for a modern one
/// that declared none) and whether tasks are relayed.
struct MetaKey {
    declared: Option<Option<Value>>,
    tasks: bool,
}

const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");

/// A header value the gateway writes from text it holds (an id, a method,
/// an encoded name); the error is the one the request builder gave.
fn header_value(text: &str) -> Result<HeaderValue, Failure> {
    HeaderValue::from_str(text).map_err(|e| Failure::Network(e.to_string()))
}

fn sensitive(value: &SecretString) -> Result<HeaderValue, Failure> {
    let mut v = HeaderValue::from_str(value.expose_secret()).map_err(|_| {
        Failure::CredentialsMissing("a credential is not a valid header value".into())
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// hyper's error chain, without anything that could echo a header.
pub(crate) fn network_text(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A header's value as text, when it is visible ASCII (names known in
/// advance are passed as constants: a `&str` name is parsed at each call).
fn header_text(headers: &HeaderMap, name: impl hyper::header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn status_failure(status: StatusCode, headers: &HeaderMap) -> Failure {
    match status {
        StatusCode::UNAUTHORIZED => Failure::AuthFailed,
        StatusCode::FORBIDDEN => Failure::Forbidden {
            scope: header_text(headers, hyper::header::WWW_AUTHENTICATE)
                .and_then(insufficient_scope),
        },
        s => Failure::HttpStatus(s.as_u16()),
    }
}

/// Failures of a health check's tools/list: a 401 or 403 there is credential
/// evidence, as at initialize (no tool is named, so there is nothing to
/// gate: the credential does not let the gateway see the catalog at all).
fn check_failure(failure: Failure) -> Failure {
    match failure {
        Failure::AuthFailed => Failure::CheckAuthFailed(401),
        Failure::Forbidden { .. } => Failure::CheckAuthFailed(403),
        other => other,
    }
}

/// Failures while initializing: 401/403 are credential evidence.
fn init_failure(failure: Failure) -> Failure {
    match failure {
        Failure::AuthFailed => Failure::InitAuthFailed(401),
        Failure::Forbidden { .. } => Failure::InitAuthFailed(403),
        Failure::CredentialsMissing(e) => Failure::CredentialsMissing(e),
        Failure::TokenUnavailable(e) => Failure::TokenUnavailable(e),
        Failure::InitFailed(inner) => Failure::InitFailed(inner),
        other => Failure::InitFailed(Box::new(other)),
    }
}

async fn read_limited(
    mut response: Response<Incoming>,
    budget: &mut usize,
    limit: usize,
) -> Result<Bytes, Failure> {
    let declared = header_text(response.headers(), hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Failure::TooLarge { limit });
    }
    // A body that comes in one frame (most do) is kept as it came; more
    // frames are gathered into one buffer.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    while let Some(frame) = response.body_mut().frame().await {
        let frame = frame.map_err(|e| Failure::Network(e.to_string()))?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        *budget = budget
            .checked_sub(chunk.len())
            .ok_or(Failure::TooLarge { limit })?;
        match &first {
            None if more.is_empty() => first = Some(chunk),
            _ => {
                if let Some(first) = first.take() {
                    more.reserve(declared.unwrap_or(0).max(first.len() + chunk.len()));
                    more.extend_from_slice(&first);
                }
                more.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

fn parse_response(body: &[u8], id: &Value, limit: usize) -> Result<Value, Failure> {
    let message = jsonrpc::parse_value(
        body,
        Limits {
            max_bytes: limit,
            max_depth: 64,
        },
    )
    .map_err(|e| Failure::Malformed(e.to_string()))?;
    if message.get("id") != Some(id) {
        return Err(Failure::Malformed(
            "no response with the request's id".into(),
        ));
    }
    check_response(message)
}

/// A response must carry exactly one of result (an object) and error.
fn check_response(message: Value) -> Result<Value, Failure> {
    match (message.get("result"), message.get("error")) {
        (Some(Value::Object(_)), None) => Ok(message),
        (None, Some(Value::Object(e))) if e.get("code").is_some_and(Value::is_i64) => Ok(message),
        _ => Err(Failure::Malformed(
            "the response has no valid result or error".into(),
        )),
    }
}

/// A modern agent's request as a legacy server gets it: without the keys of
/// `_meta` the modern revision reserves for itself.
/// In a debug build (every test), that `text`, which goes instead of
/// `message` written out, says exactly what it says.
fn debug_assert_says(text: &[u8], message: impl FnOnce() -> Value) {
    if cfg!(debug_assertions) {
        let said: Value = serde_json::from_slice(text).expect("a spliced request is JSON");
        assert_eq!(
            said,
            message(),
            "a spliced request says what its message says"
        );
    }
}

fn without_modern_meta(message: &Value) -> Value {
    let mut request = message.clone();
    if let Some(Value::Object(meta)) = request.get_mut("params").and_then(|p| p.get_mut("_meta")) {
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    }
    request
}

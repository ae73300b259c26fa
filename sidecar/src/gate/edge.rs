//! The agent edge, one for both transports: what a message must be before
//! the pipeline reads it, and what it is to the transport after. The
//! transports frame messages (HTTP bodies, stdio lines) and hand each one
//! here through `Gateway::handle`; the edge parses it strictly, decides its
//! era once (by what its body claims), applies that era's rules — for
//! 2026-07-28 the revision's checks of body and mirrored headers, and for
//! a `tools/call` its arguments' `x-mcp-header`s; for the legacy era the
//! session an `initialize` opens and every later request names — decides
//! whether the request may stream, registers it for cancellation, runs the
//! pipeline around it, and gives the transport an [`Answer`] with the HTTP
//! status its era gives it.
//!
//! It owns what lives between messages at the edge: the legacy sessions
//! (at most [`MAX_SESSIONS`], the least recently used one ending first),
//! the requests in flight by session and id, and the open 2026-07-28
//! subscriptions (at most [`MAX_LISTENS`], [`MAX_LISTENS_PER_SESSION`] per
//! session, each under its own id).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use aip_mcp::jsonrpc::{self, Limits, Message, Refusal, Refused};
use aip_mcp::modern::{self, Invalid};
use aip_policy::{Evaluator, codes};
use aip_service::sync::lock;
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::call::{Call, Caller, Era, Input, Reply, Transport};
use super::catalog::{Lookup, Routes};
use super::connections::Connections;
use super::present::AGENT_VERSIONS;
use super::subscriptions::Subscription;
use crate::audit::{Audit, refusal_line};

/// Legacy sessions kept at once; past this the least recently used one ends.
pub const MAX_SESSIONS: usize = 256;
/// 2026-07-28 subscriptions open at once, at most, and per session.
pub const MAX_LISTENS: usize = 256;
pub const MAX_LISTENS_PER_SESSION: usize = 16;
/// The session of the one agent on stdio.
pub const STDIO_SESSION: &str = "stdio";

/// What the transport sends back for one message.
#[derive(Debug)]
pub enum Answer {
    /// A JSON-RPC message (or nothing), with the HTTP status its era gives
    /// it: 200; 202 for nothing; a 2026-07-28 refusal's own (400, 404); 503
    /// when the gateway has no room. A legacy reply may go as SSE.
    Reply { reply: Reply, status: u16, era: Era },
    /// An `initialize` opened a legacy session: its reply, and the id.
    Session { reply: Value, session: String },
    /// A 2026-07-28 subscription, to stream until it ends (boxed: rare,
    /// and large).
    Listen(Box<Listen>),
    /// Refused as HTTP, before the pipeline: the legacy session the request
    /// names is missing or unknown.
    Plain { status: u16, text: &'static str },
}

/// What the pipeline made of a call.
pub(super) enum Handled {
    Reply(Reply),
    Listen(Box<Subscription>),
}

/// An open `subscriptions/listen`: its notifications, and what ends it
/// early (the agent's `notifications/cancelled` naming it on stdio, or the
/// end of its session). Its place is given back when it is dropped.
pub struct Listen {
    pub subscription: Subscription,
    pub ended: CancellationToken,
    _slot: Slot,
}

impl std::fmt::Debug for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listen").finish_non_exhaustive()
    }
}

/// A legacy session's standalone stream: its place (one stream per
/// session) is given back when this is dropped.
pub struct SessionStream {
    /// Cancelled when the session ends.
    pub ended: CancellationToken,
    sessions: Arc<Mutex<Sessions>>,
    session: String,
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        if let Some(session) = lock(&self.sessions).map.get_mut(&self.session) {
            session.streaming = false;
        }
    }
}

/// Why a session's stream cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefused {
    UnknownSession,
    AlreadyStreaming,
}

/// What the edge reads of the gateway's state for one message.
pub(super) struct Sources<'a> {
    pub routes: &'a Routes,
    pub connections: &'a Connections,
    pub evaluator: Arc<Evaluator>,
}

/// What the gateway must do after a message: end a session the edge
/// evicted to make room for a new one.
pub(super) struct Served {
    pub answer: Answer,
    pub evicted: Option<String>,
}

pub(super) struct Edge {
    limits: Limits,
    sessions: Arc<Mutex<Sessions>>,
    calls: InFlight,
    listens: Arc<Mutex<Listens>>,
    audit: Arc<Audit>,
    refused: Counter,
}

/// A message the edge let through, before the pipeline.
struct Admitted {
    message: Message,
    era: Era,
    session: String,
    /// The request's session is opened by it (a legacy `initialize`).
    opens: bool,
    stream: bool,
    lookup: Lookup,
    slot: Option<Slot>,
}

impl Edge {
    pub(super) fn new(limits: Limits, audit: Arc<Audit>, refused: Counter) -> Edge {
        Edge {
            limits,
            sessions: Arc::default(),
            calls: InFlight::default(),
            listens: Arc::default(),
            audit,
            refused,
        }
    }

    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    /// One message from the agent: admitted, handled by `pipeline`, and
    /// answered as its era and transport have it.
    pub(super) async fn serve<F, Fut>(
        &self,
        input: Input,
        caller: Caller,
        sources: Sources<'_>,
        pipeline: F,
    ) -> Served
    where
        F: FnOnce(Call, Message) -> Fut,
        Fut: Future<Output = Handled>,
    {
        let Caller { transport, events } = caller;
        let admitted = match self.admit(input, &transport, &sources) {
            Ok(admitted) => admitted,
            Err(answer) => {
                return Served {
                    answer,
                    evicted: None,
                };
            }
        };
        let Admitted { message, era, .. } = admitted;
        let (tracked, cancel) = self.calls.track(&admitted.session, message.id());
        let call = Call {
            session: admitted.session,
            events: events.filter(|_| admitted.stream),
            era,
            evaluator: sources.evaluator,
            cancel,
            route: admitted.lookup.route,
            known: admitted.lookup.known,
            withheld: admitted.lookup.withheld,
            text_replies: matches!(transport, Transport::Http(_)),
        };
        let session = admitted.opens.then(|| call.session.clone());
        // Boxed: the pipeline's future is large, and this one stays small
        // for the transports that hold it.
        let handled = Box::pin(pipeline(call, message)).await;
        drop(tracked);
        let reply = match handled {
            Handled::Listen(subscription) => {
                let answer = match admitted.slot {
                    Some(slot) => Answer::Listen(Box::new(Listen {
                        subscription: *subscription,
                        ended: slot.ended.clone(),
                        _slot: slot,
                    })),
                    None => answer(Reply::Nothing, era),
                };
                return Served {
                    answer,
                    evicted: None,
                };
            }
            Handled::Reply(reply) => reply,
        };
        match (session, reply) {
            (Some(session), Reply::Message(reply)) if reply.get("result").is_some() => {
                let evicted = lock(&self.sessions).insert(session.clone());
                Served {
                    answer: Answer::Session { reply, session },
                    evicted,
                }
            }
            (_, reply) => Served {
                answer: answer(reply, era),
                evicted: None,
            },
        }
    }

    /// The edge's checks, in order: strict parsing; the era; the
    /// revision's rules (2026-07-28) or the session (legacy); then what the
    /// call needs on its way.
    fn admit(
        &self,
        input: Input,
        transport: &Transport,
        sources: &Sources<'_>,
    ) -> Result<Admitted, Answer> {
        let headers = match transport {
            Transport::Http(headers) => Some(headers),
            Transport::Stdio => None,
        };
        let version = headers
            .and_then(|h| h.get(modern::MCP_PROTOCOL_VERSION))
            .and_then(|v| v.to_str().ok());
        // A version header the legacy era does not know: the request is a
        // 2026-07-28 one whatever its body says, refused as one.
        let modern_header = version.is_some_and(|v| !AGENT_VERSIONS.contains(&v));
        let parsed = match input {
            Input::Bytes(bytes) => jsonrpc::parse_bytes(bytes, self.limits),
            Input::TooLong { size } => Err(Refused {
                refusal: Refusal::TooLarge {
                    size,
                    limit: self.limits.max_bytes,
                },
                id: None,
            }),
        };
        let message = match parsed {
            Ok(message) => message,
            Err(refused) => {
                self.record_refusal(&refused.refusal.to_string(), refused.id.as_ref());
                let (status, era) = match modern_header {
                    true => (400, Era::Modern),
                    false => (200, Era::Legacy),
                };
                let reply = Reply::Message(refused.response());
                return Err(Answer::Reply { reply, status, era });
            }
        };
        let era = era_of(&message.value);
        let session = match era {
            Era::Modern => self.modern(&message, transport)?,
            Era::Legacy if modern_header => {
                // Refused as a 2026-07-28 request missing its `_meta` (or,
                // for initialize, as a header that contradicts it).
                let invalid = match message.method() {
                    Some("initialize") => Invalid::Header(format!(
                        "Header mismatch: MCP-Protocol-Version {:?} is not a version initialize negotiates",
                        version.unwrap_or_default()
                    )),
                    _ => Invalid::Meta(format!(
                        "params._meta must carry {} and {}",
                        modern::META_VERSION,
                        modern::META_CAPABILITIES
                    )),
                };
                return Err(self.refuse(&invalid, &message, transport));
            }
            Era::Legacy => self.legacy_session(&message, transport)?,
        };
        let lookup = match (message.method(), message.params()) {
            (Some("tools/call"), params) => {
                let name = params
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let catalog = sources.routes.catalog(sources.connections);
                let pinned = sources.evaluator.schema_hash(name);
                catalog.lookup(name, headers.is_some() && era == Era::Modern, pinned)
            }
            _ => Lookup::default(),
        };
        if let (Era::Modern, Some(headers)) = (era, headers)
            && message.method() == Some("tools/call")
        {
            let arguments = message.params().and_then(|p| p.get("arguments"));
            if let Err(invalid) =
                modern::check_param_headers(headers, &lookup.param_headers, arguments)
            {
                return Err(self.refuse(&invalid, &message, transport));
            }
        }
        if era == Era::Modern && headers.is_some() && message.id().is_none() {
            // The revision defines no notification a client sends over HTTP.
            return Err(answer(Reply::Nothing, Era::Modern));
        }
        let slot = match (era, message.method(), message.id()) {
            (Era::Modern, Some("subscriptions/listen"), Some(id)) => {
                Some(self.listen_slot(&session, id, transport)?)
            }
            _ => None,
        };
        let stream = match transport {
            // stdout is always there for an agent on stdio.
            Transport::Stdio => true,
            // Only requests that reach an upstream (or wait for a person)
            // can have anything to say before their response.
            Transport::Http(_) => {
                message.id().is_some()
                    && modern::MAY_REQUIRE_INPUT.contains(&message.method().unwrap_or_default())
            }
        };
        let opens = era == Era::Legacy && message.method() == Some("initialize");
        Ok(Admitted {
            message,
            era,
            session,
            opens,
            stream,
            lookup,
            slot,
        })
    }

    /// A 2026-07-28 message: checked as the revision says (with its
    /// mirrored headers over HTTP); its session (each request over HTTP is
    /// its own). On stdio, a notification cancelling an open subscription
    /// ends it.
    fn modern(&self, message: &Message, transport: &Transport) -> Result<String, Answer> {
        let headers = match transport {
            Transport::Http(headers) => Some(headers),
            Transport::Stdio => None,
        };
        if let Err(invalid) = modern::check_request(&message.value, headers) {
            return Err(self.refuse(&invalid, message, transport));
        }
        if headers.is_none() {
            if let Some(listen) = self.cancelled_listen(message) {
                listen.cancel();
                return Err(answer(Reply::Nothing, Era::Modern));
            }
            return Ok(STDIO_SESSION.to_owned());
        }
        Ok(random_id("m-"))
    }

    /// A legacy message's session: stdio's one; over HTTP, a new one for
    /// `initialize` (kept once it succeeds), else the one its
    /// `Mcp-Session-Id` names, which must exist.
    fn legacy_session(&self, message: &Message, transport: &Transport) -> Result<String, Answer> {
        let Transport::Http(headers) = transport else {
            return Ok(STDIO_SESSION.to_owned());
        };
        if message.method() == Some("initialize") {
            return Ok(random_id(""));
        }
        let named = headers.get("mcp-session-id").and_then(|v| v.to_str().ok());
        match named {
            None => Err(Answer::Plain {
                status: 400,
                text: "missing Mcp-Session-Id\n",
            }),
            Some(s) if !lock(&self.sessions).touch(s) => Err(Answer::Plain {
                status: 404,
                text: "unknown session\n",
            }),
            Some(s) => Ok(s.to_owned()),
        }
    }

    /// The stdio subscription a `notifications/cancelled` names, taken out.
    fn cancelled_listen(&self, message: &Message) -> Option<CancellationToken> {
        if message.method() != Some("notifications/cancelled") {
            return None;
        }
        let id = message.params()?.get("requestId")?;
        let key = (STDIO_SESSION.to_owned(), id.to_string());
        lock(&self.listens).open.remove(&key)
    }

    /// A place for a subscription, or the answer saying there is none.
    fn listen_slot(
        &self,
        session: &str,
        id: &Value,
        transport: &Transport,
    ) -> Result<Slot, Answer> {
        let key = (session.to_owned(), id.to_string());
        let mut listens = lock(&self.listens);
        let of_session = listens.open.keys().filter(|k| k.0 == session).count();
        let why = if listens.open.len() >= MAX_LISTENS {
            format!("the gateway holds {MAX_LISTENS} subscriptions already; retry later")
        } else if of_session >= MAX_LISTENS_PER_SESSION || listens.open.contains_key(&key) {
            format!(
                "at most {MAX_LISTENS_PER_SESSION} subscriptions at once, each under its own id"
            )
        } else {
            let ended = CancellationToken::new();
            listens.open.insert(key.clone(), ended.clone());
            return Ok(Slot {
                listens: self.listens.clone(),
                key,
                ended,
            });
        };
        let busy = json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": codes::INTERNAL_ERROR, "message": why}});
        let status = match transport {
            Transport::Http(_) => 503,
            Transport::Stdio => 200,
        };
        Err(Answer::Reply {
            reply: Reply::Message(busy),
            status,
            era: Era::Modern,
        })
    }

    /// Refuses a message that breaks the 2026-07-28 rules, audited: with
    /// the revision's HTTP status; on stdio a notification gets nothing.
    fn refuse(&self, invalid: &Invalid, message: &Message, transport: &Transport) -> Answer {
        let response = invalid.response(message.id());
        let reason = response["error"]["message"].as_str().unwrap_or_default();
        self.record_refusal(reason, message.id());
        let reply = match (transport, message.id()) {
            (Transport::Stdio, None) => Reply::Nothing,
            _ => Reply::Message(response),
        };
        Answer::Reply {
            reply,
            status: invalid.http_status(),
            era: Era::Modern,
        }
    }

    /// Counts and audits a refused message.
    pub(super) fn record_refusal(&self, reason: &str, id: Option<&Value>) {
        self.refused.inc();
        self.audit.record(&refusal_line(reason, id));
    }

    /// Cancels the request `id` of `session`.
    pub(super) fn cancel(&self, session: &str, id: &Value) {
        self.calls.cancel(session, id);
    }

    /// Closes the legacy `session` (its stream ends); whether it was open.
    pub(super) fn close_session(&self, session: &str) -> bool {
        lock(&self.sessions).remove(session)
    }

    /// Cancels what `session` has in flight at the edge: its requests and
    /// its subscriptions.
    pub(super) fn cancel_session(&self, session: &str) {
        self.calls.end_session(session);
        self.end_listens(session);
    }

    /// Ends `session`'s subscriptions (the agent stopped sending).
    pub(super) fn end_listens(&self, session: &str) {
        lock(&self.listens).open.retain(|key, ended| {
            let ours = key.0 == session;
            if ours {
                ended.cancel();
            }
            !ours
        });
    }

    /// Opens `session`'s standalone stream (one at a time).
    pub(super) fn session_stream(&self, session: &str) -> Result<SessionStream, StreamRefused> {
        let mut sessions = lock(&self.sessions);
        let Some(open) = sessions.map.get_mut(session) else {
            return Err(StreamRefused::UnknownSession);
        };
        if open.streaming {
            return Err(StreamRefused::AlreadyStreaming);
        }
        open.streaming = true;
        Ok(SessionStream {
            ended: open.ended.clone(),
            sessions: self.sessions.clone(),
            session: session.to_owned(),
        })
    }
}

/// A reply as its era answers it: a 2026-07-28 error the revision gives an
/// HTTP status (-32601: 404; -32020, -32021, -32022: 400) carries it;
/// every other answer, and every error of a tool or a policy, is a 200 (a
/// server's result passed on as text among them); nothing is a 202.
fn answer(reply: Reply, era: Era) -> Answer {
    let status = match (&reply, era) {
        (Reply::Nothing, _) => 202,
        (Reply::Message(_), Era::Legacy) | (Reply::Text(_), _) => 200,
        (Reply::Message(response), Era::Modern) => {
            let code = response.get("error").and_then(|e| e.get("code"));
            match code.and_then(Value::as_i64) {
                Some(codes::METHOD_NOT_FOUND) => 404,
                Some(
                    modern::HEADER_MISMATCH
                    | modern::MISSING_CAPABILITY
                    | modern::UNSUPPORTED_VERSION,
                ) => 400,
                _ => 200,
            }
        }
    };
    Answer::Reply { reply, status, era }
}

/// Open subscriptions: (session, request id as JSON text) -> what ends it.
#[derive(Default)]
struct Listens {
    open: HashMap<(String, String), CancellationToken>,
}

/// A subscription's place, given back when dropped.
struct Slot {
    listens: Arc<Mutex<Listens>>,
    key: (String, String),
    ended: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.listens).open.remove(&self.key);
    }
}

/// Legacy sessions, bounded.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, Session, foldhash::fast::RandomState>,
    clock: u64,
}

struct Session {
    /// Last use, on the `Sessions` clock.
    used: u64,
    /// Cancelled when the session ends: its stream closes.
    ended: CancellationToken,
    /// Whether its stream is open (one at a time).
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

    /// Adds a session (again: stdio's is one); returns the one evicted to
    /// make room, if any.
    fn insert(&mut self, id: String) -> Option<String> {
        self.clock += 1;
        if let Some(session) = self.map.get_mut(&id) {
            session.used = self.clock;
            return None;
        }
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

/// (agent session, request id as JSON text) -> what cancels the request.
/// A pipelining agent can have many; the hasher is a fast one (seeded per
/// process, so ids an agent chooses cannot aim at one bucket).
type Requests = Mutex<HashMap<(String, String), CancellationToken, foldhash::fast::RandomState>>;

/// Requests in flight of one kind, by session and id, so that a
/// `notifications/cancelled` or the end of a session reaches them (the
/// edge's calls; the asks keep their own: an agent that stops sending
/// withdraws its asks while its calls may still be answered).
#[derive(Default)]
pub(super) struct InFlight {
    requests: Requests,
}

/// One request in flight; it is forgotten when this is dropped, however its
/// handling ends.
pub(super) struct Tracked<'a> {
    requests: &'a Requests,
    key: Option<(String, String)>,
}

impl InFlight {
    /// Tracks the request `id` of `session`, and what cancels it (a
    /// notification, without an id, can still be cancelled through it).
    pub(super) fn track(
        &self,
        session: &str,
        id: Option<&Value>,
    ) -> (Tracked<'_>, CancellationToken) {
        let cancelled = CancellationToken::new();
        let key = id.map(|id| (session.to_owned(), id.to_string()));
        if let Some(key) = &key {
            lock(&self.requests).insert(key.clone(), cancelled.clone());
        }
        let tracked = Tracked {
            requests: &self.requests,
            key,
        };
        (tracked, cancelled)
    }

    /// Cancels the request `id` of `session`.
    pub(super) fn cancel(&self, session: &str, id: &Value) {
        let key = (session.to_owned(), id.to_string());
        if let Some(token) = lock(&self.requests).get(&key) {
            token.cancel();
        }
    }

    /// Cancels everything `session` has in flight.
    pub(super) fn end_session(&self, session: &str) {
        for (key, token) in lock(&self.requests).iter() {
            if key.0 == session {
                token.cancel();
            }
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            lock(self.requests).remove(key);
        }
    }
}

/// The era a message speaks, by what its body claims: decided here, once,
/// for both transports.
fn era_of(message: &Value) -> Era {
    if modern::claims_modern(message) {
        Era::Modern
    } else {
        Era::Legacy
    }
}

/// `prefix` and 128 random bits in hex: a session's name (a modern
/// request's, one per call, is written without the formatter).
fn random_id(prefix: &str) -> String {
    let mut digits = [0u8; 32];
    // 16 bytes always fit 32 hex digits.
    let _ = hex::encode_to_slice(rand::random::<u128>().to_be_bytes(), &mut digits);
    let mut id = String::with_capacity(prefix.len() + digits.len());
    id.push_str(prefix);
    id.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_random_id_is_its_prefix_and_32_hex_digits() {
        let (a, b) = (super::random_id("m-"), super::random_id("m-"));
        assert_ne!(a, b);
        let digits = a.strip_prefix("m-").unwrap();
        assert_eq!(digits.len(), 32, "{a}");
        assert!(
            digits
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{a}"
        );
    }

    use super::*;

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
        assert_eq!(s.insert("new".into()), None, "an open session is kept");
        assert!(s.remove("new") && !s.remove("new"));
    }

    #[test]
    fn a_request_is_forgotten_when_its_handling_ends() {
        let in_flight = InFlight::default();
        let (tracked, cancelled) = in_flight.track("s", Some(&json!(1)));
        in_flight.cancel("s", &json!(1));
        assert!(cancelled.is_cancelled());
        drop(tracked);
        assert!(lock(&in_flight.requests).is_empty());
    }

    #[test]
    fn the_end_of_a_session_cancels_only_its_requests() {
        let in_flight = InFlight::default();
        let (a, b) = (
            in_flight.track("a", Some(&json!(1))),
            in_flight.track("b", Some(&json!(1))),
        );
        in_flight.end_session("a");
        assert!(a.1.is_cancelled() && !b.1.is_cancelled());
    }
}

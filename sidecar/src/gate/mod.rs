//! The per-message pipeline: parse -> decide -> route -> forward -> redact ->
//! audit. One agent message goes through `Gateway::handle` top to bottom.

mod listings;
mod relay;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use aip_policy::{
    AuditRecord, Decision, DlpRecord, Evaluator, Listing, Request, Verdict, normalize_name,
};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::approvals::{Ask, LocalApprovals};
use crate::audit::{Audit, UpstreamFailure, refusal_line};
use crate::config::Config;
use crate::jsonrpc::{self, Kind, Limits, Message};
use crate::metrics::{ConnectionLabels, DecisionLabels, FailureLabels, Metrics};
use crate::upstream::Failure;
use crate::upstream::health::{ConnectionState, HealthState};

/// Protocol versions the gateway speaks to agents, newest first.
pub const AGENT_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// How long an ask waits for a person by default.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a waiting ask tells an agent that asked for progress that it
/// is still waiting, by default.
pub const DEFAULT_ASK_PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// Settings of the gateway itself (not of the policy).
#[derive(Debug, Clone, Copy)]
pub struct GatewayOptions {
    pub approval_timeout: Duration,
    pub ask_progress_interval: Duration,
    pub limits: Limits,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            ask_progress_interval: DEFAULT_ASK_PROGRESS_INTERVAL,
            limits: Limits::default(),
        }
    }
}

/// Who is talking: the agent's session at the gateway, and the stream on
/// which messages about the request being handled reach it (progress,
/// logging, requests a server makes of it), if its transport has one.
#[derive(Debug, Clone)]
pub struct Caller {
    pub session: String,
    pub events: Option<mpsc::Sender<Value>>,
}

impl Caller {
    /// A caller without a stream for messages about its request.
    pub fn new(session: impl Into<String>) -> Caller {
        Caller {
            session: session.into(),
            events: None,
        }
    }

    /// Queues a message for the agent on this request's stream; false when
    /// it cannot go (no stream, or the agent is not reading it).
    fn send(&self, message: Value) -> bool {
        self.events
            .as_ref()
            .is_some_and(|events| events.try_send(message).is_ok())
    }
}

/// What to send back for one agent message.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A JSON-RPC response.
    Message(Value),
    /// Nothing: a notification, an agent's reply, or a canceled call.
    Nothing,
}

pub struct Gateway {
    pub metrics: Metrics,
    /// Where prompts (agent-facing name -> connection, upstream name) and
    /// resources (URI -> connection) were last listed.
    prompt_routes: Mutex<HashMap<String, (Arc<ConnectionState>, String)>>,
    resource_routes: Mutex<HashMap<String, Arc<ConnectionState>>>,
    /// The routing index of the current catalogs.
    catalog_cache: Mutex<Option<Arc<Catalog>>>,
    config: watch::Receiver<Arc<Config>>,
    connections: RwLock<Vec<Arc<ConnectionState>>>,
    pub approvals: Arc<LocalApprovals>,
    audit: Audit,
    limits: Limits,
    approval_timeout: Duration,
    ask_progress_interval: Duration,
    next_id: AtomicU64,
    /// Requests upstream servers made of agents, relayed and awaiting the
    /// agent's reply: (agent session, agent-facing id as JSON text) -> where
    /// the reply goes.
    relayed: Mutex<HashMap<(String, String), relay::Relayed>>,
    in_flight: Mutex<HashMap<(String, String), CancellationToken>>,
    shutdown: CancellationToken,
    /// Counts the configurations applied to the connections, for whatever
    /// must wait for a reload to take effect.
    applied: watch::Sender<u64>,
    /// Each connection with the token that stops its health checker.
    checks: Mutex<Vec<(Arc<ConnectionState>, CancellationToken)>>,
    /// Bumped by connections (and reloads) when what agents' tool lists
    /// depend on changes.
    listing: Arc<watch::Sender<u64>>,
    /// Bumped when the tool list agents see has really changed, for their
    /// `notifications/tools/list_changed`.
    tools_changed: watch::Sender<u64>,
    /// Bumped each time a connection a reload removed has been closed.
    retired: Arc<watch::Sender<u64>>,
}

/// Every discovered tool under its agent-facing name, and the normalized
/// names more than one tool claims (hidden and refused: which one a caller
/// meant is unknowable). Built once per catalog version, shared by calls.
struct Catalog {
    /// The catalog versions this index was built from (compared by pointer).
    versions: Vec<Arc<Vec<Value>>>,
    entries: Vec<CatalogEntry>,
    by_name: HashMap<String, usize>,
    ambiguous: std::collections::HashSet<String>,
}

struct CatalogEntry {
    agent_name: String,
    connection: Arc<ConnectionState>,
    /// The upstream's definition, name byte-identical to its tools/list.
    definition: Value,
}

/// A tool as the agent sees it, and where it really lives.
struct Route {
    connection: Arc<ConnectionState>,
    upstream_name: String,
}

impl Gateway {
    pub fn new(
        config: watch::Receiver<Arc<Config>>,
        audit: Audit,
        options: GatewayOptions,
        shutdown: CancellationToken,
    ) -> Arc<Gateway> {
        let gateway = Arc::new(Gateway::bare(
            config,
            LocalApprovals::new(),
            audit,
            options,
            shutdown,
        ));
        gateway.rebuild_connections();
        tokio::spawn(gateway.clone().follow_config());
        tokio::spawn(gateway.clone().follow_tool_list());
        gateway
    }

    /// A gateway serving only the admin routes of the stdio wrap mode: it
    /// shares `approvals` and brokers no connection.
    pub fn with_approvals(
        config: watch::Receiver<Arc<Config>>,
        approvals: Arc<LocalApprovals>,
        shutdown: CancellationToken,
    ) -> Arc<Gateway> {
        Arc::new(Gateway::bare(
            config,
            approvals,
            Audit::new(Box::new(std::io::sink())),
            GatewayOptions::default(),
            shutdown,
        ))
    }

    /// A gateway with no connections started and nothing following the
    /// configuration yet.
    fn bare(
        config: watch::Receiver<Arc<Config>>,
        approvals: Arc<LocalApprovals>,
        audit: Audit,
        options: GatewayOptions,
        shutdown: CancellationToken,
    ) -> Gateway {
        Gateway {
            metrics: Metrics::default(),
            prompt_routes: Mutex::new(HashMap::new()),
            resource_routes: Mutex::new(HashMap::new()),
            catalog_cache: Mutex::new(None),
            config,
            connections: RwLock::new(Vec::new()),
            approvals,
            audit,
            limits: options.limits,
            approval_timeout: options.approval_timeout,
            ask_progress_interval: options.ask_progress_interval,
            next_id: AtomicU64::new(1),
            relayed: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            shutdown,
            applied: watch::Sender::new(0),
            checks: Mutex::new(Vec::new()),
            listing: Arc::new(watch::Sender::new(0)),
            tools_changed: watch::Sender::new(0),
            retired: Arc::new(watch::Sender::new(0)),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    pub fn connections(&self) -> Vec<Arc<ConnectionState>> {
        self.connections
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ready once a policy is loaded.
    pub fn ready(&self) -> bool {
        self.config.borrow().policy.is_some()
    }

    async fn follow_config(self: Arc<Self>) {
        let mut config = self.config.clone();
        loop {
            tokio::select! {
                changed = config.changed() => if changed.is_err() { return },
                () = self.shutdown.cancelled() => return,
            }
            self.rebuild_connections();
            self.applied.send_modify(|n| *n += 1);
        }
    }

    /// Stops every connection's health checker and closes its upstream
    /// (stdio servers are asked to exit and waited for), all at once.
    pub async fn close_connections(&self) {
        let closing = std::mem::take(&mut *self.checks.lock().unwrap_or_else(|e| e.into_inner()));
        self.connections
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let mut tasks = tokio::task::JoinSet::new();
        for (state, stop) in closing {
            stop.cancel();
            tasks.spawn(async move { state.upstream.close().await });
        }
        tasks.join_all().await;
    }

    /// Changes each time the tool list agents see changes (a connection's
    /// health or catalog, a gated tool, a new policy).
    pub fn tools_changed(&self) -> watch::Receiver<u64> {
        self.tools_changed.subscribe()
    }

    /// Recomputes the agents' tool list whenever something it depends on
    /// changes, and announces the changes that are real.
    async fn follow_tool_list(self: Arc<Self>) {
        let mut heard = self.listing.subscribe();
        let mut last: Option<Value> = None;
        loop {
            heard.mark_unchanged();
            let now = self.tools_list(&self.config().evaluator);
            if last.as_ref().is_some_and(|last| *last != now) {
                self.tools_changed.send_modify(|n| *n += 1);
            }
            last = Some(now);
            tokio::select! {
                changed = heard.changed() => if changed.is_err() { return },
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Changes each time a connection a reload removed (or replaced) has
    /// been closed.
    pub fn retired(&self) -> watch::Receiver<u64> {
        self.retired.subscribe()
    }

    /// Changes each time a new configuration has been applied.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Connection states for the current config: an unchanged connection
    /// is kept as it is (session, catalog, stdio process); a new or changed
    /// one starts afresh with its own health checker; a removed one stops.
    fn rebuild_connections(&self) {
        let config = self.config();
        let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = std::mem::take(&mut *checks);
        for connection in &config.connections {
            if let Some(i) = old
                .iter()
                .position(|(s, _)| s.connection().same_as(connection))
            {
                checks.push(old.swap_remove(i));
                continue;
            }
            match ConnectionState::new(connection.clone(), self.listing.clone()) {
                Ok(state) => {
                    let state = Arc::new(state);
                    let stop = self.shutdown.child_token();
                    tokio::spawn(state.clone().run_checks(stop.clone()));
                    tokio::spawn(state.clone().listen(stop.clone()));
                    checks.push((state, stop));
                }
                Err(e) => {
                    tracing::error!(connection = %connection.name, error = %e, "connection not started")
                }
            }
        }
        *self.connections.write().unwrap_or_else(|e| e.into_inner()) =
            checks.iter().map(|(state, _)| state.clone()).collect();
        for (state, stop) in old {
            stop.cancel();
            self.retire(state);
        }
        self.listing.send_modify(|n| *n += 1);
    }

    /// Lets go of a connection a reload removed: nothing routes to it any
    /// more, and once its requests in flight are done its upstream is closed
    /// (an HTTP session ended with DELETE, a stdio server stopped).
    fn retire(&self, state: Arc<ConnectionState>) {
        *lock(&self.catalog_cache) = None;
        lock(&self.prompt_routes).retain(|_, (c, _)| !Arc::ptr_eq(c, &state));
        lock(&self.resource_routes).retain(|_, c| !Arc::ptr_eq(c, &state));
        let retired = self.retired.clone();
        tokio::spawn(async move {
            state.idle().await;
            state.upstream.close().await;
            retired.send_modify(|n| *n += 1);
        });
    }

    /// Handles one message from the agent, as bytes.
    pub async fn handle(&self, bytes: &[u8], caller: &Caller) -> Reply {
        match self.parse(bytes) {
            Ok(message) => self.handle_message(message, caller).await,
            Err(refused) => self.refuse(&refused),
        }
    }

    /// Parses strictly with the gateway's limits.
    pub fn parse(&self, bytes: &[u8]) -> Result<Message, jsonrpc::Refused> {
        jsonrpc::parse(bytes, self.limits)
    }

    /// Audits a refused message and builds its error reply.
    pub fn refuse(&self, refused: &jsonrpc::Refused) -> Reply {
        self.metrics.refused_messages.inc();
        self.audit.record(&refusal_line(
            &refused.refusal.to_string(),
            refused.id.as_ref(),
        ));
        Reply::Message(refused.response())
    }

    /// Handles one strictly parsed message from the agent, in a trace span
    /// (exported only when OTLP is configured).
    pub async fn handle_message(&self, message: Message, caller: &Caller) -> Reply {
        use tracing::Instrument;
        let span = tracing::info_span!(target: aip_runtime::TRACE_TARGET, "mcp.message",
            otel.kind = "server",
            rpc.method = message.method().unwrap_or("(reply)"),
            mcp.tool = tracing::field::Empty,
            aip.decision = tracing::field::Empty);
        self.handle_in_span(message, caller).instrument(span).await
    }

    async fn handle_in_span(&self, message: Message, caller: &Caller) -> Reply {
        let config = self.config();
        let evaluator = config.evaluator.clone();
        if let Kind::Response { .. } = message.kind {
            // The agent answering a request a server made of it: matched to
            // the relayed request and passed on, never blocked.
            self.agent_reply(message, &evaluator, caller).await;
            return Reply::Nothing;
        }
        let request = match Request::from_value(&message.value) {
            Ok(r) => r,
            Err(e) => return Reply::Message(error(message.id(), -32600, &e.to_string(), None)),
        };
        let mut verdict = evaluator.evaluate(&request);
        if verdict.decision == Decision::Ask {
            match self.ask(&message, &evaluator, verdict, caller).await {
                Some(decided) => verdict = decided,
                None => return Reply::Nothing, // withdrawn: never forwarded
            }
        }
        self.audit.record(&AuditRecord::for_request(
            &evaluator,
            &request,
            &verdict,
            SystemTime::now(),
        ));
        let called = (message.method() == Some("tools/call"))
            .then(|| {
                message
                    .params()
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
            })
            .flatten();
        self.count_decision(&verdict, called);
        if verdict.decision != Decision::Allow {
            // Blocked notifications are dropped (audited above): a
            // notification gets no reply.
            return verdict.response().map_or(Reply::Nothing, Reply::Message);
        }
        let method = message.method().unwrap_or_default();
        match (&message.kind, method) {
            (Kind::Notification { .. }, "notifications/cancelled") => {
                self.cancel(&message, caller);
                Reply::Nothing
            }
            (Kind::Notification { .. }, _) => Reply::Nothing,
            (Kind::Request { id, .. }, "initialize") => {
                Reply::Message(result(id, initialize(&message, &evaluator)))
            }
            (
                Kind::Request { .. },
                "prompts/list" | "resources/list" | "resources/templates/list",
            ) => self.list_page(&message, &evaluator).await,
            (Kind::Request { .. }, "prompts/get") => {
                self.prompts_get(&message, &evaluator, caller).await
            }
            (Kind::Request { .. }, "resources/read") => {
                self.resources_read(&message, &evaluator, caller).await
            }
            (Kind::Request { id, .. }, "ping") => Reply::Message(result(id, json!({}))),
            (Kind::Request { id, .. }, "tools/list") => {
                Reply::Message(result(id, self.tools_list(&evaluator)))
            }
            (Kind::Request { .. }, "tools/call") => {
                self.tools_call(&message, &evaluator, caller).await
            }
            (Kind::Request { id, .. }, other) => Reply::Message(error(
                Some(id),
                -32601,
                "Method not found",
                Some(json!({"method": other})),
            )),
            (Kind::Response { .. }, _) => Reply::Nothing,
        }
    }

    fn count_decision(&self, verdict: &Verdict, called: Option<&str>) {
        // Only catalogued names become label values.
        let tool = match called {
            Some(t) if self.route(t).is_some() => t.to_owned(),
            Some(_) => "other".to_owned(),
            None => String::new(),
        };
        let span = tracing::Span::current();
        span.record("aip.decision", verdict.audit_decision());
        if !tool.is_empty() {
            span.record("mcp.tool", tool.as_str());
        }
        let labels = DecisionLabels {
            decision: verdict.audit_decision().to_owned(),
            tool,
            mode: verdict.mode.as_str().to_owned(),
        };
        self.metrics.decisions.get_or_create(&labels).inc();
    }

    /// Holds an ask until a person decides, the agent cancels, or time runs
    /// out. Other calls are never held up: each message has its own task.
    /// None when the ask was withdrawn (the agent cancelled the call or its
    /// session ended): the call is then never forwarded and never answered.
    async fn ask(
        &self,
        message: &Message,
        evaluator: &Evaluator,
        verdict: Verdict,
        caller: &Caller,
    ) -> Option<Verdict> {
        let tool = verdict.tool().unwrap_or_default().to_owned();
        let connection = self
            .route(&tool)
            .map(|r| r.connection.connection().name.clone())
            .unwrap_or_default();
        let mut arguments = message
            .params()
            .and_then(|p| p.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null);
        let arguments_hash = aip_policy::hash::arguments_hash(&arguments);
        if let Some(r) = evaluator.redactor() {
            r.redact_strings(&mut arguments, &mut Vec::new());
        }
        let held = Ask {
            tool: tool.clone(),
            connection,
            arguments,
            arguments_hash,
        };
        let cancel = self.track(message, caller);
        let token = message.value.pointer("/params/_meta/progressToken");
        let answer = tokio::select! {
            a = self.approvals.ask(held, self.approval_timeout) => Some(verdict.resolve(a)),
            // Dropping the ask withdraws it: a later decision releases nothing.
            blocked = self.blocked_by_new_policy(message) => Some(blocked),
            () = cancel.cancelled() => None,
            () = self.waiting_progress(token, caller) => None, // never ends
        };
        self.untrack(message, caller);
        answer
    }

    /// Resolves when a new configuration blocks this held call outright: the
    /// ask is then withdrawn and the call answered as the new policy says.
    async fn blocked_by_new_policy(&self, message: &Message) -> Verdict {
        let mut config = self.config.clone();
        config.mark_unchanged();
        loop {
            if config.changed().await.is_err() {
                return std::future::pending().await;
            }
            let evaluator = config.borrow_and_update().evaluator.clone();
            if let Ok(request) = Request::from_value(&message.value) {
                let verdict = evaluator.evaluate(&request);
                if verdict.decision == Decision::Block {
                    tracing::info!(
                        tool = verdict.tool().unwrap_or_default(),
                        "a held call is now blocked by policy; its ask is withdrawn"
                    );
                    return verdict;
                }
            }
        }
    }

    /// While an ask waits, tells an agent that asked for progress (and whose
    /// transport can carry it) that the call is alive. Never returns.
    async fn waiting_progress(&self, token: Option<&Value>, caller: &Caller) {
        match token.filter(|_| caller.events.is_some()) {
            Some(token) => {
                progress_every(token, self.ask_progress_interval, |note| {
                    caller.send(note);
                })
                .await
            }
            None => std::future::pending().await,
        }
    }

    fn track(&self, message: &Message, caller: &Caller) -> CancellationToken {
        let token = CancellationToken::new();
        if let Some(id) = message.id() {
            let key = (caller.session.clone(), id.to_string());
            self.in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, token.clone());
        }
        token
    }

    fn untrack(&self, message: &Message, caller: &Caller) {
        if let Some(id) = message.id() {
            let key = (caller.session.clone(), id.to_string());
            self.in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        }
    }

    fn cancel(&self, message: &Message, caller: &Caller) {
        let Some(id) = message.params().and_then(|p| p.get("requestId")) else {
            return;
        };
        let key = (caller.session.clone(), id.to_string());
        if let Some(token) = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            token.cancel();
        }
    }

    /// Ends everything a session had in flight (its asks are withdrawn).
    pub fn end_session(&self, session: &str) {
        for (key, token) in self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if key.0 == session {
                token.cancel();
            }
        }
    }

    /// Every granted connection's tools, filtered by policy.
    fn tools_list(&self, evaluator: &Evaluator) -> Value {
        let mut listed: Vec<Value> = Vec::new();
        let catalog = self.catalog();
        for entry in &catalog.entries {
            let (agent_name, connection) = (&entry.agent_name, &entry.connection);
            let hidden_by_name = catalog
                .ambiguous
                .contains(normalize_name(agent_name).as_ref());
            if hidden_by_name || !connection.health().state.listable() {
                continue;
            }
            let upstream_name = entry
                .definition
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if connection.gate(&upstream_name).is_some() {
                continue;
            }
            let mut definition = entry.definition.clone();
            match evaluator.listing(agent_name) {
                Listing::Hidden => continue,
                Listing::Ask => {
                    let description = definition
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    definition["description"] = json!(
                        format!("[requires human approval] {description}")
                            .trim_end()
                            .to_owned()
                    );
                }
                Listing::Listed => {}
            }
            definition["name"] = json!(agent_name);
            listed.push(definition);
        }
        json!({ "tools": listed })
    }

    /// The routing index of the current catalogs: reused while no catalog
    /// has changed, rebuilt (once) when one has.
    fn catalog(&self) -> Arc<Catalog> {
        let connections = self.connections();
        let versions: Vec<Arc<Vec<Value>>> = connections.iter().map(|c| c.catalog()).collect();
        let mut cache = self.catalog_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cached) = cache.as_ref() {
            let same = cached.versions.len() == versions.len()
                && cached
                    .versions
                    .iter()
                    .zip(&versions)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
                && cached
                    .entries
                    .iter()
                    .all(|e| connections.iter().any(|c| Arc::ptr_eq(c, &e.connection)));
            if same {
                return cached.clone();
            }
        }
        let mut entries = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (state, tools) in connections.iter().zip(&versions) {
            let prefix = &state.connection().tool_prefix;
            for definition in tools.iter() {
                let Some(name) = definition.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let agent_name = format!("{prefix}{name}");
                *seen
                    .entry(normalize_name(&agent_name).into_owned())
                    .or_default() += 1;
                entries.push(CatalogEntry {
                    agent_name,
                    connection: state.clone(),
                    definition: definition.clone(),
                });
            }
        }
        let ambiguous: std::collections::HashSet<String> = seen
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k)
            .collect();
        for entry in &entries {
            if ambiguous.contains(normalize_name(&entry.agent_name).as_ref()) {
                tracing::warn!(
                    connection = %entry.connection.connection().name,
                    tool = %entry.agent_name,
                    "tool hidden: its name collides with another after normalization"
                );
            }
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.agent_name.clone(), i))
            .collect();
        let built = Arc::new(Catalog {
            versions,
            entries,
            by_name,
            ambiguous,
        });
        *cache = Some(built.clone());
        built
    }

    /// Tools hidden (and refused) because their agent-facing names collide
    /// after normalization: (connection, agent-facing name).
    pub fn colliding_tools(&self) -> Vec<(String, String)> {
        let catalog = self.catalog();
        catalog
            .entries
            .iter()
            .filter(|e| {
                catalog
                    .ambiguous
                    .contains(normalize_name(&e.agent_name).as_ref())
            })
            .map(|e| (e.connection.connection().name.clone(), e.agent_name.clone()))
            .collect()
    }

    /// Finds the one tool whose agent-facing name is exactly `name`.
    fn route(&self, name: &str) -> Option<Route> {
        let catalog = self.catalog();
        if catalog.ambiguous.contains(normalize_name(name).as_ref()) {
            return None;
        }
        let entry = &catalog.entries[*catalog.by_name.get(name)?];
        Some(Route {
            upstream_name: entry
                .definition
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            connection: entry.connection.clone(),
        })
    }

    async fn tools_call(&self, message: &Message, evaluator: &Evaluator, caller: &Caller) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let params = message
            .params()
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if params.contains_key("task") {
            return Reply::Message(error(
                Some(&id),
                -32602,
                "Task-augmented calls are not supported by this gateway",
                None,
            ));
        }
        let Some(route) = self.route(&name) else {
            return Reply::Message(error(
                Some(&id),
                -32602,
                &format!("Unknown tool: {name}"),
                None,
            ));
        };
        let connection = route.connection.connection().name.clone();
        if let Some(refusal) = refuse_by_state(&route, &connection, &name) {
            return Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": refusal}));
        }
        let upstream_id = self.fresh_id();
        let mut upstream_params = params;
        upstream_params.insert("name".into(), json!(route.upstream_name));
        let upstream_call = json!({"jsonrpc": "2.0", "id": upstream_id, "method": "tools/call", "params": upstream_params});
        let cancel = self.track(message, caller);
        let started = Instant::now();
        let outcome = self
            .call_upstream(&route.connection, upstream_call, caller, evaluator, &cancel)
            .await;
        self.untrack(message, caller);
        let connection_labels = ConnectionLabels {
            connection: connection.clone(),
        };
        self.metrics
            .upstream_latency
            .get_or_create(&connection_labels)
            .observe(started.elapsed().as_secs_f64());
        let Some(outcome) = outcome else {
            return Reply::Nothing; // cancelled by the agent (and upstream)
        };
        match outcome {
            Ok(exchange) => {
                route.connection.record_success();
                let mut response = exchange.response;
                response["id"] = id;
                self.redact_response(&mut response, evaluator, &name);
                Reply::Message(response)
            }
            Err(failure) => {
                route
                    .connection
                    .record_failure(&route.upstream_name, &failure);
                self.audit_failure(&connection, &name, &failure, started);
                Reply::Message(
                    json!({"jsonrpc": "2.0", "id": id, "error": failure.to_error(&connection, Some(&name))}),
                )
            }
        }
    }

    /// Forwards `request` (the agent's `message`, rewritten for the
    /// upstream) to one connection under a gateway id; the answer gets the
    /// agent's id back and is redacted throughout.
    async fn forward(
        &self,
        connection: &Arc<ConnectionState>,
        mut request: Value,
        message: &Message,
        evaluator: &Evaluator,
        caller: &Caller,
    ) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let name = connection.connection().name.clone();
        request["id"] = json!(self.fresh_id());
        let cancel = self.track(message, caller);
        let outcome = self
            .call_upstream(connection, request, caller, evaluator, &cancel)
            .await;
        self.untrack(message, caller);
        match outcome {
            None => Reply::Nothing,
            Some(Ok(x)) => {
                connection.record_success();
                let mut response = x.response;
                response["id"] = id;
                redact_all(&mut response, evaluator);
                Reply::Message(response)
            }
            Some(Err(failure)) => {
                connection.record_failure("", &failure);
                Reply::Message(
                    json!({"jsonrpc": "2.0", "id": id, "error": failure.to_error(&name, None)}),
                )
            }
        }
    }

    /// A request id for an upstream, unique for the gateway's life.
    fn fresh_id(&self) -> String {
        format!("aip-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// DLP over everything the agent will read: result content, structured
    /// content, embedded resources, and upstream error messages and data.
    fn redact_response(&self, response: &mut Value, evaluator: &Evaluator, tool: &str) {
        let Some(redactor) = evaluator.redactor() else {
            return;
        };
        let mut events = Vec::new();
        if let Some(result) = response.get_mut("result") {
            events = redactor.redact_tool_result(result);
        }
        if let Some(error) = response.get_mut("error").and_then(Value::as_object_mut) {
            for key in ["message", "data"] {
                if let Some(v) = error.get_mut(key) {
                    redactor.redact_strings(v, &mut events);
                }
            }
        }
        for line in DlpRecord::for_events(&events, Some(tool), SystemTime::now()) {
            self.audit.record(&line);
        }
    }

    fn audit_failure(&self, connection: &str, tool: &str, failure: &Failure, started: Instant) {
        let labels = FailureLabels {
            connection: connection.to_owned(),
            class: failure.class().to_owned(),
        };
        self.metrics.upstream_failures.get_or_create(&labels).inc();
        self.audit.upstream_failure(&UpstreamFailure {
            connection,
            tool,
            class: failure.class(),
            reason: failure.reason(),
            http_status: failure.http_status(),
            upstream_code: None,
            dispatched: !matches!(failure, Failure::CredentialsMissing(_)),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
    }
}

/// Calls that must not be sent: the connection is not usable, or the tool is
/// gated by an earlier 403.
fn refuse_by_state(route: &Route, connection: &str, tool: &str) -> Option<Value> {
    if let Some(gate) = route.connection.gate(&route.upstream_name) {
        return Some(
            Failure::Forbidden {
                scope: gate.required_scope,
            }
            .to_error(connection, Some(tool)),
        );
    }
    let health = route.connection.health();
    let failure = match health.state {
        HealthState::Healthy | HealthState::Degraded => return None,
        HealthState::NeedsCredentials => Failure::AuthFailed,
        HealthState::Unchecked | HealthState::Unreachable => {
            Failure::Network("the connection is not reachable".into())
        }
    };
    Some(failure.to_error(connection, Some(tool)))
}

fn initialize(message: &Message, evaluator: &Evaluator) -> Value {
    let requested = message
        .params()
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = AGENT_VERSIONS
        .iter()
        .find(|v| Some(**v) == requested)
        .unwrap_or(&AGENT_VERSIONS[0]);
    let mut capabilities = json!({"tools": {"listChanged": true}});
    // Resources and prompts are offered only where the policy's methods
    // allow listing them.
    if method_allowed(evaluator, "prompts/list") {
        capabilities["prompts"] = json!({"listChanged": false});
    }
    if method_allowed(evaluator, "resources/list") {
        capabilities["resources"] = json!({"listChanged": false});
    }
    json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": {"name": "aip-sidecar", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// Progress for `token` every `interval` ("waiting for human approval"),
/// handed to `send`. Never returns.
pub(crate) async fn progress_every(token: &Value, interval: Duration, send: impl Fn(Value)) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await; // the first tick is immediate
    for progress in 1u64.. {
        ticks.tick().await;
        send(
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
            "progressToken": token, "progress": progress, "message": "waiting for human approval"}}),
        );
    }
}

/// DLP over every string of a value (prompt messages, resource contents,
/// listings).
fn redact_all(value: &mut Value, evaluator: &Evaluator) {
    if let Some(r) = evaluator.redactor() {
        r.redact_strings(value, &mut Vec::new());
    }
}

fn method_allowed(evaluator: &Evaluator, method: &str) -> bool {
    evaluator
        .evaluate(&Request {
            id: None,
            method,
            params: None,
        })
        .decision
        == Decision::Allow
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: Option<&Value>, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = Map::new();
    e.insert("code".into(), json!(code));
    e.insert("message".into(), json!(message));
    if let Some(d) = data {
        e.insert("data".into(), d);
    }
    json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": e})
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

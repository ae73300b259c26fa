//! The per-message pipeline every agent transport runs (Streamable HTTP in
//! `agent::http`, stdio in `agent::stdio`): parse -> method spelling ->
//! policy -> hold an ask -> audit -> route -> forward -> redact -> reply.
//! The transports hand each message to [`Gateway::handle_message`] (bytes
//! to [`Gateway::handle`]), and it goes through this file top to bottom;
//! the components the pipeline composes live beside it, each owning its
//! state and handed what it needs, none holding or naming the gateway:
//!
//! - `call`: the per-request values (`Caller`, `Era`, `Reply`, `Ids`);
//! - `connections`: the live upstream connections across reloads;
//! - `catalog`: where each agent-facing tool name leads;
//! - `inflight`: requests in flight by session and id, for cancellation;
//! - `asks`: calls held for a person;
//! - `listings`: prompts and resources over every connection, and where
//!   a request for one goes;
//! - `relay`: a call to a server and what the server says meanwhile;
//! - `parked` and `input`: the era bridge (a legacy server's question to a
//!   modern agent; a modern server's to a legacy agent);
//! - `tasks` and `relayed_tasks`: approvals as tasks, and servers' tasks;
//! - `subscriptions` and `watches`: agents' notification streams;
//! - `present`: what the agent is shown (tool lists, the gateway's own
//!   answers, redaction).

mod asks;
mod call;
mod catalog;
mod connections;
mod inflight;
mod input;
mod listings;
mod parked;
mod present;
mod relay;
mod relayed_tasks;
mod subscriptions;
mod tasks;
mod watches;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aip_mcp::Failure;
use aip_mcp::jsonrpc::{self, Kind, Limits, Message};
use aip_policy::{AuditRecord, Decision, Evaluator, Request, Verdict, codes, normalize_name};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::approvals::LocalApprovals;
use crate::audit::{Audit, UpstreamFailure, refusal_line};
use crate::config::Config;
use crate::metrics::{ConnectionLabels, DecisionLabels, FailureLabels, Metrics};
use crate::upstream::health::{ConnectionState, HealthState};
use catalog::{Route, Routes};
use connections::Connections;
use inflight::InFlight;
use listings::Routed;
use present::{Findings, error, method_not_found, result};

use call::Ids;
pub use call::{Caller, Era, Reply};
pub use present::AGENT_VERSIONS;
pub use subscriptions::{SessionNotes, Subscription};

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

pub struct Gateway {
    pub metrics: Metrics,
    pub approvals: Arc<LocalApprovals>,
    config: watch::Receiver<Arc<Config>>,
    connections: Connections,
    routes: Routes,
    in_flight: InFlight,
    asks: asks::Asks,
    listings: listings::Listings,
    relay: relay::Relay,
    parked: Arc<parked::Parked>,
    tasks: Arc<tasks::Tasks>,
    subscriptions: subscriptions::Subscriptions,
    audit: Arc<Audit>,
    options: GatewayOptions,
    ids: Ids,
    shutdown: CancellationToken,
    /// Bumped when the tool list agents see has really changed, for their
    /// `notifications/tools/list_changed`.
    tools_changed: watch::Sender<u64>,
}

impl Gateway {
    /// A gateway following `config`: its connections are started (and kept
    /// in step with each new configuration) until `shutdown`.
    pub fn new(
        config: watch::Receiver<Arc<Config>>,
        audit: Audit,
        options: GatewayOptions,
        shutdown: CancellationToken,
    ) -> Arc<Gateway> {
        let approvals = LocalApprovals::new();
        let tasks = Arc::new(tasks::Tasks::new(options.approval_timeout));
        let tools_changed = watch::Sender::new(0);
        let connections = Connections::new();
        let audit = Arc::new(audit);
        let ids = Ids::default();
        let asks = asks::Asks::new(
            approvals.clone(),
            options.approval_timeout,
            options.ask_progress_interval,
            config.clone(),
        );
        let subscriptions = subscriptions::Subscriptions::new(
            tasks.clone(),
            audit.clone(),
            tools_changed.subscribe(),
            connections.notes.clone(),
            shutdown.clone(),
        );
        let gateway = Arc::new(Gateway {
            metrics: Metrics::default(),
            approvals,
            config,
            connections,
            routes: Routes::default(),
            in_flight: InFlight::default(),
            asks,
            listings: listings::Listings::new(ids.clone()),
            relay: relay::Relay::new(ids.clone(), audit.clone()),
            parked: Arc::new(parked::Parked::new(options.approval_timeout)),
            tasks,
            subscriptions,
            audit,
            options,
            ids,
            shutdown,
            tools_changed,
        });
        gateway.apply_config();
        tokio::spawn(gateway.clone().follow_config());
        tokio::spawn(gateway.clone().follow_tool_list());
        gateway
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    pub fn connections(&self) -> Vec<Arc<ConnectionState>> {
        self.connections.all()
    }

    /// Ready once a policy is loaded.
    pub fn ready(&self) -> bool {
        self.config.borrow().policy.is_some()
    }

    /// Changes each time the tool list agents see changes (a connection's
    /// health or catalog, a gated tool, a new policy).
    /// The notes for a legacy `session`'s standalone stream.
    pub fn session_notes(&self, session: &str) -> SessionNotes {
        let evaluator = self.config().evaluator.clone();
        let upstream = self.connections.capabilities();
        self.subscriptions
            .session_notes(session, &evaluator, &upstream)
    }

    /// Changes each time a connection a reload removed (or replaced) has
    /// been closed.
    pub fn retired(&self) -> watch::Receiver<u64> {
        self.connections.retired.subscribe()
    }

    /// Changes each time a new configuration has been applied.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.connections.applied.subscribe()
    }

    /// Tools hidden (and refused) because their agent-facing names collide
    /// after normalization: (connection, agent-facing name).
    pub fn colliding_tools(&self) -> Vec<(String, String)> {
        self.routes.catalog(&self.connections).colliding()
    }

    /// Stops every connection's health checker and closes its upstream.
    pub async fn close_connections(&self) {
        self.connections.close_all().await;
    }

    /// Ends everything a session had in flight (its asks are withdrawn).
    pub fn end_session(&self, session: &str) {
        self.in_flight.end_session(session);
        self.asks.withdraw(session);
        self.subscriptions.end_session(session);
    }

    /// Withdraws the asks a session left waiting; its calls go on.
    pub fn withdraw_asks(&self, session: &str) {
        self.asks.withdraw(session);
    }

    async fn follow_config(self: Arc<Self>) {
        let mut config = self.config.clone();
        loop {
            tokio::select! {
                changed = config.changed() => if changed.is_err() { return },
                () = self.shutdown.cancelled() => return,
            }
            self.apply_config();
            self.connections.applied.send_modify(|n| *n += 1);
        }
    }

    fn apply_config(&self) {
        // The policy's argument regexes are built on first use; build them
        // now, on a blocking thread, so that no call waits for one.
        let evaluator = Arc::clone(&self.config().evaluator);
        tokio::task::spawn_blocking(move || evaluator.build_regexes());
        for removed in self.connections.rebuild(&self.config(), &self.shutdown) {
            self.routes.forget();
            self.listings.forget(&removed);
            self.connections.retire(removed);
        }
    }

    /// Recomputes the agents' tool list whenever something it depends on
    /// changes, and announces the changes that are real.
    async fn follow_tool_list(self: Arc<Self>) {
        let mut heard = self.connections.listing.subscribe();
        // The first catalogs are not a change: an agent that lists before
        // they arrive waits for them (`Connections::settled`).
        self.connections.settled().await;
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

    /// Handles one message from the agent, as bytes.
    pub async fn handle(self: &Arc<Self>, bytes: &[u8], caller: &Caller) -> Reply {
        match self.parse(bytes) {
            Ok(message) => self.handle_message(message, caller).await,
            Err(refused) => self.refuse(&refused),
        }
    }

    /// The limits every agent message is parsed with.
    pub fn limits(&self) -> Limits {
        self.options.limits
    }

    /// Parses strictly with the gateway's limits.
    pub fn parse(&self, bytes: &[u8]) -> Result<Message, jsonrpc::Refused> {
        jsonrpc::parse(bytes, self.options.limits)
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

    /// Counts and audits a message refused before the pipeline (a modern
    /// request that breaks the revision's rules).
    pub fn record_refusal(&self, reason: &str, id: Option<&Value>) {
        self.metrics.refused_messages.inc();
        self.audit.record(&refusal_line(reason, id));
    }

    /// The `x-mcp-header` annotations of the tool an agent calls by `name`
    /// (none for an unknown tool: the pipeline refuses it).
    pub fn param_headers(&self, name: &str) -> Vec<aip_mcp::modern::ParamHeader> {
        let catalog = self.routes.catalog(&self.connections);
        catalog
            .entries
            .iter()
            .find(|e| e.agent_name == name)
            .and_then(|e| e.definition.get("inputSchema"))
            .and_then(|schema| aip_mcp::modern::param_headers(schema).ok())
            .unwrap_or_default()
    }

    /// Handles one strictly parsed message from the agent, in a trace span
    /// (exported only when OTLP is configured).
    pub async fn handle_message(self: &Arc<Self>, message: Message, caller: &Caller) -> Reply {
        use tracing::Instrument;
        let span = tracing::info_span!(target: aip_service::TRACE_TARGET, "mcp.message",
            otel.kind = "server",
            rpc.method = message.method().unwrap_or("(reply)"),
            mcp.tool = tracing::field::Empty,
            aip.decision = tracing::field::Empty);
        join_callers_trace(&span, &message);
        let Some(method) = caller
            .era
            .shapes_results()
            .then(|| message.method().map(str::to_owned))
        else {
            return self.decide(message, caller).instrument(span).await;
        };
        let mut reply = Box::pin(self.decide(message, caller).instrument(span)).await;
        if let (Reply::Message(response), Some(method)) = (&mut reply, method) {
            present::modern_result(response, &method);
        }
        reply
    }

    /// A `subscriptions/listen` from a modern agent: audited and decided as
    /// every request is; when allowed, the subscription to stream.
    pub async fn listen(&self, message: &Message) -> Result<Subscription, Reply> {
        let evaluator = self.config().evaluator.clone();
        let request = match Request::from_value(&message.value) {
            Ok(r) => r,
            Err(e) => {
                let e = e.to_string();
                return Err(Reply::Message(error(
                    message.id(),
                    codes::INVALID_REQUEST,
                    &e,
                    None,
                )));
            }
        };
        let verdict = evaluator.evaluate(&request);
        self.audit.record(&AuditRecord::for_request(
            &evaluator,
            &request,
            &verdict,
            SystemTime::now(),
        ));
        self.count_decision(&verdict, message);
        if verdict.decision != Decision::Allow {
            return Err(verdict.response().map_or(Reply::Nothing, Reply::Message));
        }
        if let Some(refused) = subscriptions::refuse_undeclared_tasks(message) {
            return Err(Reply::Message(refused));
        }
        let sources = subscriptions::Sources {
            listings: &self.listings,
            connections: &self.connections,
        };
        Ok(self.subscriptions.open(message, &evaluator, sources).await)
    }

    /// The pipeline proper.
    async fn decide(self: &Arc<Self>, mut message: Message, caller: &Caller) -> Reply {
        let evaluator = self.config().evaluator.clone();
        if let Kind::Response { .. } = message.kind {
            // The agent answering a request a server made of it: matched to
            // the relayed request and passed on, never blocked.
            Box::pin(self.relay.agent_reply(message, &evaluator, caller)).await;
            return Reply::Nothing;
        }
        if let Some(spelled) = misspelled_method(message.method().unwrap_or_default()) {
            return self.refuse_misspelled(&message, spelled);
        }
        // A params key MCP does not define for the method is nothing the
        // policy reads, yet a lenient server might (`args` for
        // `arguments`): what is decided and forwarded is without it.
        let undefined = aip_mcp::protocol::drop_undefined_params(&mut message.value);
        if !undefined.is_empty() {
            let method = message.method().unwrap_or_default();
            tracing::debug!(method, keys = ?undefined, "params keys the method does not define were dropped");
        }
        let request = match Request::from_value(&message.value) {
            Ok(r) => r,
            Err(e) => {
                let e = e.to_string();
                return Reply::Message(error(message.id(), codes::INVALID_REQUEST, &e, None));
            }
        };
        let mut verdict = evaluator.evaluate(&request);
        if verdict.decision == Decision::Ask
            && let Some(task) = self.ask_as_task(&message, &evaluator, &verdict, caller)
        {
            return task;
        }
        if verdict.decision == Decision::Ask {
            // Boxed, as every rare branch is: a future's size is its
            // largest branch's, and it is moved whole when a message is
            // handed to its task.
            let connection = self.connection_of(verdict.tool().unwrap_or_default());
            let held = self
                .asks
                .hold(&message, &evaluator, verdict, caller, connection);
            match Box::pin(held).await {
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
        self.count_decision(&verdict, &message);
        if verdict.decision != Decision::Allow {
            // Blocked notifications are dropped (audited above): a
            // notification gets no reply.
            return verdict.response().map_or(Reply::Nothing, Reply::Message);
        }
        self.serve(message, &evaluator, caller).await
    }

    /// What an allowed message gets: the gateway's own answer, or the
    /// upstream's through the route its name or URI leads to.
    async fn serve(&self, message: Message, evaluator: &Evaluator, caller: &Caller) -> Reply {
        if let Kind::Request { method, .. } = &message.kind
            && method == "tools/call"
        {
            // Nearly every message: it is forwarded as it was parsed.
            return self.tools_call(message, evaluator, caller).await;
        }
        let message = &message;
        let id = match &message.kind {
            Kind::Request { id, .. } => id,
            Kind::Notification { method } => {
                if method == "notifications/cancelled"
                    && let Some(id) = message.params().and_then(|p| p.get("requestId"))
                {
                    self.in_flight.cancel(&caller.session, id);
                    self.asks.cancel(&caller.session, id);
                }
                return Reply::Nothing;
            }
            Kind::Response { .. } => return Reply::Nothing,
        };
        match message.method().unwrap_or_default() {
            "initialize" => {
                let upstream = self.connections.capabilities();
                let answer = present::initialize(message.params(), evaluator, &upstream);
                Reply::Message(result(id, answer))
            }
            "server/discover" => {
                Box::pin(self.connections.settled()).await;
                let upstream = self.connections.capabilities();
                Reply::Message(result(id, present::discover(evaluator, &upstream)))
            }
            "ping" => Reply::Message(result(id, json!({}))),
            "tools/list" => {
                Box::pin(self.connections.settled()).await;
                Reply::Message(result(id, self.tools_list(evaluator)))
            }
            "prompts/list" | "resources/list" | "resources/templates/list" => {
                Box::pin(self.listings.page(&self.connections, message, evaluator)).await
            }
            "prompts/get" => {
                let routed =
                    Box::pin(self.listings.prompt(&self.connections, message, evaluator)).await;
                Box::pin(self.forward_routed(routed, message, evaluator, caller)).await
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let sources = subscriptions::Sources {
                    listings: &self.listings,
                    connections: &self.connections,
                };
                let kept = self
                    .subscriptions
                    .session_subscription(message, evaluator, caller, sources);
                match Box::pin(kept).await {
                    Some(reply) => reply,
                    None => Box::pin(self.by_resource(message, evaluator, caller)).await,
                }
            }
            "resources/read" => Box::pin(self.by_resource(message, evaluator, caller)).await,
            "completion/complete" => {
                let routed = Box::pin(self.listings.completion(
                    &self.connections,
                    message,
                    evaluator,
                ))
                .await;
                Box::pin(self.forward_routed(routed, message, evaluator, caller)).await
            }
            "logging/setLevel" => {
                Box::pin(
                    self.listings
                        .set_level(&self.connections, message, evaluator),
                )
                .await
            }
            // The gateway's own tasks (approvals) and servers' (relayed).
            "tasks/get" | "tasks/update" | "tasks/cancel" if caller.era.has_tasks() => {
                match self.tasks.own_request(message) {
                    Ok(reply) => reply,
                    Err(task) => {
                        Box::pin(self.server_task_request(message, task, evaluator, caller)).await
                    }
                }
            }
            method if method.starts_with("tasks/") => Reply::Message(method_not_found(id, method)),
            other => match self.connections.sole() {
                // With one server there is only one place a method can mean.
                Some(connection) => {
                    let request = message.value.clone();
                    Box::pin(self.forward(&connection, request, message, evaluator, caller)).await
                }
                None => Reply::Message(method_not_found(id, other)),
            },
        }
    }

    /// A known MCP method spelled otherwise (`TOOLS/CALL`, a zero-width
    /// character): the policy would read it as the method, a lenient server
    /// might too, an exact one would not. Refused, never forwarded.
    fn refuse_misspelled(&self, message: &Message, spelled: &str) -> Reply {
        let method = message.method().unwrap_or_default();
        let reason = format!("method {method:?} is not spelled {spelled:?}; spell it exactly");
        self.metrics.refused_messages.inc();
        self.audit.record(&refusal_line(&reason, message.id()));
        match message.id() {
            Some(id) => Reply::Message(error(Some(id), codes::INVALID_REQUEST, &reason, None)),
            None => Reply::Nothing,
        }
    }

    /// Audits and counts a decision made after the pipeline let go of the
    /// message (a task's ask, decided later).
    fn record_decision(&self, evaluator: &Evaluator, message: &Message, verdict: &Verdict) {
        if let Ok(request) = Request::from_value(&message.value) {
            let now = SystemTime::now();
            let line = AuditRecord::for_request(evaluator, &request, verdict, now);
            self.audit.record(&line);
        }
        self.count_decision(verdict, message);
    }

    fn count_decision(&self, verdict: &Verdict, message: &Message) {
        let called = (message.method() == Some("tools/call"))
            .then(|| {
                message
                    .params()
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
            })
            .flatten();
        // Only catalogued names become label values.
        let tool = match called {
            Some(t) if self.routes.catalog(&self.connections).knows(t) => t.to_owned(),
            Some(_) => "other".to_owned(),
            None => String::new(),
        };
        let span = tracing::Span::current();
        span.record("aip.decision", verdict.audit_decision());
        if !tool.is_empty() {
            span.record("mcp.tool", tool.as_str());
        }
        let labels = DecisionLabels {
            decision: verdict.audit_decision(),
            tool,
            mode: verdict.mode.as_str(),
        };
        self.metrics.decisions.get_or_create(&labels).inc();
    }

    /// Every listable connection's tools, filtered by policy.
    fn tools_list(&self, evaluator: &Evaluator) -> Value {
        present::tools_list(&self.routes.catalog(&self.connections), evaluator)
    }

    /// The one tool whose agent-facing name is exactly `name`.
    fn route(&self, name: &str) -> Option<Route> {
        self.routes.catalog(&self.connections).route(name)
    }

    /// The name of the connection that serves `tool` (empty when none
    /// does), for the ask a person decides.
    fn connection_of(&self, tool: &str) -> String {
        self.route(tool)
            .map(|r| r.connection.connection().name.clone())
            .unwrap_or_default()
    }

    async fn tools_call(&self, message: Message, evaluator: &Evaluator, caller: &Caller) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let params = message.params();
        let name = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if params.is_some_and(|p| p.get("task").is_some()) {
            let why = "Task-augmented calls are not supported by this gateway";
            return Reply::Message(error(Some(&id), codes::INVALID_PARAMS, why, None));
        }
        let route = match self.route(&name) {
            Some(route) => route,
            None => {
                // A connection still starting may hold it.
                Box::pin(self.connections.settled()).await;
                let Some(route) = self.route(&name) else {
                    let unknown = format!("Unknown tool: {name}");
                    return Reply::Message(error(Some(&id), codes::INVALID_PARAMS, &unknown, None));
                };
                route
            }
        };
        let connection = route.connection.connection().name.clone();
        if let Some(refusal) = refuse_by_state(&route, &connection, &name) {
            return Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": refusal}));
        }
        // Who may read the task, should the server answer with one.
        let task_owner = (caller.era.has_tasks()
            && route.connection.upstream.offers_tasks(&message.value))
        .then(|| tasks::owner_of(&message));
        // The agent's message as it was checked, under a gateway id and the
        // tool's upstream name (nothing of the envelope beyond JSON-RPC's).
        let mut upstream_call = message.value;
        if let Value::Object(envelope) = &mut upstream_call {
            envelope.retain(|k, _| matches!(k.as_str(), "jsonrpc" | "method" | "params"));
            envelope.insert("id".into(), Value::String(self.ids.fresh()));
        }
        if let Some(Value::Object(params)) = upstream_call.get_mut("params") {
            params.insert("name".into(), Value::String(route.upstream_name.clone()));
        }
        let tracked = self.in_flight.track(&caller.session, Some(&id));
        let started = Instant::now();
        let cancel = &tracked.cancelled;
        let exchange = self.exchange(&route.connection, upstream_call, caller, evaluator, cancel);
        let outcome = Box::pin(exchange).await;
        drop(tracked);
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
                if let Some(owner) = task_owner
                    && response
                        .get("result")
                        .is_some_and(aip_mcp::protocol::is_task)
                {
                    // Shown as a task view, redacted as it is built.
                    let connection = &route.connection;
                    let tasks = self.server_tasks();
                    return tasks.created(&response, id, connection, &name, owner, evaluator);
                }
                let findings = Findings::OfTool(&self.audit, &name);
                present::redact_response(&mut response, &route.connection, evaluator, findings);
                response["id"] = id;
                Reply::Message(response)
            }
            Err(failure) => {
                route
                    .connection
                    .record_failure(&route.upstream_name, &failure);
                self.audit_failure(&connection, &name, &failure, started);
                // A failure's reason may quote the server.
                let mut e = failure.to_error(&connection, Some(&name));
                present::redact_for_agent(
                    &mut e,
                    &route.connection,
                    evaluator,
                    Findings::Unaudited,
                );
                Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}))
            }
        }
    }

    /// Forwards `request` (the agent's `message`, rewritten for the
    /// upstream) to one connection under a gateway id; the answer gets the
    /// agent's id back and is redacted throughout.
    /// `resources/read` (and a legacy `resources/subscribe` the gateway
    /// does not keep itself): to the connection whose resource it is.
    async fn by_resource(
        &self,
        message: &Message,
        evaluator: &Evaluator,
        caller: &Caller,
    ) -> Reply {
        let routed = self
            .listings
            .resource(&self.connections, message, evaluator)
            .await;
        self.forward_routed(routed, message, evaluator, caller)
            .await
    }

    /// Answers an `ask` with a task, when the agent declared the extension
    /// and there is room; None to hold the call in its request instead.
    pub(super) fn ask_as_task(
        self: &Arc<Self>,
        message: &Message,
        evaluator: &Arc<Evaluator>,
        verdict: &Verdict,
        caller: &Caller,
    ) -> Option<Reply> {
        if !caller.era.has_tasks()
            || message.method() != Some("tools/call")
            || !aip_mcp::modern::declares_tasks(&message.value)
        {
            return None;
        }
        let gateway = self.clone();
        let (id, created, cancel) = self.tasks.open_approval(message)?;
        let reply_id = message.id().cloned().unwrap_or(Value::Null);
        // The call runs as a plain call: the server is not offered the
        // extension for it, so its result is the task's.
        let mut message = message.clone();
        tasks::without_tasks(&mut message.value);
        let (evaluator, verdict) = (evaluator.clone(), verdict.clone());
        let task_id = id.clone();
        // The id is the task's only credential: it stays out of session
        // names and logs.
        let session = format!("task-{}", self.ids.fresh());
        tokio::spawn(async move {
            let caller = Caller {
                session,
                events: None,
                era: Era::Modern,
            };
            let work = gateway.run_task(&task_id, message, &evaluator, verdict, &caller);
            tokio::select! {
                () = work => {}
                () = cancel.cancelled() => gateway.end_session(&caller.session),
            }
        });
        tracing::info!("an ask answered as a task");
        Some(Reply::Message(
            json!({"jsonrpc": "2.0", "id": reply_id, "result": created}),
        ))
    }

    /// The task's life: the person's decision, then (approved) the call.
    async fn run_task(
        &self,
        id: &str,
        message: Message,
        evaluator: &Arc<Evaluator>,
        verdict: Verdict,
        caller: &Caller,
    ) {
        let connection = self.connection_of(verdict.tool().unwrap_or_default());
        let held = self
            .asks
            .hold(&message, evaluator, verdict, caller, connection);
        let Some(decided) = held.await else {
            return;
        };
        self.record_decision(evaluator, &message, &decided);
        let reply = if decided.decision == Decision::Allow {
            self.tasks
                .update(id, "working", "approved; the call is running", None);
            self.serve(message, evaluator, caller).await
        } else {
            decided.response().map_or(Reply::Nothing, Reply::Message)
        };
        let outcome = match reply {
            Reply::Message(response) => response,
            Reply::Nothing => {
                json!({"error": {"code": codes::INTERNAL_ERROR, "message": "the call ended without a response"}})
            }
        };
        let (status, said) = match outcome.get("error") {
            Some(e) => (
                "failed",
                e["message"].as_str().unwrap_or("failed").to_owned(),
            ),
            None => ("completed", "completed".to_owned()),
        };
        self.tasks.update(id, status, &said, Some(outcome));
    }

    /// The servers' tasks, over the gateway's table, ids and audit.
    fn server_tasks(&self) -> relayed_tasks::ServerTasks<'_> {
        relayed_tasks::ServerTasks {
            tasks: &self.tasks,
            ids: &self.ids,
            audit: &self.audit,
        }
    }

    /// `tasks/get`, `tasks/update` or `tasks/cancel` for a server's task:
    /// authorized again, relayed to the server that holds it, and its
    /// answer checked and shown under the gateway's id.
    async fn server_task_request(
        &self,
        message: &Message,
        task: (String, tasks::ServerTask),
        evaluator: &Evaluator,
        caller: &Caller,
    ) -> Reply {
        let server = self.server_tasks();
        let request = match server.request(message, &task.1, evaluator) {
            Ok(request) => request,
            Err(refused) => return refused,
        };
        let connection = task.1.connection.clone();
        let tracked = self.in_flight.track(&caller.session, message.id());
        let sent = self.call_upstream(&connection, request, caller, evaluator, &tracked.cancelled);
        let outcome = Box::pin(sent).await;
        drop(tracked);
        server.answer(message, task, evaluator, outcome)
    }

    /// Forwards what a listing routed, or answers why it went nowhere.
    async fn forward_routed(
        &self,
        routed: Routed,
        message: &Message,
        evaluator: &Evaluator,
        caller: &Caller,
    ) -> Reply {
        match routed {
            Routed::To(connection, request) => {
                self.forward(&connection, request, message, evaluator, caller)
                    .await
            }
            Routed::Answer(reply) => reply,
        }
    }

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
        request["id"] = json!(self.ids.fresh());
        let tracked = self.in_flight.track(&caller.session, message.id());
        let exchange = self.exchange(connection, request, caller, evaluator, &tracked.cancelled);
        let outcome = Box::pin(exchange).await;
        drop(tracked);
        match outcome {
            None => Reply::Nothing,
            Some(Ok(x)) => {
                connection.record_success();
                let mut response = x.response;
                present::redact_response(&mut response, connection, evaluator, Findings::Unaudited);
                response["id"] = id;
                Reply::Message(response)
            }
            Some(Err(failure)) => {
                connection.record_failure("", &failure);
                let mut e = failure.to_error(&name, None);
                present::redact_for_agent(&mut e, connection, evaluator, Findings::Unaudited);
                Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}))
            }
        }
    }

    /// Sends `request` upstream and sees it through: a modern agent's
    /// retry carrying a parked call's handle resumes that call instead,
    /// and any other `requestState` toward a legacy server is refused
    /// (parked.rs); when a modern server asks a legacy agent for input, the
    /// gateway asks the agent and retries (input.rs); the request is kept
    /// for that only where a retry may follow.
    async fn exchange(
        &self,
        connection: &Arc<ConnectionState>,
        request: Value,
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
    ) -> Option<Result<aip_mcp::Exchange, Failure>> {
        if caller.era.answers_by_retry()
            && let Some(handle) = parked::handle_in(&request)
        {
            let resumed =
                self.parked
                    .resume(&self.relay, &handle, &request, caller, evaluator, cancel);
            return Box::pin(resumed).await;
        }
        if let Some(refused) = parked::refuse_foreign_state(&request, connection) {
            return Some(Ok(refused));
        }
        let retry = (!caller.era.answers_by_retry() && connection.upstream.modern())
            .then(|| request.clone());
        let outcome = self
            .call_upstream(connection, request, caller, evaluator, cancel)
            .await;
        match (outcome, retry) {
            (Some(Ok(x)), Some(request)) if input::requires_input(&x) => {
                let answering = input::Answering {
                    relay: &self.relay,
                    parked: &self.parked,
                    ids: &self.ids,
                    audit: &self.audit,
                    patience: self.options.approval_timeout,
                };
                let input =
                    answering.provide_input(connection, &request, x, caller, evaluator, cancel);
                Box::pin(input).await
            }
            (outcome, _) => outcome,
        }
    }

    /// Sends `request` (which has its gateway id) to `connection` through
    /// the relay; a call whose server asked the agent for input is parked
    /// and the agent gets `input_required`. None when `cancel` fires first.
    async fn call_upstream(
        &self,
        connection: &Arc<ConnectionState>,
        request: Value,
        caller: &Caller,
        evaluator: &Evaluator,
        cancel: &CancellationToken,
    ) -> Option<Result<aip_mcp::Exchange, Failure>> {
        self.parked
            .relay(&self.relay, connection, request, caller, evaluator, cancel)
            .await
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
    let failure = match route.connection.state() {
        HealthState::Healthy | HealthState::Degraded => return None,
        HealthState::NeedsCredentials => Failure::AuthFailed,
        HealthState::Unchecked | HealthState::Unreachable => {
            Failure::Network("the connection is not reachable".into())
        }
    };
    Some(failure.to_error(connection, Some(tool)))
}

/// The MCP method `method` is a variant spelling of, if it is one: the
/// policy compares names normalized, so `TOOLS/CALL` and `tools/call` with a
/// zero-width character are `tools/call` to it.
fn misspelled_method(method: &str) -> Option<&'static str> {
    if aip_mcp::protocol::METHODS.contains(&method) {
        return None;
    }
    let normal = normalize_name(method);
    aip_mcp::protocol::METHODS
        .iter()
        .find(|known| normalize_name(known) == normal)
        .copied()
}

/// The agent's trace context (W3C `traceparent`/`tracestate` in the
/// request's `_meta`, either era) as the parent of the gateway's span. A
/// relayed request reaches the server with the gateway's upstream span in
/// its place when spans are exported (`relay::pass_trace_on`), as it came
/// otherwise.
fn join_callers_trace(span: &tracing::Span, message: &Message) {
    let meta = message.params().and_then(|p| p.get("_meta"));
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    if let Some(parent) = field("traceparent") {
        aip_service::join_remote_trace(span, parent, field("tracestate"));
    }
}

//! The gateway: one entry, [`Gateway::handle`], that both agent transports
//! (Streamable HTTP in `agent::http`, stdio in `agent::stdio`) hand every
//! message to, and behind it the pipeline, in this file, top to bottom:
//!
//! 1. the agent edge (`edge`): parse, era, the revision's checks or the
//!    legacy session, the tool's route (one catalog lookup), cancellation;
//! 2. method spelling;
//! 3. policy;
//! 4. hold an ask (`asks`; as a task for an agent that declared them,
//!    `tasks`);
//! 5. audit;
//! 6. route: the gateway's own answer, or where the request goes;
//! 7. forward: one entry into the connection's health, then the relay
//!    (`relay`), or the era bridge when agent and server differ in era
//!    (`bridge`);
//! 8. present: what the agent is shown (`present`), back through the edge.
//!
//! The components the pipeline composes live beside it, each owning its
//! state and handed what it needs, none holding or naming the gateway:
//! `call` (the per-request values), `connections`, `catalog`, `edge`,
//! `asks`, `listings` (prompts and resources over every connection),
//! `relay`, `bridge`, `tasks` (approvals as tasks, and servers' tasks), `subscriptions` and `watches` (agents' notification
//! streams), `present`.

mod asks;
mod bridge;
mod call;
mod catalog;
mod connections;
mod edge;
mod listings;
mod present;
mod record;
mod relay;
mod subscriptions;
mod tasks;
mod watches;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aip_mcp::jsonrpc::{Kind, Limits, Message};
use aip_mcp::{Exchange, Failure};
use aip_policy::{Decision, Evaluator, Request, Verdict, codes, normalize_name};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::approvals::LocalApprovals;
use crate::audit::{Audit, UpstreamFailure};
use crate::config::Config;
use crate::metrics::{ConnectionLabels, FailureLabels, Metrics};
use crate::upstream::health::ConnectionState;
use bridge::Bridge;
use call::{Call, Ids};
use catalog::Routes;
use connections::Connections;
use edge::{Edge, Handled};
use listings::Routed;
use present::{Findings, error, method_not_found, result};

pub use call::{Caller, Era, Input, Reply, Transport};
pub use edge::{
    Answer, Listen, MAX_LISTENS, MAX_LISTENS_PER_SESSION, MAX_SESSIONS, STDIO_SESSION,
    SessionStream, StreamRefused,
};
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
    edge: Edge,
    asks: asks::Asks,
    listings: listings::Listings,
    relay: relay::Relay,
    bridge: Bridge,
    tasks: Arc<tasks::Tasks>,
    subscriptions: subscriptions::Subscriptions,
    audit: Arc<Audit>,
    decisions: record::Decisions,
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
        let metrics = Metrics::default();
        let decisions = record::Decisions::new(audit.clone(), metrics.decisions.clone());
        let asks = asks::Asks::new(
            approvals.clone(),
            asks::Patience {
                timeout: options.approval_timeout,
                progress_every: options.ask_progress_interval,
            },
            config.clone(),
            decisions.clone(),
            shutdown.clone(),
        );
        let subscriptions = subscriptions::Subscriptions::new(
            tasks.clone(),
            audit.clone(),
            tools_changed.subscribe(),
            connections.notes.clone(),
            shutdown.clone(),
        );
        let edge = Edge::new(
            options.limits,
            audit.clone(),
            metrics.refused_messages.clone(),
        );
        let gateway = Arc::new(Gateway {
            metrics,
            approvals,
            config,
            connections,
            routes: Routes::default(),
            edge,
            asks,
            listings: listings::Listings::new(ids.clone()),
            relay: relay::Relay::new(ids.clone(), audit.clone()),
            bridge: Bridge::new(options.approval_timeout, ids.clone(), audit.clone()),
            tasks,
            subscriptions,
            audit,
            decisions,
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

    /// The limits every agent message is parsed with.
    pub fn limits(&self) -> Limits {
        self.edge.limits()
    }

    /// Opens a legacy `session`'s standalone stream (one at a time): the
    /// notes it carries (`notifications/tools/list_changed` whenever the
    /// tools the agent may see change, its servers' list changes, updates
    /// of resources it subscribed to) until the session ends.
    pub fn session_stream(
        &self,
        session: &str,
    ) -> Result<(SessionStream, SessionNotes), StreamRefused> {
        let stream = self.edge.session_stream(session)?;
        let evaluator = self.config().evaluator.clone();
        let upstream = self.connections.capabilities();
        let notes = self
            .subscriptions
            .session_notes(session, &evaluator, &upstream);
        Ok((stream, notes))
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

    /// Ends a session the edge opened (or stdio's), and everything it had
    /// in flight: its asks are withdrawn, its subscriptions and stream end.
    /// False, and nothing ended, for a session that is not open.
    pub fn end_session(&self, session: &str) -> bool {
        let open = self.edge.close_session(session) || session == STDIO_SESSION;
        if open {
            self.end(session);
        }
        open
    }

    fn end(&self, session: &str) {
        // Asks first: they learn why before their calls are cancelled.
        self.asks.withdraw(session);
        self.edge.cancel_session(session);
        self.subscriptions.end_session(session);
    }

    /// The agent stopped sending: the asks it left waiting are withdrawn
    /// and its subscriptions end; its calls go on.
    pub fn withdraw(&self, session: &str) {
        self.asks.withdraw(session);
        self.edge.end_listens(session);
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

    /// The one entry: a message from the agent (its bytes, and what its
    /// transport knows of it) and what the transport sends back.
    pub async fn handle(self: &Arc<Self>, input: Input, caller: Caller) -> Answer {
        let sources = edge::Sources {
            routes: &self.routes,
            connections: &self.connections,
            evaluator: self.config().evaluator.clone(),
        };
        let pipeline = |call, message| self.pipeline(call, message);
        let served = self.edge.serve(input, caller, sources, pipeline).await;
        if let Some(evicted) = served.evicted {
            self.end(&evicted);
        }
        served.answer
    }

    /// The steps after the edge, in a trace span (exported only when OTLP
    /// is configured).
    async fn pipeline(self: &Arc<Self>, call: Call, message: Message) -> Handled {
        use tracing::Instrument;
        let span = tracing::info_span!(target: aip_service::TRACE_TARGET, "mcp.message",
            otel.kind = "server",
            rpc.method = message.method().unwrap_or("(reply)"),
            mcp.tool = tracing::field::Empty,
            aip.decision = tracing::field::Empty);
        join_callers_trace(&span, &message);
        if call.era == Era::Modern
            && message.method() == Some("subscriptions/listen")
            && message.id().is_some()
        {
            return self.listen(&message, &call).instrument(span).await;
        }
        let Some(method) = call
            .era
            .shapes_results()
            .then(|| message.method().map(str::to_owned))
        else {
            return Handled::Reply(self.decide(message, &call).instrument(span).await);
        };
        let mut reply = Box::pin(self.decide(message, &call).instrument(span)).await;
        // A `Reply::Text` was shaped as it was made (`present::text_reply`).
        if let (Reply::Message(response), Some(method)) = (&mut reply, method) {
            present::modern_result(response, &method);
        }
        Handled::Reply(reply)
    }

    /// A `subscriptions/listen` from a modern agent: audited and decided as
    /// every request is; when allowed, the subscription to stream.
    async fn listen(&self, message: &Message, call: &Call) -> Handled {
        let evaluator = &call.evaluator;
        let request = match Request::from_value(&message.value) {
            Ok(r) => r,
            Err(e) => {
                let e = e.to_string();
                let refused = error(message.id(), codes::INVALID_REQUEST, &e, None);
                return Handled::Reply(Reply::Message(refused));
            }
        };
        let verdict = evaluator.evaluate(&request);
        self.decisions.audit(evaluator, &request, &verdict, None);
        self.decisions.count(&verdict, message, false);
        if verdict.decision != Decision::Allow {
            return Handled::Reply(verdict.response().map_or(Reply::Nothing, Reply::Message));
        }
        if let Some(refused) = subscriptions::refuse_undeclared_tasks(message) {
            return Handled::Reply(Reply::Message(refused));
        }
        let sources = subscriptions::Sources {
            listings: &self.listings,
            connections: &self.connections,
        };
        let subscription = self.subscriptions.open(message, evaluator, sources).await;
        Handled::Listen(Box::new(subscription))
    }

    /// Method spelling, policy, an ask held, audit; then the answer.
    async fn decide(self: &Arc<Self>, mut message: Message, call: &Call) -> Reply {
        let evaluator = &call.evaluator;
        if let Kind::Response { .. } = message.kind {
            // The agent answering a request a server made of it: matched to
            // the relayed request and passed on, never blocked.
            Box::pin(self.relay.agent_reply(message, call)).await;
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
            message.source = None; // no longer what the value says
            let method = message.method().unwrap_or_default();
            tracing::debug!(method, keys = %undefined.join(","), "params keys the method does not define were dropped");
        }
        let request = match Request::from_value(&message.value) {
            Ok(r) => r,
            Err(e) => {
                let e = e.to_string();
                return Reply::Message(error(message.id(), codes::INVALID_REQUEST, &e, None));
            }
        };
        let mut verdict = evaluator.evaluate(&request);
        let mut approval: Option<String> = None;
        if let Some(why) = &call.withheld {
            let tool = request
                .params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str);
            verdict = verdict.withheld(message.id(), tool.unwrap_or_default(), why);
        }
        if verdict.decision == Decision::Ask
            && let Some(task) = self.ask_as_task(&message, &verdict, call)
        {
            return task;
        }
        if verdict.decision == Decision::Ask {
            // Boxed, as every rare branch is: a future's size is its
            // largest branch's, and it is moved whole when a message is
            // handed to its task.
            let held = self.asks.hold(&message, verdict, call, connection_of(call));
            match Box::pin(held).await {
                Some(decided) => {
                    verdict = decided.verdict;
                    approval = decided.request;
                }
                // Withdrawn with nobody to tell (audited by `asks`): never
                // forwarded.
                None => return Reply::Nothing,
            }
        }
        self.decisions
            .audit(evaluator, &request, &verdict, approval.as_deref());
        self.decisions.count(&verdict, &message, call.known);
        if verdict.decision != Decision::Allow {
            // Blocked notifications are dropped (audited above): a
            // notification gets no reply.
            return verdict.response().map_or(Reply::Nothing, Reply::Message);
        }
        self.serve(message, call).await
    }

    /// What an allowed message gets: the gateway's own answer, or the
    /// upstream's through the route its name or URI leads to.
    async fn serve(&self, message: Message, call: &Call) -> Reply {
        if let Kind::Request { method, .. } = &message.kind
            && method == "tools/call"
        {
            // Nearly every message: it is forwarded as it was parsed.
            return self.tools_call(message, call).await;
        }
        let evaluator = &*call.evaluator;
        let message = &message;
        let id = match &message.kind {
            Kind::Request { id, .. } => id,
            Kind::Notification { method } => {
                if method == "notifications/cancelled"
                    && let Some(id) = message.params().and_then(|p| p.get("requestId"))
                {
                    self.edge.cancel(&call.session, id);
                    self.asks.cancel(&call.session, id);
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
                Box::pin(self.forward_routed(routed, message, call)).await
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let sources = subscriptions::Sources {
                    listings: &self.listings,
                    connections: &self.connections,
                };
                let kept = self
                    .subscriptions
                    .session_subscription(message, call, sources);
                match Box::pin(kept).await {
                    Some(reply) => reply,
                    None => Box::pin(self.by_resource(message, call)).await,
                }
            }
            "resources/read" => Box::pin(self.by_resource(message, call)).await,
            "completion/complete" => {
                let routed = Box::pin(self.listings.completion(
                    &self.connections,
                    message,
                    evaluator,
                ))
                .await;
                Box::pin(self.forward_routed(routed, message, call)).await
            }
            "logging/setLevel" => {
                Box::pin(
                    self.listings
                        .set_level(&self.connections, message, evaluator),
                )
                .await
            }
            // The gateway's own tasks (approvals) and servers' (relayed).
            "tasks/get" | "tasks/update" | "tasks/cancel" if call.era.has_tasks() => {
                match self.tasks.own_request(message) {
                    Ok(reply) => reply,
                    Err(task) => Box::pin(self.server_task_request(message, task, call)).await,
                }
            }
            method if method.starts_with("tasks/") => Reply::Message(method_not_found(id, method)),
            other => match self.connections.sole() {
                // With one server there is only one place a method can mean.
                Some(connection) => {
                    let request = message.value.clone();
                    Box::pin(self.forward(&connection, request, message, call)).await
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
        self.edge.record_refusal(&reason, message.id());
        match message.id() {
            Some(id) => Reply::Message(error(Some(id), codes::INVALID_REQUEST, &reason, None)),
            None => Reply::Nothing,
        }
    }

    /// Every listable connection's tools, filtered by policy.
    fn tools_list(&self, evaluator: &Evaluator) -> Value {
        present::tools_list(&self.routes.catalog(&self.connections), evaluator)
    }

    /// The route step and the forward and present steps of a `tools/call`.
    async fn tools_call(&self, message: Message, call: &Call) -> Reply {
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
        let settled;
        let route = match &call.route {
            Some(route) => route,
            None => {
                // A connection still starting may hold it: the one more
                // lookup, only for a name the edge did not find.
                Box::pin(self.connections.settled()).await;
                let Some(route) = self.routes.catalog(&self.connections).route(&name) else {
                    let unknown = match self.connections.unavailable_for(&name) {
                        Some(why) => format!("Unknown tool: {name} ({why})"),
                        None => format!("Unknown tool: {name}"),
                    };
                    return Reply::Message(error(Some(&id), codes::INVALID_PARAMS, &unknown, None));
                };
                settled = route;
                &settled
            }
        };
        let connection = route.connection.connection().name.clone();
        // Who may read the task, should the server answer with one.
        let task_owner = (call.era.has_tasks()
            && route.connection.upstream.offers_tasks(&message.value))
        .then(|| tasks::owner_of(&message));
        // The agent's message as it was checked, under a gateway id and the
        // tool's upstream name (nothing of the envelope beyond JSON-RPC's);
        // the agent's text goes along for the relay to splice those two into.
        let upstream_id = self.ids.fresh();
        let source = message.source;
        let mut upstream_call = message.value;
        if let Value::Object(envelope) = &mut upstream_call {
            envelope.retain(|k, _| matches!(k.as_str(), "jsonrpc" | "method" | "params"));
            envelope.insert("id".into(), Value::String(upstream_id));
        }
        if let Some(Value::Object(params)) = upstream_call.get_mut("params") {
            params.insert("name".into(), Value::String(route.upstream_name.clone()));
        }
        let started = Instant::now();
        // Boxed where it is made, as every upstream exchange is: it is the
        // largest future of a call, and is then moved as a pointer.
        let sent = Box::pin(self.send(&route.connection, upstream_call, source, call));
        let admitted = route.connection.admit(Some(&route.upstream_name), sent);
        let outcome = match admitted.await {
            Ok(outcome) => outcome,
            // Not sent: the connection is not usable, or the tool gated.
            Err(refusal) => {
                let e = refusal.to_error(&connection, Some(&name));
                return Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}));
            }
        };
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
        let evaluator = &*call.evaluator;
        match outcome {
            Ok(exchange) => {
                let (mut response, text) = exchange.into_parts();
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
                let redacted =
                    present::redact_response(&mut response, &route.connection, evaluator, findings);
                // Nothing redacted: the server's result goes on as it came.
                if let Some(text) = text
                    .filter(|_| !redacted && call.text_replies && response.get("result").is_some())
                    && let Some(text) = present::text_reply(&text, &id, call.era, "tools/call")
                {
                    return Reply::Text(text);
                }
                response["id"] = id;
                Reply::Message(response)
            }
            Err(failure) => {
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

    /// The forward step's choice: to a server of the agent's own era,
    /// through the relay; across eras (or carrying a `requestState` toward
    /// a legacy server), through the bridge.
    async fn send(
        &self,
        connection: &Arc<ConnectionState>,
        request: Value,
        source: Option<bytes::Bytes>,
        call: &Call,
    ) -> Option<Result<Exchange, Failure>> {
        if Bridge::needed(call.era, connection, &request) {
            // Rewritten for the other era: the agent's text says nothing of it.
            let bridged = self.bridge.exchange(&self.relay, connection, request, call);
            return Box::pin(bridged).await;
        }
        self.relay.forward(connection, request, source, call).await
    }

    /// `resources/read` (and a legacy `resources/subscribe` the gateway
    /// does not keep itself): to the connection whose resource it is.
    async fn by_resource(&self, message: &Message, call: &Call) -> Reply {
        let routed = self
            .listings
            .resource(&self.connections, message, &call.evaluator)
            .await;
        self.forward_routed(routed, message, call).await
    }

    /// Answers an `ask` with a task, when the agent declared the extension
    /// and there is room; None to hold the call in its request instead.
    fn ask_as_task(
        self: &Arc<Self>,
        message: &Message,
        verdict: &Verdict,
        call: &Call,
    ) -> Option<Reply> {
        if !call.era.has_tasks()
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
        message.source = None;
        let verdict = verdict.clone();
        // The id is the task's only credential: it stays out of session
        // names and logs. The task's cancellation is the call's.
        let task = Call {
            session: format!("task-{}", self.ids.fresh()),
            events: None,
            era: Era::Modern,
            cancel,
            text_replies: false,
            ..call.clone()
        };
        tokio::spawn(async move { gateway.run_task(&id, message, verdict, &task).await });
        tracing::info!("an ask answered as a task");
        Some(Reply::Message(
            json!({"jsonrpc": "2.0", "id": reply_id, "result": created}),
        ))
    }

    /// The task's life: the person's decision, then (approved) the call.
    async fn run_task(&self, id: &str, message: Message, verdict: Verdict, call: &Call) {
        let held = self.asks.hold(&message, verdict, call, connection_of(call));
        let Some(asked) = held.await else {
            return;
        };
        let decided = asked.verdict;
        self.decisions.record(
            &call.evaluator,
            &message,
            &decided,
            call.known,
            asked.request.as_deref(),
        );
        let reply = if decided.decision == Decision::Allow {
            self.tasks
                .update(id, "working", "approved; the call is running", None);
            self.serve(message, call).await
        } else {
            decided.response().map_or(Reply::Nothing, Reply::Message)
        };
        let outcome = reply.into_message().unwrap_or_else(|| {
            json!({"error": {"code": codes::INTERNAL_ERROR, "message": "the call ended without a response"}})
        });
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
    fn server_tasks(&self) -> tasks::ServerTasks<'_> {
        tasks::ServerTasks {
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
        call: &Call,
    ) -> Reply {
        let server = self.server_tasks();
        let request = match server.request(message, &task.1, &call.evaluator) {
            Ok(request) => request,
            Err(refused) => return refused,
        };
        let connection = task.1.connection.clone();
        let sent = Box::pin(self.send(&connection, request, None, call));
        let outcome = connection.admit(None, sent).await;
        let outcome = outcome.unwrap_or_else(|refusal| Some(Err(refusal)));
        server.answer(message, task, &call.evaluator, outcome)
    }

    /// Forwards what a listing routed, or answers why it went nowhere.
    async fn forward_routed(&self, routed: Routed, message: &Message, call: &Call) -> Reply {
        match routed {
            Routed::To(connection, request) => {
                self.forward(&connection, request, message, call).await
            }
            Routed::Answer(reply) => reply,
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
        call: &Call,
    ) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let name = connection.connection().name.clone();
        request["id"] = json!(self.ids.fresh());
        let sent = Box::pin(self.send(connection, request, None, call));
        let outcome = connection.admit(None, sent).await;
        let outcome = outcome.unwrap_or_else(|refusal| Some(Err(refusal)));
        let evaluator = &*call.evaluator;
        match outcome {
            None => Reply::Nothing,
            Some(Ok(x)) => {
                let mut response = x.into_response();
                present::redact_response(&mut response, connection, evaluator, Findings::Unaudited);
                response["id"] = id;
                Reply::Message(response)
            }
            Some(Err(failure)) => {
                let mut e = failure.to_error(&name, None);
                present::redact_for_agent(&mut e, connection, evaluator, Findings::Unaudited);
                Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}))
            }
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

/// The name of the connection a `tools/call` goes to (empty when none
/// does), for the ask a person decides.
fn connection_of(call: &Call) -> String {
    call.route
        .as_ref()
        .map(|r| r.connection.connection().name.clone())
        .unwrap_or_default()
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

//! `subscriptions/listen` (MCP 2026-07-28): an agent's stream of the
//! notifications it asked for, each tagged with its subscription. What it
//! hears is what the policy lets it see: the gateway's own tool list
//! changes (announced only when the filtered list really changed), and its
//! servers' prompts and resources list changes where the policy allows
//! listing them; and updates of the resources it asked about
//! (`resourceSubscriptions`) that the policy lets it read, whose server
//! offers subscriptions (watches.rs keeps the servers subscribed); and
//! `notifications/tasks` for the tasks it asked about (`taskIds`) that are
//! its own: the gateway's (as their status changes) and modern servers'
//! (asked for on the gateway's listen stream to the server, checked and
//! shown under the gateway's id).

use aip_mcp::jsonrpc::Message;
use std::sync::Arc;

use aip_mcp::modern::{META_SUBSCRIPTION, MISSING_CAPABILITY, TASKS_EXTENSION, declares_tasks};
use aip_policy::{Decision, Evaluator, Request, codes};
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::call::{Call, Reply};
use super::connections::Connections;
use super::listings::Listings;
use super::present::server_info;
use super::tasks::{ServerTask, Tasks, task_view};
use super::watches::SessionWatches;
use super::watches::{MAX_SESSION_WATCHES, Watch, Watches};
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// One agent's subscription, open until the gateway stops or the agent
/// hangs up.
pub struct Subscription {
    id: Value,
    /// The agent (its `clientInfo` name), whose tasks it may follow.
    owner: String,
    honored: Value,
    prompts: bool,
    resources: bool,
    tools_changed: Option<watch::Receiver<u64>>,
    /// The resources it watches (the servers stay subscribed while it
    /// holds them).
    watching: Vec<Watch>,
    /// The gateway's own tasks it follows (`taskIds`).
    own_tasks: Vec<String>,
    /// The servers' tasks it follows: the gateway's id, where the task
    /// lives, and the watch that keeps the server telling.
    relayed_tasks: Vec<(String, ServerTask, Watch)>,
    task_changes: broadcast::Receiver<String>,
    tasks: Arc<Tasks>,
    audit: Arc<Audit>,
    evaluator: Arc<Evaluator>,
    notes: broadcast::Receiver<(String, Value)>,
    shutdown: CancellationToken,
}

/// The most resources one subscription watches; the acknowledgement names
/// those it does.
const MAX_WATCHED: usize = 64;

/// What agents' streams are made of: the servers kept subscribed to the
/// resources agents watch, legacy sessions' own watches, and the feeds a
/// stream follows (tool list changes, servers' notes, task changes).
pub(super) struct Subscriptions {
    watches: Watches,
    sessions: Arc<SessionWatches>,
    tasks: Arc<Tasks>,
    audit: Arc<Audit>,
    tools_changed: watch::Receiver<u64>,
    notes: broadcast::Sender<(String, Value)>,
    shutdown: CancellationToken,
}

/// The gateway parts a subscription reads as it opens: where resources
/// are, and what the servers offer.
pub(super) struct Sources<'a> {
    pub(super) listings: &'a Listings,
    pub(super) connections: &'a Connections,
}

impl Subscriptions {
    pub(super) fn new(
        tasks: Arc<Tasks>,
        audit: Arc<Audit>,
        tools_changed: watch::Receiver<u64>,
        notes: broadcast::Sender<(String, Value)>,
        shutdown: CancellationToken,
    ) -> Subscriptions {
        Subscriptions {
            watches: Watches::default(),
            sessions: Arc::default(),
            tasks,
            audit,
            tools_changed,
            notes,
            shutdown,
        }
    }

    /// Tool list changes from now on (what came before is not news).
    fn tools_changed(&self) -> watch::Receiver<u64> {
        let mut changes = self.tools_changed.clone();
        changes.mark_unchanged();
        changes
    }

    /// Forgets the resources a legacy session watched.
    pub(super) fn end_session(&self, session: &str) {
        aip_service::sync::lock(&self.sessions.0).remove(session);
    }

    /// Opens a subscription for an allowed `subscriptions/listen`: the
    /// filter it asked for, less what the gateway cannot deliver or the
    /// policy hides.
    pub(super) async fn open(
        &self,
        message: &Message,
        evaluator: &Arc<Evaluator>,
        sources: Sources<'_>,
    ) -> Subscription {
        let asked = message
            .params()
            .and_then(|p| p.get("notifications"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let wants = |key: &str| asked.get(key).and_then(Value::as_bool) == Some(true);
        let upstream = sources.connections.capabilities();
        let announces = |kind: &str| {
            upstream
                .get(kind)
                .and_then(|c| c.get("listChanged"))
                .and_then(Value::as_bool)
                == Some(true)
        };
        let tools = wants("toolsListChanged");
        let prompts = wants("promptsListChanged")
            && announces("prompts")
            && allowed(evaluator, "prompts/list");
        let resources = wants("resourcesListChanged")
            && announces("resources")
            && allowed(evaluator, "resources/list");
        let mut honored = serde_json::Map::new();
        for (key, on) in [
            ("toolsListChanged", tools),
            ("promptsListChanged", prompts),
            ("resourcesListChanged", resources),
        ] {
            if on {
                honored.insert(key.into(), json!(true));
            }
        }
        let watching = self.watch(&asked, evaluator, &sources).await;
        if !watching.is_empty() {
            let uris: Vec<&str> = watching.iter().map(|w| w.uri.as_str()).collect();
            honored.insert("resourceSubscriptions".into(), json!(uris));
        }
        let (own_tasks, relayed_tasks) = self.follow_tasks(&asked, message);
        let followed: Vec<&String> = own_tasks
            .iter()
            .chain(relayed_tasks.iter().map(|(id, _, _)| id))
            .collect();
        if !followed.is_empty() {
            honored.insert("taskIds".into(), json!(followed));
        }
        Subscription {
            id: message.id().cloned().unwrap_or(Value::Null),
            owner: super::tasks::owner_of(message),
            honored: Value::Object(honored),
            prompts,
            resources,
            tools_changed: tools.then(|| self.tools_changed()),
            watching,
            own_tasks,
            relayed_tasks,
            task_changes: self.tasks.changes.subscribe(),
            tasks: self.tasks.clone(),
            audit: self.audit.clone(),
            evaluator: evaluator.clone(),
            notes: self.notes.subscribe(),
            shutdown: self.shutdown.clone(),
        }
    }
}

/// A listen that asks for task notifications without declaring the tasks
/// extension is refused, as the extension has it (-32021).
pub(super) fn refuse_undeclared_tasks(message: &Message) -> Option<Value> {
    let asked = message.params()?.get("notifications")?.get("taskIds")?;
    if asked.as_array().is_none_or(Vec::is_empty) || declares_tasks(&message.value) {
        return None;
    }
    let why = format!(
        "taskIds needs the {TASKS_EXTENSION} extension declared in the request's capabilities"
    );
    let data = json!({"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}});
    Some(super::present::error(
        message.id(),
        MISSING_CAPABILITY,
        &why,
        Some(data),
    ))
}

impl Subscriptions {
    /// The tasks a listen asked to follow that are the agent's own: the
    /// gateway's, and the servers' (whose modern HTTP server is then asked
    /// to tell about them).
    fn follow_tasks(
        &self,
        asked: &Value,
        message: &Message,
    ) -> (Vec<String>, Vec<(String, ServerTask, Watch)>) {
        let owner = super::tasks::owner_of(message);
        let ids = asked.get("taskIds").and_then(Value::as_array);
        let mut own = Vec::new();
        let mut relayed = Vec::new();
        for id in ids
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .take(MAX_WATCHED)
        {
            let found = {
                let tasks = aip_service::sync::lock(&self.tasks.table);
                tasks
                    .get(id)
                    .filter(|t| t.owner == owner)
                    .map(|t| t.relayed.clone())
            };
            match found {
                Some(None) if !own.iter().any(|o| o == id) => own.push(id.to_owned()),
                Some(Some(r))
                    if r.connection.upstream.modern()
                        && !relayed.iter().any(|(o, _, _)| o == id) =>
                {
                    let watch = self.watches.watch_task(&r.connection, &r.upstream_id);
                    relayed.push((id.to_owned(), r, watch));
                }
                _ => {}
            }
        }
        (own, relayed)
    }

    /// Watches the resources a listen asked about that the policy lets
    /// the agent read and whose server offers subscriptions (an HTTP one:
    /// a stdio server's updates are not heard).
    async fn watch(
        &self,
        asked: &Value,
        evaluator: &Evaluator,
        sources: &Sources<'_>,
    ) -> Vec<Watch> {
        let uris = asked.get("resourceSubscriptions").and_then(Value::as_array);
        let mut watching = Vec::new();
        for uri in uris.into_iter().flatten().filter_map(Value::as_str) {
            if watching.len() == MAX_WATCHED || watching.iter().any(|w: &Watch| w.uri == uri) {
                continue;
            }
            let params = json!({"uri": uri});
            let read = Request {
                id: None,
                method: "resources/read",
                params: Some(&params),
            };
            if evaluator.evaluate(&read).decision != Decision::Allow {
                continue;
            }
            let route = sources
                .listings
                .resource_route(sources.connections, uri, evaluator);
            let Some(connection) = Box::pin(route).await else {
                continue;
            };
            if subscribable(&connection) {
                watching.push(self.watches.watch(&connection, uri));
            }
        }
        watching
    }
}

fn allowed(evaluator: &Evaluator, method: &str) -> bool {
    let request = Request {
        id: None,
        method,
        params: None,
    };
    evaluator.evaluate(&request).decision == Decision::Allow
}

const UPDATED: &str = "notifications/resources/updated";
const TASK_NOTE: &str = "notifications/tasks";

impl Subscription {
    /// `notifications/tasks` with a task as `tasks/get` shows it.
    fn task_note(&self, mut view: Value) -> Value {
        view["_meta"] = json!({META_SUBSCRIPTION: self.id});
        json!({"jsonrpc": "2.0", "method": TASK_NOTE, "params": view})
    }

    fn own_task_note(&self, id: &str) -> Option<Value> {
        let view = self.tasks.own_view(id, &self.owner)?;
        Some(self.task_note(view))
    }

    /// A server's `notifications/tasks` about a task this subscription
    /// follows, checked as `tasks/get` answers are and shown as they are:
    /// redacted (the connection's credentials, DLP) under the gateway's id.
    fn relayed_task_note(&self, connection: &str, note: &Value) -> Option<Value> {
        let task = note.get("params")?;
        let upstream_id = task.get("taskId").and_then(Value::as_str)?;
        let (id, relayed, _) = self.relayed_tasks.iter().find(|(_, r, _)| {
            r.upstream_id == upstream_id && r.connection.connection().name == connection
        })?;
        if let Err(failure) = aip_mcp::protocol::check_task(task) {
            let why = match &failure {
                aip_mcp::Failure::Malformed(what) => what.clone(),
                other => other.explained(),
            };
            tracing::warn!(connection, error = %why, "a server's task notification is malformed; dropped");
            return None;
        }
        self.tasks.saw_status(id, super::tasks::status_of(task));
        let (connection, tool) = (&relayed.connection, &relayed.tool);
        let view = task_view(&self.audit, task, id, connection, tool, &self.evaluator);
        Some(self.task_note(view))
    }

    /// The resource an update from `connection` is about, when this
    /// subscription watches it there.
    fn watched(&self, connection: &str, note: &Value) -> Option<String> {
        let uri = note.pointer("/params/uri").and_then(Value::as_str)?;
        self.watching
            .iter()
            .any(|w| w.uri == uri && w.connection() == connection)
            .then(|| uri.to_owned())
    }

    /// The first message on the stream: what the subscription covers.
    pub fn acknowledgement(&self) -> Value {
        json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {META_SUBSCRIPTION: self.id}, "notifications": self.honored}})
    }

    /// The last: the subscription ended by the gateway.
    pub fn closing(&self) -> Value {
        json!({"jsonrpc": "2.0", "id": self.id, "result": {"resultType": "complete",
            "_meta": {META_SUBSCRIPTION: self.id, aip_mcp::modern::META_SERVER_INFO: server_info()}}})
    }

    /// The next notification for the agent, tagged; None once the gateway
    /// stops.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let tools = async {
                match self.tools_changed.as_mut() {
                    Some(changes) => changes.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let method = tokio::select! {
                changed = self.task_changes.recv(), if !self.own_tasks.is_empty() => match changed {
                    Ok(id) if self.own_tasks.contains(&id) => match self.own_task_note(&id) {
                        Some(note) => return Some(note),
                        None => continue,
                    },
                    Err(broadcast::error::RecvError::Closed) => return None,
                    _ => continue,
                },
                changed = tools => match changed {
                    true => "notifications/tools/list_changed",
                    false => return None,
                },
                note = self.notes.recv() => match note {
                    Ok((connection, note)) => match note.get("method").and_then(Value::as_str) {
                        Some(TASK_NOTE) => match self.relayed_task_note(&connection, &note) {
                            Some(note) => return Some(note),
                            None => continue,
                        },
                        Some(UPDATED) => match self.watched(&connection, &note) {
                            Some(uri) => return Some(json!({"jsonrpc": "2.0", "method": UPDATED,
                                "params": {"_meta": {META_SUBSCRIPTION: self.id}, "uri": uri}})),
                            None => continue,
                        },
                        Some("notifications/prompts/list_changed") if self.prompts => {
                            "notifications/prompts/list_changed"
                        }
                        Some("notifications/resources/list_changed") if self.resources => {
                            "notifications/resources/list_changed"
                        }
                        _ => continue,
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                () = self.shutdown.cancelled() => return None,
            };
            return Some(json!({"jsonrpc": "2.0", "method": method,
                "params": {"_meta": {META_SUBSCRIPTION: self.id}}}));
        }
    }
}

/// What a legacy session hears on its standalone stream: its tool list
/// changes, its servers' prompts and resources list changes (where the
/// policy allows listing them) and updates of the resources it subscribed
/// to (`resources/subscribe`, kept by the gateway for the session).
pub struct SessionNotes {
    tools_changed: watch::Receiver<u64>,
    watches: Arc<SessionWatches>,
    session: String,
    prompts: bool,
    resources: bool,
    notes: broadcast::Receiver<(String, Value)>,
}

impl Subscriptions {
    /// The notes for `session`'s standalone stream (see `SessionNotes`),
    /// under the policy of `evaluator`, from servers offering `upstream`.
    pub(super) fn session_notes(
        &self,
        session: &str,
        evaluator: &Evaluator,
        upstream: &Value,
    ) -> SessionNotes {
        let announces =
            |kind: &str| upstream.pointer(&format!("/{kind}/listChanged")) == Some(&json!(true));
        SessionNotes {
            tools_changed: self.tools_changed(),
            watches: self.sessions.clone(),
            session: session.to_owned(),
            prompts: announces("prompts") && allowed(evaluator, "prompts/list"),
            resources: announces("resources") && allowed(evaluator, "resources/list"),
            notes: self.notes.subscribe(),
        }
    }

    /// A legacy session's `resources/subscribe` or `resources/unsubscribe`:
    /// for a resource the policy lets it read whose HTTP server offers
    /// subscriptions, the gateway keeps the watch (and the server
    /// subscribed) and answers; None for anything else, which goes to the
    /// server as before.
    pub(super) async fn session_subscription(
        &self,
        message: &Message,
        caller: &Call,
        sources: Sources<'_>,
    ) -> Option<Reply> {
        let evaluator = &*caller.evaluator;
        let id = message.id().cloned().unwrap_or(Value::Null);
        let uri = super::listings::string_param(message, "uri");
        let params = json!({"uri": uri});
        let read = Request {
            id: Some(&id),
            method: "resources/read",
            params: Some(&params),
        };
        let verdict = evaluator.evaluate(&read);
        if verdict.decision != Decision::Allow {
            return Some(verdict.response().map_or(Reply::Nothing, Reply::Message));
        }
        let route = sources
            .listings
            .resource_route(sources.connections, &uri, evaluator);
        let connection = Box::pin(route).await;
        let connection = connection.filter(|c| caller.era.has_sessions() && subscribable(c))?;
        let mut sessions = aip_service::sync::lock(&self.sessions.0);
        let watching = sessions.entry(caller.session.clone()).or_default();
        let name = &connection.connection().name;
        let known = |w: &Watch| w.uri == uri && w.connection() == name.as_str();
        if message.method() == Some("resources/unsubscribe") {
            watching.retain(|w| !known(w));
        } else if !watching.iter().any(known) {
            if watching.len() >= MAX_SESSION_WATCHES {
                let why = format!("a session watches at most {MAX_SESSION_WATCHES} resources");
                return Some(Reply::Message(super::present::error(
                    Some(&id),
                    codes::INVALID_PARAMS,
                    &why,
                    None,
                )));
            }
            watching.push(self.watches.watch(&connection, &uri));
        }
        Some(Reply::Message(
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        ))
    }
}

/// Whether the gateway can hear a connection's resource updates: an HTTP
/// server that offers subscriptions.
fn subscribable(connection: &ConnectionState) -> bool {
    connection
        .upstream
        .server_offers(&["resources", "subscribe"])
}

impl SessionNotes {
    /// The next note for the session; None once the gateway stops.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let heard = tokio::select! {
                changed = self.tools_changed.changed() => {
                    changed.ok()?;
                    return Some(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
                }
                heard = self.notes.recv() => heard,
            };
            let (connection, note) = match heard {
                Ok(heard) => heard,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            let method = note
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let passed = match method {
                "notifications/prompts/list_changed" => self.prompts,
                "notifications/resources/list_changed" => self.resources,
                UPDATED => {
                    let uri = note.pointer("/params/uri").and_then(Value::as_str);
                    uri.is_some_and(|uri| self.watches.watches(&self.session, &connection, uri))
                }
                _ => false,
            };
            if !passed {
                continue;
            }
            let mut out = json!({"jsonrpc": "2.0", "method": method});
            if let Some(uri) = note.pointer("/params/uri") {
                out["params"] = json!({"uri": uri});
            }
            return Some(out);
        }
    }
}

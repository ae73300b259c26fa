//! Approvals as tasks (the MCP tasks extension, 2026-07-28). When an agent
//! that declared the extension makes a call an `ask` rule holds, the
//! gateway answers at once with a task instead of holding the request
//! open: the ask goes to a person as it would (an ApprovalRequest in
//! Kubernetes), and the call runs — exactly once — when they approve; the
//! agent polls `tasks/get` for the result, from any connection (the wait is
//! the gateway's, not the connection's). A denial or an expiry fails the
//! task with the AIP error the held call would have got; `tasks/cancel`
//! withdraws the ask (or cancels the call if it is running).
//!
//! A task id is 128 random bits and works only for the agent that made it
//! (the `clientInfo` name it declared — self-reported: on the pod's
//! loopback every caller is the same pod, so the id's secrecy is what keeps
//! one agent's task from another). At most `MAX_TASKS` are kept; each is
//! forgotten `RETENTION` after it ends.
//!
//! ## Servers' tasks
//!
//! A server's own tasks are relayed (the tasks extension, 2026-07-28). A
//! modern agent that declares the extension has it passed on to a modern
//! server that announced it; when the server answers a call with a task,
//! the agent gets that task under a gateway id — 128 random bits, bound to
//! the agent that made the call, in the same table as the gateway's own
//! tasks — and the server's id never leaves the gateway. Each `tasks/get`,
//! `tasks/update` and `tasks/cancel` is authorized again (the tool must
//! still be one the policy lets the agent call) and relayed to the server
//! that holds the task; what comes back is checked as the extension has
//! it, and what the server says of a task — polled, or heard on a listen
//! stream — gets the credential and DLP redaction a direct result gets
//! (`present::redact_for_agent`).
//!
//! The gateway keeps its binding as long as the server's `ttlMs` says, at
//! most `MAX_TTL`, and `RETENTION` past an end it has seen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aip_mcp::jsonrpc::Message;
use aip_mcp::modern::{MISSING_CAPABILITY, TASKS_EXTENSION, declares_tasks};
use aip_mcp::protocol::{TASK_STATUSES, check_task};
use aip_mcp::{Exchange, Failure};
use aip_policy::{Evaluator, Listing, codes};
use aip_service::sync::lock;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::call::{Ids, Reply};
use super::present::{Findings, error, redact_for_agent};
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// Tasks kept at once, at most; past it an ask is held in its request.
const MAX_TASKS: usize = 1024;
/// How long an ended task stays readable.
const RETENTION: Duration = Duration::from_secs(600);
/// How often an agent is asked to poll.
const POLL_INTERVAL_MS: u64 = 1000;

/// The tasks the gateway keeps: its own (approvals) and servers' it
/// relays, each under an id of its own.
pub(super) struct Tasks {
    pub(super) table: Mutex<HashMap<String, Task>>,
    /// The id of each of the gateway's own tasks as its status changes
    /// (for `notifications/tasks`).
    pub(super) changes: tokio::sync::broadcast::Sender<String>,
    /// How long an approval task lives: the ask's patience, a minute more,
    /// and the retention after its end.
    ttl: Duration,
}

/// Where a server's task lives.
#[derive(Clone)]
pub(super) struct ServerTask {
    pub(super) connection: Arc<ConnectionState>,
    /// The server's id for it: never shown to the agent.
    pub(super) upstream_id: String,
    /// The tool, as the agent calls it.
    pub(super) tool: String,
}

pub(super) struct Task {
    pub(super) owner: String,
    pub(super) status: &'static str,
    message: String,
    created: SystemTime,
    updated: SystemTime,
    /// When it is forgotten.
    pub(super) expires: SystemTime,
    /// The call's response once it ended (`result` or `error`).
    outcome: Option<Value>,
    cancel: CancellationToken,
    /// A server's task: where it lives (None for the gateway's own).
    pub(super) relayed: Option<ServerTask>,
}

impl Tasks {
    /// Forgets expired tasks and keeps `task` under a fresh id, when there
    /// is room.
    /// Tasks for asks that wait at most `patience`.
    pub(super) fn new(patience: Duration) -> Tasks {
        Tasks {
            table: Mutex::default(),
            changes: tokio::sync::broadcast::Sender::new(64),
            ttl: patience + Duration::from_secs(60) + RETENTION,
        }
    }

    /// The gateway's task `id` as `tasks/get` shows it to `owner`; None
    /// for another's, or a server's.
    pub(super) fn own_view(&self, id: &str, owner: &str) -> Option<Value> {
        let tasks = lock(&self.table);
        let task = tasks
            .get(id)
            .filter(|t| t.owner == owner && t.relayed.is_none())?;
        Some(task.view(id, self.ttl))
    }

    /// Records the status a server's task `gateway_id` was seen in; an
    /// ended one is kept `RETENTION` more at most.
    pub(super) fn saw_status(&self, gateway_id: &str, status: &'static str) {
        if let Some(task) = lock(&self.table).get_mut(gateway_id) {
            task.status = status;
            if terminal(status) {
                task.expires = task.expires.min(SystemTime::now() + RETENTION);
            }
        }
    }

    pub(super) fn insert(&self, task: Task) -> Option<String> {
        let id = format!("{:032x}", rand::random::<u128>());
        let mut tasks = lock(&self.table);
        let now = SystemTime::now();
        tasks.retain(|_, t| t.expires > now);
        if tasks.len() >= MAX_TASKS {
            return None;
        }
        tasks.insert(id.clone(), task);
        Some(id)
    }
}

impl Task {
    /// A server's task, as the gateway keeps it: whose it is and where it
    /// lives, until `expires`.
    pub(super) fn relayed(
        owner: String,
        status: &'static str,
        expires: SystemTime,
        relayed: ServerTask,
    ) -> Task {
        let now = SystemTime::now();
        Task {
            owner,
            status,
            message: String::new(),
            created: now,
            updated: now,
            expires,
            outcome: None,
            cancel: CancellationToken::new(),
            relayed: Some(relayed),
        }
    }

    fn ended(&self) -> bool {
        self.outcome.is_some() || self.status == "cancelled"
    }

    /// The task as `tasks/get` (and the creating result) show it.
    fn view(&self, id: &str, ttl: Duration) -> Value {
        let mut view = json!({
            "taskId": id,
            "status": self.status,
            "statusMessage": self.message,
            "createdAt": rfc3339(self.created),
            "lastUpdatedAt": rfc3339(self.updated),
            "ttlMs": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            "pollIntervalMs": POLL_INTERVAL_MS,
        });
        match &self.outcome {
            Some(outcome) if outcome.get("error").is_some() => {
                view["error"] = outcome["error"].clone()
            }
            Some(outcome) => view["result"] = outcome.get("result").cloned().unwrap_or(Value::Null),
            None => {}
        }
        view
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Who a modern request says it is.
pub(super) fn owner_of(message: &Message) -> String {
    aip_mcp::modern::client_name(&message.value).to_owned()
}

impl Tasks {
    /// Opens a task for an ask of `message`'s: its id, how the agent is
    /// first shown it, and what cancels its work; None when there is no
    /// room (the call is then held in its request).
    pub(super) fn open_approval(
        &self,
        message: &Message,
    ) -> Option<(String, Value, CancellationToken)> {
        let now = SystemTime::now();
        let cancel = CancellationToken::new();
        let task = Task {
            owner: owner_of(message),
            status: "working",
            message: "waiting for human approval".to_owned(),
            created: now,
            updated: now,
            expires: now + self.ttl,
            outcome: None,
            cancel: cancel.clone(),
            relayed: None,
        };
        let mut created = task.view("", self.ttl);
        let id = self.insert(task)?;
        created["taskId"] = json!(id);
        created["resultType"] = json!("task");
        Some((id, created, cancel))
    }

    /// Sets task `id`'s status (unless it ended already) and says so to
    /// its followers.
    pub(super) fn update(
        &self,
        id: &str,
        status: &'static str,
        message: &str,
        outcome: Option<Value>,
    ) {
        if let Some(task) = lock(&self.table).get_mut(id).filter(|t| !t.ended()) {
            task.status = status;
            message.clone_into(&mut task.message);
            task.updated = SystemTime::now();
            task.outcome = outcome;
            let _ = self.changes.send(id.to_owned());
        }
    }

    /// Answers a request for one of the gateway's own tasks; a server's
    /// task is given back (Err) to be relayed.
    pub(super) fn own_request(&self, message: &Message) -> Result<Reply, (String, ServerTask)> {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let method = message.method().unwrap_or_default();
        if !declares_tasks(&message.value) {
            let why = format!(
                "{method} needs the {TASKS_EXTENSION} extension declared in the request's capabilities"
            );
            let data = json!({"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}});
            return Ok(Reply::Message(error(
                Some(&id),
                MISSING_CAPABILITY,
                &why,
                Some(data),
            )));
        }
        let task_id = message
            .params()
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let owner = owner_of(message);
        let ttl = self.ttl;
        let mut tasks = lock(&self.table);
        let now = SystemTime::now();
        tasks.retain(|_, t| t.expires > now);
        let Some(task) = tasks.get_mut(task_id).filter(|t| t.owner == owner) else {
            return Ok(Reply::Message(task_not_found(&id, task_id)));
        };
        if let Some(relayed) = &task.relayed {
            return Err((task_id.to_owned(), relayed.clone()));
        }
        let result = match method {
            "tasks/get" => {
                let mut view = task.view(task_id, ttl);
                view["resultType"] = json!("complete");
                view
            }
            "tasks/cancel" => {
                if !task.ended() {
                    task.cancel.cancel();
                    task.status = "cancelled";
                    "cancelled by the agent".clone_into(&mut task.message);
                    task.updated = now;
                    let _ = self.changes.send(task_id.to_owned());
                }
                json!({"resultType": "complete"})
            }
            "tasks/update" => json!({"resultType": "complete"}), // it asks for no input
            other => return Ok(Reply::Message(super::present::method_not_found(&id, other))),
        };
        Ok(Reply::Message(
            json!({"jsonrpc": "2.0", "id": id, "result": result}),
        ))
    }
}

/// The extension's answer to an id it does not know (or that is another
/// agent's).
pub(super) fn task_not_found(id: &Value, task_id: &str) -> Value {
    let why = format!("Failed to retrieve task: Task not found: {task_id}");
    error(Some(id), codes::INVALID_PARAMS, &why, None)
}

/// Takes the tasks extension out of a modern request's declared
/// capabilities.
pub(super) fn without_tasks(message: &mut Value) {
    let extensions = message
        .pointer_mut("/params/_meta")
        .and_then(|m| m.get_mut(aip_mcp::modern::META_CAPABILITIES))
        .and_then(|c| c.get_mut("extensions"))
        .and_then(Value::as_object_mut);
    if let Some(extensions) = extensions {
        extensions.remove(TASKS_EXTENSION);
    }
}

/// Whether a task in `status` has ended.
pub(super) fn terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// The longest the gateway keeps a server's task.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The fields of a task the agent is shown (the extension's, no others).
const TASK_FIELDS: &[&str] = &[
    "status",
    "statusMessage",
    "createdAt",
    "lastUpdatedAt",
    "ttlMs",
    "pollIntervalMs",
    "result",
    "error",
    "inputRequests",
];

pub(super) fn status_of(task: &Value) -> &'static str {
    let status = task.get("status").and_then(Value::as_str);
    TASK_STATUSES
        .iter()
        .find(|s| Some(**s) == status)
        .copied()
        .unwrap_or("working")
}

/// The servers' tasks, over the values the pipeline hands in: the table
/// they are kept in, the gateway's ids and its audit.
pub(super) struct ServerTasks<'a> {
    pub(super) tasks: &'a Tasks,
    pub(super) ids: &'a Ids,
    pub(super) audit: &'a Audit,
}

impl ServerTasks<'_> {
    /// A server answered a call of `owner`'s with a task (`response`,
    /// checked, not yet redacted): kept under a gateway id and shown to the
    /// agent as its task.
    pub(super) fn created(
        &self,
        response: &Value,
        id: Value,
        connection: &Arc<ConnectionState>,
        tool: &str,
        owner: String,
        evaluator: &Evaluator,
    ) -> Reply {
        let task = &response["result"];
        let upstream_id = task["taskId"].as_str().unwrap_or_default().to_owned();
        let status = status_of(task);
        let ttl = task
            .get("ttlMs")
            .and_then(Value::as_u64)
            .map_or(MAX_TTL, |ms| Duration::from_millis(ms).min(MAX_TTL));
        let relayed = ServerTask {
            connection: connection.clone(),
            upstream_id: upstream_id.clone(),
            tool: tool.to_owned(),
        };
        let mut expires = SystemTime::now() + ttl;
        if terminal(status) {
            expires = expires.min(SystemTime::now() + RETENTION);
        }
        let kept = Task::relayed(owner, status, expires, relayed);
        let Some(gateway_id) = self.tasks.insert(kept) else {
            // No room: the server's task is cancelled, as nobody could
            // read it.
            let cancel = json!({"jsonrpc": "2.0", "id": self.ids.fresh(), "method": "tasks/cancel",
                "params": {"taskId": upstream_id}});
            let connection = connection.clone();
            tokio::spawn(async move { connection.upstream.request(&cancel).await });
            let why =
                "the gateway holds as many tasks as it keeps; the server's task was cancelled";
            return Reply::Message(error(Some(&id), codes::INTERNAL_ERROR, why, None));
        };
        tracing::info!(connection = %connection.connection().name, tool, "a server's task relayed");
        let mut view = task_view(self.audit, task, &gateway_id, connection, tool, evaluator);
        view["resultType"] = json!("task");
        Reply::Message(json!({"jsonrpc": "2.0", "id": id, "result": view}))
    }

    /// `tasks/get`, `tasks/update` or `tasks/cancel` for a server's task,
    /// authorized again: the request for the server that holds it (under a
    /// gateway id and the server's task id), or the refusal.
    pub(super) fn request(
        &self,
        message: &Message,
        relayed: &ServerTask,
        evaluator: &Evaluator,
    ) -> Result<Value, Reply> {
        let id = message.id().cloned().unwrap_or(Value::Null);
        if evaluator.listing(&relayed.tool) == Listing::Hidden {
            let why = format!(
                "Permission denied: the task's tool {} is not allowed by the current policy",
                relayed.tool
            );
            return Err(Reply::Message(error(
                Some(&id),
                codes::FORBIDDEN,
                &why,
                None,
            )));
        }
        let mut request = message.value.clone();
        if let Value::Object(envelope) = &mut request {
            envelope.retain(|k, _| matches!(k.as_str(), "jsonrpc" | "method" | "params"));
            envelope.insert("id".into(), json!(self.ids.fresh()));
        }
        request["params"]["taskId"] = json!(relayed.upstream_id);
        Ok(request)
    }

    /// The server's answer to a request for its task, checked and shown
    /// under the gateway's id; nothing when the agent cancelled.
    pub(super) fn answer(
        &self,
        message: &Message,
        (gateway_id, relayed): (String, ServerTask),
        evaluator: &Evaluator,
        outcome: Option<Result<Exchange, Failure>>,
    ) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let method = message.method().unwrap_or_default();
        let connection = &relayed.connection;
        let name = connection.connection().name.clone();
        let failed = |failure: Failure| {
            // A failure's reason may quote the server.
            let mut e = failure.to_error(&name, Some(&relayed.tool));
            redact_for_agent(&mut e, connection, evaluator, Findings::Unaudited);
            Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}))
        };
        let mut response = match outcome {
            None => return Reply::Nothing,
            Some(Err(failure)) => return failed(failure),
            Some(Ok(exchange)) => exchange.into_response(),
        };
        if let Some(mut e) = response.get_mut("error").map(Value::take) {
            if e.get("code") == Some(&json!(codes::INVALID_PARAMS)) {
                // The server no longer knows it: neither does the gateway.
                lock(&self.tasks.table).remove(&gateway_id);
                return Reply::Message(task_not_found(&id, &gateway_id));
            }
            redact_for_agent(&mut e, connection, evaluator, Findings::Unaudited);
            return Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}));
        }
        let result = match method {
            "tasks/get" => {
                let task = response.get("result").cloned().unwrap_or(Value::Null);
                if let Err(failure) = check_shown(&task, &relayed, message) {
                    // The answer was sent, and is wrong.
                    connection.record_failure("", &failure);
                    return failed(failure);
                }
                self.tasks.saw_status(&gateway_id, status_of(&task));
                let tool = &relayed.tool;
                let mut view =
                    task_view(self.audit, &task, &gateway_id, connection, tool, evaluator);
                view["resultType"] = json!("complete");
                view
            }
            _ => json!({"resultType": "complete"}),
        };
        Reply::Message(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }
}

/// A `tasks/get` answer is the task asked about, as the extension has it,
/// asking only for input the agent declared it can give.
fn check_shown(task: &Value, relayed: &ServerTask, message: &Message) -> Result<(), Failure> {
    check_task(task)?;
    if task["taskId"] != json!(relayed.upstream_id) {
        return Err(Failure::Malformed("task.taskId names another task".into()));
    }
    let declared = aip_mcp::modern::declared_capabilities(&message.value);
    let asks = task.get("inputRequests").and_then(Value::as_object);
    for (key, asked) in asks.into_iter().flatten() {
        let method = asked["method"].as_str().unwrap_or_default();
        let needs = match method {
            "elicitation/create" => "elicitation",
            "sampling/createMessage" => "sampling",
            _ => "roots",
        };
        if declared.get(needs).is_none() {
            return Err(Failure::Malformed(format!(
                "task.inputRequests.{key} asks for {method}, which the agent did not declare"
            )));
        }
    }
    Ok(())
}

/// A server's task (from `connection`) as the agent sees it: the
/// extension's fields, redacted as a direct result of `tool` would be,
/// under the gateway's id. Every path that shows one comes here: the
/// call's answer, `tasks/get`, and a listen stream's notification.
pub(super) fn task_view(
    audit: &Audit,
    task: &Value,
    gateway_id: &str,
    connection: &ConnectionState,
    tool: &str,
    evaluator: &Evaluator,
) -> Value {
    let mut view = Value::Object(Map::new());
    for field in TASK_FIELDS {
        if let Some(value) = task.get(*field) {
            view[*field] = value.clone();
        }
    }
    let findings = Findings::OfTool(audit, tool);
    redact_for_agent(&mut view, connection, evaluator, findings);
    view["taskId"] = json!(gateway_id);
    view
}

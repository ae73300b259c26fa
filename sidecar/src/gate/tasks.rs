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
//! An upstream server's own tasks are relayed too (relayed_tasks.rs): the
//! agent sees them under gateway ids in the same table, bound the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aip_mcp::jsonrpc::Message;
use aip_mcp::modern::{MISSING_CAPABILITY, TASKS_EXTENSION, declares_tasks};
use aip_policy::codes;
use aip_service::sync::lock;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::call::Reply;
use super::present::error;
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

//! A server's own tasks, relayed (the tasks extension, 2026-07-28). A
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

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aip_mcp::jsonrpc::Message;
use aip_mcp::protocol::{TASK_STATUSES, check_task};
use aip_mcp::{Exchange, Failure};
use aip_policy::{Evaluator, Listing, codes};
use aip_service::sync::lock;
use serde_json::{Map, Value, json};

use super::call::{Ids, Reply};
use super::present::{Findings, error, redact_for_agent};
use super::tasks::{ServerTask, Task, Tasks, task_not_found, terminal};
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// The longest the gateway keeps a server's task.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a task the gateway saw end stays readable.
const RETENTION: Duration = Duration::from_secs(600);

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
            Some(Ok(exchange)) => exchange.response,
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

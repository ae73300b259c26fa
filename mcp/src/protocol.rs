//! The parts of MCP every transport shares: protocol versions, the
//! client capabilities a connection offers, what one exchange returns, and
//! listing a server's tools page by page.

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::connection::Connection;
use crate::failure::Failure;

/// A request's `params._meta.progressToken`, if it asked for progress
/// (looked up by key: `Value::pointer` parses its path on every call).
pub fn progress_token(request: &Value) -> Option<&Value> {
    request.get("params")?.get("_meta")?.get("progressToken")
}

/// The protocol version the gateway asks for, and those it accepts back.
pub const PROTOCOL_VERSION: &str = "2025-11-25";
pub const ACCEPTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// What came back for a request: the response, and, when it came as one
/// JSON body, the bytes it was parsed from (the strict parser accepted
/// them), so that a response nothing must change in is passed on as it
/// came instead of being written again. The response can be changed only
/// by taking it out ([`Exchange::into_response`]), which lets the bytes go:
/// bytes kept never disagree with the response.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    response: Value,
    text: Option<bytes::Bytes>,
    /// The session that carried the exchange.
    pub session_id: Option<String>,
}

impl Exchange {
    pub fn new(response: Value, session_id: Option<String>) -> Exchange {
        Exchange {
            response,
            text: None,
            session_id,
        }
    }

    /// `response` and the bytes it was parsed from.
    pub fn parsed(response: Value, text: bytes::Bytes, session_id: Option<String>) -> Exchange {
        Exchange {
            response,
            text: Some(text),
            session_id,
        }
    }

    pub fn response(&self) -> &Value {
        &self.response
    }

    pub fn into_response(self) -> Value {
        self.response
    }

    /// The response and, when kept, the bytes it was parsed from.
    pub fn into_parts(self) -> (Value, Option<bytes::Bytes>) {
        (self.response, self.text)
    }
}

/// Every method MCP defines, in either direction (both protocol eras): a
/// gateway refuses other spellings of these rather than let a lenient
/// server read them as the method the policy saw.
pub const METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "logging/setLevel",
    "completion/complete",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "tasks/update",
    "server/discover",
    "subscriptions/listen",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/message",
    "notifications/roots/list_changed",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/resources/updated",
    "notifications/elicitation/complete",
    "notifications/tasks/status",
];

/// The `params` keys MCP defines for a client's request or notification,
/// in either era, with `_meta` (which the specification permits in every
/// params): what a gateway forwards of them. None for a method whose
/// params are not the core specification's to say (a server's own method;
/// the tasks extension's `tasks/update`), which go as they came.
///
/// `task` is 2025-11-25's task augmentation of a call (which the gateway
/// refuses by name); `inputResponses` and `requestState` are 2026-07-28's
/// retry of a request that asked for input.
pub fn params_keys(method: &str) -> Option<&'static [&'static str]> {
    let keys: &'static [&'static str] = match method {
        "initialize" => &["protocolVersion", "capabilities", "clientInfo", "_meta"],
        "ping" | "server/discover" => &["_meta"],
        "notifications/initialized" | "notifications/roots/list_changed" => &["_meta"],
        "tools/list"
        | "prompts/list"
        | "resources/list"
        | "resources/templates/list"
        | "tasks/list" => &["cursor", "_meta"],
        "tools/call" => &[
            "name",
            "arguments",
            "task",
            "inputResponses",
            "requestState",
            "_meta",
        ],
        "prompts/get" => &[
            "name",
            "arguments",
            "inputResponses",
            "requestState",
            "_meta",
        ],
        "resources/read" => &["uri", "inputResponses", "requestState", "_meta"],
        "resources/subscribe" | "resources/unsubscribe" => &["uri", "_meta"],
        "completion/complete" => &[
            "ref",
            "argument",
            "context",
            "inputResponses",
            "requestState",
            "_meta",
        ],
        "logging/setLevel" => &["level", "_meta"],
        "tasks/get" | "tasks/result" | "tasks/cancel" => &["taskId", "_meta"],
        "subscriptions/listen" => &["notifications", "_meta"],
        "notifications/cancelled" => &["requestId", "reason", "_meta"],
        "notifications/progress" => &["progressToken", "progress", "total", "message", "_meta"],
        _ => return None,
    };
    Some(keys)
}

/// Drops the keys of `message`'s params that its method does not define
/// (see [`params_keys`]); the keys dropped, in order.
pub fn drop_undefined_params(message: &mut Value) -> Vec<String> {
    let method = message.get("method").and_then(Value::as_str);
    let Some(defined) = method.and_then(params_keys) else {
        return Vec::new();
    };
    let Some(Value::Object(params)) = message.get_mut("params") else {
        return Vec::new();
    };
    let undefined: Vec<String> = params
        .keys()
        .filter(|k| !defined.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in &undefined {
        params.remove(key);
    }
    undefined
}

/// What a server sends when its tool list changed: the catalog is
/// refreshed at once rather than at the next interval.
pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";

/// A request to send: the message, and where its sender has one, a text
/// that says exactly what the message says (the agent's own bytes with a
/// few members spliced, `raw`), sent as it is rather than the message
/// written out again. The message stays the authority: a transport that
/// must change the request (its era's `_meta`) splices the text the same
/// way or writes the message.
#[derive(Clone)]
pub struct Outgoing<'a> {
    pub message: &'a Value,
    pub text: Option<&'a [u8]>,
    /// Where in `text` the `params._meta` object lies, when its sender
    /// found it while splicing (so that it is not looked for again).
    pub meta_at: Option<std::ops::Range<usize>>,
}

impl<'a> From<&'a Value> for Outgoing<'a> {
    fn from(message: &'a Value) -> Self {
        Outgoing {
            message,
            text: None,
            meta_at: None,
        }
    }
}

/// Where the server messages related to one request go.
pub type Related = mpsc::UnboundedSender<Value>;

/// The client capabilities a connection offers its server: none unless it
/// opts in.
pub fn client_capabilities(connection: &Connection) -> Value {
    let c = connection.capabilities;
    let mut caps = serde_json::Map::new();
    if c.sampling {
        caps.insert("sampling".into(), json!({}));
    }
    if c.elicitation {
        caps.insert("elicitation".into(), json!({}));
    }
    if c.roots {
        caps.insert("roots".into(), json!({"listChanged": false}));
    }
    Value::Object(caps)
}

/// Checks a modern server's request for more input (MRTR): `inputRequests`
/// a map of elicitation, sampling or roots requests, `requestState` a
/// string, at least one of them.
pub fn check_input_required(result: &Value) -> Result<(), Failure> {
    let malformed = |what: String| Err(Failure::Malformed(what));
    let requests = result.get("inputRequests");
    let state = result.get("requestState");
    if requests.is_none() && state.is_none() {
        return malformed(
            "an input_required result has neither inputRequests nor requestState".into(),
        );
    }
    if state.is_some_and(|s| !s.is_string()) {
        return malformed("result.requestState is not a string".into());
    }
    let Some(requests) = requests else {
        return Ok(());
    };
    let Some(requests) = requests.as_object() else {
        return malformed("result.inputRequests is not an object".into());
    };
    for (key, request) in requests {
        let method = request.get("method").and_then(Value::as_str);
        if !matches!(
            method,
            Some("elicitation/create" | "sampling/createMessage" | "roots/list")
        ) {
            return malformed(format!(
                "result.inputRequests.{key}.method is not elicitation/create, sampling/createMessage or roots/list"
            ));
        }
        if request.get("params").is_some_and(|p| !p.is_object()) {
            return malformed(format!(
                "result.inputRequests.{key}.params is not an object"
            ));
        }
    }
    Ok(())
}

/// Whether a result is a task (`resultType: "task"`, the tasks extension).
pub fn is_task(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("task")
}

/// The longest task id relayed: ids are handles, not payloads.
pub const MAX_TASK_ID: usize = 256;

/// The statuses a task may have.
pub const TASK_STATUSES: &[&str] = &[
    "working",
    "input_required",
    "completed",
    "cancelled",
    "failed",
];

/// Checks a task as a server shows it (its `CreateTaskResult`, a
/// `tasks/get` result) against the tasks extension: an id, a known status,
/// the timestamps as strings, the durations as integer milliseconds, and
/// what its status carries — a completed task's `result` a CallToolResult,
/// a failed one's `error` a JSON-RPC error, an input-required one's
/// `inputRequests` as an MRTR result has them. What fails is named.
pub fn check_task(task: &Value) -> Result<(), Failure> {
    let malformed = |what: String| Err(Failure::Malformed(what));
    match task.get("taskId").and_then(Value::as_str) {
        Some(id) if !id.is_empty() && id.len() <= MAX_TASK_ID => {}
        _ => {
            return malformed(format!(
                "task.taskId is not a string of 1 to {MAX_TASK_ID} bytes"
            ));
        }
    }
    let Some(status) = task
        .get("status")
        .and_then(Value::as_str)
        .filter(|s| TASK_STATUSES.contains(s))
    else {
        return malformed(format!(
            "task.status is not one of {}",
            TASK_STATUSES.join(", ")
        ));
    };
    for field in ["createdAt", "lastUpdatedAt"] {
        if !task.get(field).is_some_and(Value::is_string) {
            return malformed(format!("task.{field} is missing or not a string"));
        }
    }
    if !task.get("ttlMs").is_some_and(|t| t.is_null() || t.is_u64()) {
        return malformed("task.ttlMs is not null or integer milliseconds".into());
    }
    if task.get("pollIntervalMs").is_some_and(|p| !p.is_u64()) {
        return malformed("task.pollIntervalMs is not integer milliseconds".into());
    }
    match status {
        "completed" => {
            let Some(result) = task.get("result") else {
                return malformed("a completed task has no result".into());
            };
            check_call_result(&serde_json::json!({"result": result})).map_err(|f| match f {
                Failure::Malformed(what) => Failure::Malformed(format!("task.{what}")),
                other => other,
            })
        }
        "failed" => {
            let error = task.get("error");
            let code = error.and_then(|e| e.get("code"));
            let message = error.and_then(|e| e.get("message"));
            if !code.is_some_and(Value::is_i64) || !message.is_some_and(Value::is_string) {
                return malformed("a failed task's error is not a JSON-RPC error".into());
            }
            Ok(())
        }
        "input_required" if task.get("inputRequests").is_none() => {
            malformed("an input_required task has no inputRequests".into())
        }
        "input_required" => check_input_required(task),
        _ => Ok(()),
    }
}

/// A server that never stops paging cannot stall a health check.
const MAX_LIST_PAGES: usize = 64;

/// Lists every page of a server's tools/list: `send` makes one exchange of
/// the request it is given (which still needs an id).
pub(crate) async fn list_all_tools<F, Fut>(mut send: F) -> Result<Vec<Value>, Failure>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = Result<Exchange, Failure>>,
{
    let mut tools = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_LIST_PAGES {
        let mut list = json!({"jsonrpc": "2.0", "method": "tools/list"});
        if let Some(c) = cursor.take() {
            list["params"] = json!({ "cursor": c });
        }
        let exchange = send(list).await?;
        tools.extend(tools_of(exchange.response())?);
        match exchange.response().pointer("/result/nextCursor") {
            Some(Value::String(next)) if !next.is_empty() => cursor = Some(json!(next)),
            _ => return Ok(tools),
        }
    }
    Err(Failure::Malformed(format!(
        "tools/list did not end within {MAX_LIST_PAGES} pages"
    )))
}

/// The tools of a tools/list response.
pub fn tools_of(response: &Value) -> Result<Vec<Value>, Failure> {
    response
        .pointer("/result/tools")
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| Failure::Malformed("tools/list result has no tools array".into()))
}

/// Checks a tools/call response's result against MCP's CallToolResult: a
/// `content` array of content blocks, each with its `type` and the fields
/// that type requires as strings; `structuredContent` an object and
/// `isError` a boolean when present. What fails is named by its path. An
/// error response has no result to check.
pub fn check_call_result(response: &Value) -> Result<(), Failure> {
    let Some(result) = response.get("result") else {
        return Ok(());
    };
    let malformed = |what: String| Err(Failure::Malformed(what));
    match result.get("resultType") {
        None => {}
        Some(Value::String(kind)) if kind == "complete" => {}
        Some(Value::String(kind)) if kind == "input_required" => {
            return check_input_required(result);
        }
        Some(Value::String(kind)) if kind == "task" => {
            return malformed(
                "result.resultType \"task\" answers a request that did not offer the tasks extension"
                    .into(),
            );
        }
        Some(other) => {
            return malformed(format!(
                "result.resultType {other} is not one the gateway can relay"
            ));
        }
    }
    let Some(content) = result.get("content") else {
        return malformed("result.content is missing".into());
    };
    let Some(blocks) = content.as_array() else {
        return malformed("result.content is not an array".into());
    };
    for (i, block) in blocks.iter().enumerate() {
        // Written only for the error: every call with content passes here.
        let at = || format!("result.content[{i}]");
        let Some(kind) = block.get("type").and_then(Value::as_str) else {
            return malformed(format!("{}.type is missing or not a string", at()));
        };
        let required: &[&str] = match kind {
            "text" => &["text"],
            "image" | "audio" => &["data", "mimeType"],
            "resource_link" => &["uri", "name"],
            "resource" => &[],
            _ => &[], // a newer block type: only its type is known
        };
        for field in required {
            if !block.get(*field).is_some_and(Value::is_string) {
                return malformed(format!("{}.{field} is missing or not a string", at()));
            }
        }
        if kind == "resource" {
            let resource = block.get("resource");
            if !resource
                .and_then(|r| r.get("uri"))
                .is_some_and(Value::is_string)
            {
                return malformed(format!("{}.resource.uri is missing or not a string", at()));
            }
        }
    }
    if result
        .get("structuredContent")
        .is_some_and(|v| !v.is_object())
    {
        return malformed("result.structuredContent is not an object".into());
    }
    if result.get("isError").is_some_and(|v| !v.is_boolean()) {
        return malformed("result.isError is not a boolean".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(status: &str) -> Value {
        json!({"taskId": "t-1", "status": status, "createdAt": "2026-12-03T10:00:00Z",
            "lastUpdatedAt": "2026-12-03T10:00:00Z", "ttlMs": 1000})
    }

    fn reason(task: &Value) -> String {
        match check_task(task) {
            Err(Failure::Malformed(what)) => what,
            other => panic!("{task} was not refused as malformed: {other:?}"),
        }
    }

    #[test]
    fn a_task_is_checked_as_the_extension_describes_it() {
        assert!(check_task(&task("working")).is_ok());
        assert!(check_task(&task("cancelled")).is_ok());
        let mut done = task("completed");
        done["result"] = json!({"content": [{"type": "text", "text": "ok"}]});
        assert!(check_task(&done).is_ok());

        assert!(reason(&task("running")).contains("task.status"));
        assert!(reason(&task("completed")).contains("no result"));
        done["result"] = json!({"content": {}});
        assert_eq!(reason(&done), "task.result.content is not an array");
        assert!(reason(&task("failed")).contains("JSON-RPC error"));
        assert!(reason(&task("input_required")).contains("inputRequests"));
        let mut long = task("working");
        long["taskId"] = json!("x".repeat(MAX_TASK_ID + 1));
        assert!(reason(&long).contains("taskId"));
        let mut fractional = task("working");
        fractional["ttlMs"] = json!(1.5);
        assert!(reason(&fractional).contains("ttlMs"));
        let mut unlimited = task("working");
        unlimited["ttlMs"] = Value::Null;
        assert!(check_task(&unlimited).is_ok());
    }

    #[test]
    fn a_task_answering_a_request_that_offered_none_is_refused() {
        let mut created = task("working");
        created["resultType"] = json!("task");
        let refused = check_call_result(&json!({"result": created}));
        assert!(
            matches!(&refused, Err(Failure::Malformed(w)) if w.contains("did not offer")),
            "{refused:?}"
        );
    }
}

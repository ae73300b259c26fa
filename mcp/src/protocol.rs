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

/// What came back for a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    pub response: Value,
    /// The session that carried the exchange.
    pub session_id: Option<String>,
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

/// What a server sends when its tool list changed: the catalog is
/// refreshed at once rather than at the next interval.
pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";

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
        tools.extend(tools_of(&exchange.response)?);
        match exchange.response.pointer("/result/nextCursor") {
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
        let at = format!("result.content[{i}]");
        let Some(kind) = block.get("type").and_then(Value::as_str) else {
            return malformed(format!("{at}.type is missing or not a string"));
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
                return malformed(format!("{at}.{field} is missing or not a string"));
            }
        }
        if kind == "resource" {
            let resource = block.get("resource");
            if !resource
                .and_then(|r| r.get("uri"))
                .is_some_and(Value::is_string)
            {
                return malformed(format!("{at}.resource.uri is missing or not a string"));
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

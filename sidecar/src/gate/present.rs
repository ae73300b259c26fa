//! What the agent is shown: the tool list as the policy lets it see it
//! (hidden tools left out, `ask` tools marked), the gateway's own answers,
//! and the one redaction everything relayed to it from a server passes
//! ([`redact_for_agent`]).

use std::time::SystemTime;

use aip_mcp::raw;
use aip_policy::{Decision, DlpRecord, Evaluator, Listing, Request, codes};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::call::Era;
use super::catalog::Catalog;
use crate::audit::Audit;
use crate::upstream::health::ConnectionState;

/// Protocol versions the gateway speaks to agents, newest first.
pub const AGENT_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// What an `ask` tool's description starts with in listings.
const ASK_MARK: &str = "[requires human approval]";

/// Every listable connection's tools, filtered by policy.
pub(super) fn tools_list(catalog: &Catalog, evaluator: &Evaluator) -> Value {
    let mut listed: Vec<Value> = Vec::new();
    for entry in &catalog.entries {
        let (agent_name, connection) = (&entry.agent_name, &entry.connection);
        let policy_pin = evaluator.schema_hash(agent_name);
        if catalog.is_ambiguous(agent_name)
            || entry.withheld.is_some()
            || policy_pin.is_some_and(|pin| pin != entry.seen.schema_hash)
            || !connection.health().state.listable()
            || connection.gate(entry.upstream_name()).is_some()
        {
            continue;
        }
        let mut definition = entry.definition.clone();
        redact_for_agent(&mut definition, connection, evaluator, Findings::Unaudited);
        match evaluator.listing(agent_name) {
            Listing::Hidden => continue,
            Listing::Ask => mark_ask(&mut definition),
            Listing::Listed => {}
        }
        definition["name"] = json!(agent_name);
        listed.push(definition);
    }
    json!({ "tools": listed })
}

/// Marks a tool whose every call waits for a person.
fn mark_ask(definition: &mut Value) {
    let description = definition
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    definition["description"] = json!(format!("{ASK_MARK} {description}").trim_end().to_owned());
}

/// The gateway's answer to `initialize`: the version asked for when it
/// speaks it (else its newest), and the capabilities the policy leaves.
pub(super) fn initialize(params: Option<&Value>, evaluator: &Evaluator, upstream: &Value) -> Value {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = AGENT_VERSIONS
        .iter()
        .find(|v| Some(**v) == requested)
        .unwrap_or(&AGENT_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": capabilities(evaluator, upstream, Era::Legacy),
        "serverInfo": server_info(),
    })
}

/// The gateway's answer to `server/discover`: the modern revisions it
/// speaks and the capabilities the policy leaves. It is per policy, so
/// private; it changes with a reload, so not cached for long.
pub(super) fn discover(evaluator: &Evaluator, upstream: &Value) -> Value {
    json!({
        "resultType": "complete",
        "supportedVersions": aip_mcp::modern::SUPPORTED,
        "capabilities": capabilities(evaluator, upstream, Era::Modern),
        "ttlMs": 0,
        "cacheScope": "private",
    })
}

pub(super) fn server_info() -> Value {
    json!({"name": "aip-sidecar", "version": env!("CARGO_PKG_VERSION")})
}

/// What the gateway offers: tools always (with list-change notices); the
/// rest where the policy allows their methods and some server offers them
/// (`upstream` is every connection's capabilities merged). Logging and
/// resource subscriptions are legacy-era methods.
fn capabilities(evaluator: &Evaluator, upstream: &Value, era: Era) -> Value {
    let mut capabilities = json!({"tools": {"listChanged": true}});
    let offered = |name: &str| upstream.get(name).is_some();
    let flag = |name: &str, flag: &str| {
        upstream
            .get(name)
            .and_then(|c| c.get(flag))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    if method_allowed(evaluator, "prompts/list") {
        capabilities["prompts"] = json!({"listChanged": flag("prompts", "listChanged")});
    }
    if method_allowed(evaluator, "resources/list") {
        let mut resources = json!({"listChanged": flag("resources", "listChanged")});
        let subscribe = if era.has_sessions() {
            "resources/subscribe"
        } else {
            "subscriptions/listen"
        };
        if flag("resources", "subscribe") && method_allowed(evaluator, subscribe) {
            resources["subscribe"] = json!(true);
        }
        capabilities["resources"] = resources;
    }
    if offered("completions") && method_allowed(evaluator, "completion/complete") {
        capabilities["completions"] = json!({});
    }
    if offered("logging") && (!era.logs_unasked() || method_allowed(evaluator, "logging/setLevel"))
    {
        capabilities["logging"] = json!({});
    }
    // An ask answered as a task, for an agent that declares the extension.
    if era.has_tasks() && method_allowed(evaluator, "tasks/get") {
        capabilities["extensions"] = json!({aip_mcp::modern::TASKS_EXTENSION: {}});
    }
    capabilities
}

/// A result as the modern revision has it: its `resultType`, the gateway as
/// the server in `_meta`, and, for what may be cached, caching hints. The
/// gateway's lists are filtered per policy, so `private`; they change with
/// health and reloads, so no longer fresh than the server said (0 when it
/// did not say).
pub(super) fn modern_result(response: &mut Value, method: &str) {
    let Some(Value::Object(result)) = response.get_mut("result") else {
        return;
    };
    let kind = result
        .entry("resultType")
        .or_insert_with(|| json!("complete"))
        .clone();
    if !result.get("_meta").is_some_and(Value::is_object) {
        result.insert("_meta".into(), json!({}));
    }
    result["_meta"][aip_mcp::modern::META_SERVER_INFO] = server_info();
    if kind == "complete" && aip_mcp::modern::CACHEABLE.contains(&method) {
        let ttl = result.get("ttlMs").and_then(Value::as_u64).unwrap_or(0);
        result.insert("ttlMs".into(), json!(ttl));
        result.insert("cacheScope".into(), json!("private"));
    }
}

/// A server's response that redaction did not change, as the text to send
/// the agent (`Reply::Text`): the server's own bytes with only its
/// top-level `id` replaced by the agent's and, in an era that shapes
/// results, the members [`modern_result`] sets spliced into its result;
/// one pass over the text, the rest left as it came. None when the text
/// cannot be read plainly (an escaped key) or `method`'s results carry
/// caching hints: the caller then writes the value.
pub(super) fn text_reply(text: &[u8], id: &Value, era: Era, method: &str) -> Option<Bytes> {
    use aip_mcp::modern::CACHEABLE;
    let (top, _) = raw::members(text, raw::whole(text))?;
    let find = |members: &[raw::Member], key: &str| {
        members
            .iter()
            .find(|m| &text[m.key.clone()] == key.as_bytes())
            .cloned()
    };
    let mut splice = raw::Splice::default();
    splice.replace(find(&top, "id")?.value, serde_json::to_vec(id).ok()?);
    if era.shapes_results() {
        if CACHEABLE.contains(&method) {
            return None;
        }
        let (members, close) = raw::members(text, find(&top, "result")?.value)?;
        let mut added: Vec<(&str, &[u8])> = Vec::new();
        if find(&members, "resultType").is_none() {
            added.push(("resultType", b"\"complete\""));
        }
        let (info, meta_with_info) = server_info_text();
        match find(&members, "_meta") {
            Some(meta) if text[meta.value.start] == b'{' => {
                let (inner, inner_close) = raw::members(text, meta.value)?;
                match find(&inner, aip_mcp::modern::META_SERVER_INFO) {
                    Some(m) => splice.replace(m.value, info),
                    None => splice.add_members(
                        &inner,
                        inner_close,
                        &[(aip_mcp::modern::META_SERVER_INFO, info)],
                    ),
                }
            }
            Some(meta) => splice.replace(meta.value, meta_with_info),
            None => added.push(("_meta", meta_with_info)),
        }
        if !added.is_empty() {
            splice.add_members(&members, close, &added);
        }
    }
    Some(Bytes::from(splice.apply(text)))
}

/// [`server_info`] as JSON text, and a `_meta` holding only it: written
/// once, as they never change.
fn server_info_text() -> (&'static [u8], &'static [u8]) {
    static TEXT: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    let (info, meta) = TEXT.get_or_init(|| {
        let meta = json!({ aip_mcp::modern::META_SERVER_INFO: server_info() });
        (
            server_info().to_string().into_bytes(),
            meta.to_string().into_bytes(),
        )
    });
    (info, meta)
}

fn method_allowed(evaluator: &Evaluator, method: &str) -> bool {
    let request = Request {
        id: None,
        method,
        params: None,
    };
    evaluator.evaluate(&request).decision == Decision::Allow
}

/// How the DLP findings in what the agent is shown are audited.
#[derive(Clone, Copy)]
pub(super) enum Findings<'a> {
    /// Under the tool whose response (or task) it is.
    OfTool(&'a Audit, &'a str),
    /// Without a tool: what a server says while a request runs.
    Audited(&'a Audit),
    /// Not at all: listings, catalogs and other answers, which are built
    /// again and again.
    Unaudited,
}

/// Everything a server sent that the agent is shown passes here, whatever
/// path brought it: a result or an error, the tool list and listings, a
/// server's task (polled, or heard on a listen stream), progress and
/// logging during a call, a server's question. First the credentials of
/// the connection it came from, in every spelling (`upstream::credentials`),
/// then the policy's DLP patterns, each finding audited as `findings` says.
/// What the gateway writes itself (ids, cursors, its own task fields) is
/// added after, and never redacted.
pub(super) fn redact_for_agent(
    value: &mut Value,
    from: &ConnectionState,
    evaluator: &Evaluator,
    findings: Findings<'_>,
) -> bool {
    let echoed = from.redact_echoes(value);
    if echoed > 0 {
        let connection = &from.upstream.connection().name;
        tracing::warn!(%connection, echoed, "the server echoed the connection's credentials; redacted");
    }
    let Some(redactor) = evaluator.redactor() else {
        return echoed > 0;
    };
    let mut events = Vec::new();
    let changed = redactor.redact_strings(value, &mut events) || echoed > 0;
    let (audit, tool) = match findings {
        Findings::OfTool(audit, tool) => (audit, Some(tool)),
        Findings::Audited(audit) => (audit, None),
        Findings::Unaudited => return changed,
    };
    for line in DlpRecord::for_events(&events, tool, SystemTime::now()) {
        audit.record(&line);
    }
    changed
}

/// A server's response as the agent is shown it: its result or its error
/// through [`redact_for_agent`]; the envelope is the gateway's. Whether
/// anything was redacted.
pub(super) fn redact_response(
    response: &mut Value,
    from: &ConnectionState,
    evaluator: &Evaluator,
    findings: Findings<'_>,
) -> bool {
    let mut changed = false;
    for part in ["result", "error"] {
        if let Some(part) = response.get_mut(part) {
            changed |= redact_for_agent(part, from, evaluator, findings);
        }
    }
    changed
}

/// DLP over every string of the agent's own arguments, for the person
/// asked to approve them (nothing of a server's is in them).
pub(super) fn redact_all(value: &mut Value, evaluator: &Evaluator) {
    if let Some(r) = evaluator.redactor() {
        r.redact_strings(value, &mut Vec::new());
    }
}

pub(super) fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub(super) fn error(id: Option<&Value>, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = Map::new();
    e.insert("code".into(), json!(code));
    e.insert("message".into(), json!(message));
    if let Some(d) = data {
        e.insert("data".into(), d);
    }
    json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": e})
}

/// The answer to a method the gateway does not serve.
pub(super) fn method_not_found(id: &Value, method: &str) -> Value {
    error(
        Some(id),
        codes::METHOD_NOT_FOUND,
        "Method not found",
        Some(json!({ "method": method })),
    )
}

/// An error object (no envelope) for a reply to a server's request.
pub(super) fn error_object(code: i64, message: &str, data: &str) -> Value {
    json!({"error": {"code": code, "message": message, "data": data}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The text splices give what the value functions give, and leave the
    /// rest of the server's text byte for byte.
    #[test]
    fn text_replies_agree_with_value_replies() {
        let info = aip_mcp::modern::META_SERVER_INFO;
        let texts = [
            r#"{"jsonrpc":"2.0","id":"aip-9","result":{"content":[{"type":"text","text":"a\n}"}]}}"#.to_owned(),
            r#"{ "result" : { } , "id" : "aip-9" , "jsonrpc" : "2.0" }"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":"aip-9","result":{"resultType":"complete","n":1.50,"_meta":{"k":1}}}"#.to_owned(),
            format!(r#"{{"jsonrpc":"2.0","id":"aip-9","result":{{"_meta":{{"{info}":{{"name":"impostor"}}}}}}}}"#),
            r#"{"jsonrpc":"2.0","id":"aip-9","result":{"_meta":"not an object","x":[{},[]]}}"#.to_owned(),
        ];
        let read = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).unwrap();
        for text in &texts {
            let id = json!({"agent": [7]});
            let mut expected = read(text.as_bytes());
            expected["id"] = id.clone();
            let legacy = text_reply(text.as_bytes(), &id, Era::Legacy, "tools/call").unwrap();
            assert_eq!(read(&legacy), expected, "{text}");
            let modern = text_reply(text.as_bytes(), &id, Era::Modern, "tools/call").unwrap();
            modern_result(&mut expected, "tools/call");
            assert_eq!(read(&modern), expected, "{text}");
        }
        // What is not changed is as the server wrote it (here its spacing
        // and its number's spelling).
        let passed = text_reply(texts[2].as_bytes(), &json!(3), Era::Legacy, "tools/call").unwrap();
        let passed = std::str::from_utf8(&passed).unwrap();
        assert!(passed.contains(r#""n":1.50"#));
        assert!(passed.starts_with(r#"{"jsonrpc":"2.0","id":3,"#));
    }

    #[test]
    fn text_not_read_plainly_or_cacheable_is_left_to_the_value() {
        let id = json!(2);
        let escaped_key = br#"{"jsonrpc":"2.0","id":1,"result":{"\u0078":1}}"#;
        assert_eq!(
            text_reply(escaped_key, &id, Era::Modern, "tools/call"),
            None
        );
        let listing = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;
        assert_eq!(text_reply(listing, &id, Era::Modern, "tools/list"), None);
        let escaped_id = br#"{"jsonrpc":"2.0","\u0069d":1,"result":{}}"#;
        assert_eq!(text_reply(escaped_id, &id, Era::Legacy, "tools/call"), None);
    }
}

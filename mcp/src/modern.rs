//! MCP 2026-07-28, the "modern" era: no session and no handshake; every
//! request carries its protocol version, client capabilities and client
//! information in `params._meta`, and over HTTP mirrors its method, name
//! and annotated arguments in headers that a server must check against the
//! body before it acts on either.
//!
//! Both sides of the gateway use this module: the agent listener validates
//! what a modern agent sends, the HTTP client builds what a modern upstream
//! expects. Pure functions over headers and JSON values.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper::header::{AsHeaderName, HeaderMap, HeaderName};
use serde_json::{Map, Value, json};

/// The headers the revision mirrors a request's body in.
pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The modern revision, and the modern revisions the gateway speaks.
pub const VERSION: &str = "2026-07-28";
pub const SUPPORTED: &[&str] = &[VERSION];

pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";
/// The tasks extension's identifier (in capabilities' `extensions`).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Error codes the modern revision defines.
pub const HEADER_MISMATCH: i64 = -32020;
pub const MISSING_CAPABILITY: i64 = -32021;
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// What a modern client may ask of a server (the tasks extension's three
/// included).
pub const CLIENT_METHODS: &[&str] = &[
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "completion/complete",
    "subscriptions/listen",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// Results that carry caching hints when complete.
pub const CACHEABLE: &[&str] = &[
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// The requests whose result may ask the client for input (MRTR).
pub const MAY_REQUIRE_INPUT: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// A request's `params._meta`, when it is an object.
pub fn meta(message: &Value) -> Option<&Map<String, Value>> {
    message.get("params")?.get("_meta")?.as_object()
}

/// Whether a message claims the modern era: its `_meta` names a protocol
/// version.
pub fn claims_modern(message: &Value) -> bool {
    meta(message).is_some_and(|m| m.contains_key(META_VERSION))
}

/// The client capabilities a modern request declares (`{}` when none).
pub fn declared_capabilities(message: &Value) -> Value {
    meta(message)
        .and_then(|m| m.get(META_CAPABILITIES))
        .filter(|c| c.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}))
}

/// The client a modern request says it is (its `clientInfo` name; empty
/// when it names none).
pub fn client_name(message: &Value) -> &str {
    meta(message)
        .and_then(|m| m.get(META_CLIENT_INFO))
        .and_then(|i| i.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether a modern request declared the tasks extension.
pub fn declares_tasks(message: &Value) -> bool {
    meta(message)
        .and_then(|m| m.get(META_CAPABILITIES))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some()
}

/// What `Mcp-Name` mirrors for `method`: the tool or prompt name, the
/// resource URI, or the task id.
pub fn name_source(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// Why a modern request is refused before it is acted on, in the order the
/// checks run (the first that fails is reported).
#[derive(Debug, Clone, PartialEq)]
pub enum Invalid {
    /// `_meta` or one of its required keys is missing or mistyped: -32602.
    Meta(String),
    /// A mirrored header is missing, malformed or differs from the body:
    /// -32020.
    Header(String),
    /// The version is not one the gateway speaks: -32022.
    Version(String),
    /// Not a modern method (or one the modern era removed): -32601.
    Method(String),
}

impl Invalid {
    pub fn code(&self) -> i64 {
        match self {
            Invalid::Meta(_) => -32602,
            Invalid::Header(_) => HEADER_MISMATCH,
            Invalid::Version(_) => UNSUPPORTED_VERSION,
            Invalid::Method(_) => -32601,
        }
    }

    /// The HTTP status the revision gives the refusal.
    pub fn http_status(&self) -> u16 {
        match self {
            Invalid::Method(_) => 404,
            _ => 400,
        }
    }

    /// The JSON-RPC error response, under the request's id.
    pub fn response(&self, id: Option<&Value>) -> Value {
        let (message, data) = match self {
            Invalid::Meta(m) | Invalid::Header(m) => (m.clone(), None),
            Invalid::Version(requested) => (
                "Unsupported protocol version".to_owned(),
                Some(json!({"supported": SUPPORTED, "requested": requested})),
            ),
            Invalid::Method(method) => (format!("Method not found: {method}"), None),
        };
        let mut error = json!({"code": self.code(), "message": message});
        if let Some(data) = data {
            error["data"] = data;
        }
        json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error})
    }
}

/// Checks a modern request (or notification) against the revision's rules
/// and its HTTP headers (`headers` None on stdio, where there are none):
/// `_meta`, then the mirrored headers, then the version, then the method.
pub fn check_request(message: &Value, headers: Option<&HeaderMap>) -> Result<(), Invalid> {
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = check_meta(message)?;
    if let Some(headers) = headers {
        check_headers(headers, method, message, version)?;
    }
    if !SUPPORTED.contains(&version) {
        return Err(Invalid::Version(version.to_owned()));
    }
    let is_request = message.get("id").is_some();
    if is_request && !CLIENT_METHODS.contains(&method) {
        return Err(Invalid::Method(method.to_owned()));
    }
    Ok(())
}

/// `_meta` with a string version and an object of capabilities; returns the
/// version.
fn check_meta(message: &Value) -> Result<&str, Invalid> {
    let Some(meta) = meta(message) else {
        return Err(Invalid::Meta(format!(
            "params._meta is required: it must carry {META_VERSION} and {META_CAPABILITIES}"
        )));
    };
    let version = match meta.get(META_VERSION) {
        Some(Value::String(v)) => v.as_str(),
        Some(_) => {
            return Err(Invalid::Meta(format!(
                "params._meta[{META_VERSION:?}] must be a string"
            )));
        }
        None => {
            return Err(Invalid::Meta(format!(
                "params._meta[{META_VERSION:?}] is required"
            )));
        }
    };
    match meta.get(META_CAPABILITIES) {
        Some(Value::Object(_)) => {}
        Some(_) => {
            return Err(Invalid::Meta(format!(
                "params._meta[{META_CAPABILITIES:?}] must be an object"
            )));
        }
        None => {
            return Err(Invalid::Meta(format!(
                "params._meta[{META_CAPABILITIES:?}] is required"
            )));
        }
    }
    if meta.get(META_CLIENT_INFO).is_some_and(|i| !i.is_object()) {
        return Err(Invalid::Meta(format!(
            "params._meta[{META_CLIENT_INFO:?}] must be an object"
        )));
    }
    Ok(version)
}

fn check_headers(
    headers: &HeaderMap,
    method: &str,
    message: &Value,
    version: &str,
) -> Result<(), Invalid> {
    match single(headers, &MCP_PROTOCOL_VERSION)? {
        None => {
            return Err(Invalid::Header(
                "the MCP-Protocol-Version header is required".into(),
            ));
        }
        Some(h) if h != version => {
            return Err(Invalid::Header(format!(
                "Header mismatch: MCP-Protocol-Version header value {h:?} does not match body value {version:?}"
            )));
        }
        Some(_) => {}
    }
    match single(headers, &MCP_METHOD)? {
        None if message.get("id").is_some() => {
            return Err(Invalid::Header("the Mcp-Method header is required".into()));
        }
        Some(h) if h != method => {
            return Err(Invalid::Header(format!(
                "Header mismatch: Mcp-Method header value {h:?} does not match body value {method:?}"
            )));
        }
        _ => {}
    }
    let Some(source) = name_source(method) else {
        return Ok(());
    };
    let body = message
        .get("params")
        .and_then(|p| p.get(source))
        .and_then(Value::as_str);
    let header =
        match single(headers, &MCP_NAME)? {
            None => None,
            Some(raw) => Some(decode_value(raw).map_err(|why| {
                Invalid::Header(format!("Header mismatch: Mcp-Name header: {why}"))
            })?),
        };
    match (header, body) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Invalid::Header(format!(
            "the Mcp-Name header is required for {method} (it mirrors params.{source})"
        ))),
        // Neither value is repeated: the refusal is audited, and a task id
        // is what lets its agent read the task.
        (Some(h), b) if Some(h.as_str()) != b => Err(Invalid::Header(format!(
            "Header mismatch: the Mcp-Name header does not match params.{source} of {method}"
        ))),
        _ => Ok(()),
    }
}

/// A header's one value, trimmed of RFC 9110 optional whitespace; a header
/// sent twice, or not visible ASCII, is malformed.
fn single<N>(headers: &HeaderMap, name: N) -> Result<Option<&str>, Invalid>
where
    N: AsHeaderName + std::fmt::Display + Copy,
{
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Invalid::Header(format!(
            "the {name} header is sent more than once"
        )));
    }
    let text = first
        .to_str()
        .map_err(|_| Invalid::Header(format!("the {name} header is not visible ASCII")))?;
    Ok(Some(text.trim_matches([' ', '\t'])))
}

const SENTINEL_START: &str = "=?base64?";
const SENTINEL_END: &str = "?=";

/// A header value as the revision encodes it: plain when it is visible
/// ASCII without surrounding whitespace, else the base64 sentinel (also for
/// a plain value that looks like the sentinel, and for the empty string).
pub fn encode_value(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        && value.trim_matches([' ', '\t']) == value
        && !(value.starts_with(SENTINEL_START) && value.ends_with(SENTINEL_END));
    if plain {
        value.to_owned()
    } else {
        format!("{SENTINEL_START}{}{SENTINEL_END}", STANDARD.encode(value))
    }
}

/// A header value decoded: the base64 sentinel's text (canonical padding,
/// UTF-8), or the value itself.
pub fn decode_value(raw: &str) -> Result<String, String> {
    let Some(inner) = raw
        .strip_prefix(SENTINEL_START)
        .and_then(|r| r.strip_suffix(SENTINEL_END))
    else {
        return Ok(raw.to_owned());
    };
    let bytes = STANDARD
        .decode(inner)
        .map_err(|e| format!("invalid base64 ({e})"))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "the base64 value is not UTF-8 at byte {}",
            e.utf8_error().valid_up_to()
        )
    })
}

/// A tool argument a server asked clients to mirror in `Mcp-Param-{header}`:
/// the header's name and the argument's path through `properties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamHeader {
    pub header: String,
    pub path: Vec<String>,
}

/// The `x-mcp-header` annotations of a tool's input schema, checked as the
/// revision requires of a client (a tool with an invalid one is left out of
/// listings): a token, unique without regard to case, on a string, integer
/// or boolean property reached through `properties` alone.
pub fn param_headers(input_schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut found = Vec::new();
    collect_annotations(input_schema, &mut Vec::new(), true, &mut found)?;
    let mut seen = std::collections::HashSet::new();
    for p in &found {
        if !seen.insert(p.header.to_ascii_lowercase()) {
            return Err(format!("x-mcp-header {:?} is used twice", p.header));
        }
    }
    Ok(found)
}

fn collect_annotations(
    schema: &Value,
    path: &mut Vec<String>,
    reachable: bool,
    found: &mut Vec<ParamHeader>,
) -> Result<(), String> {
    let Some(object) = schema.as_object() else {
        return Ok(());
    };
    for (key, value) in object {
        match key.as_str() {
            "x-mcp-header" => {
                let at = path.join(".");
                if !reachable || path.is_empty() {
                    return Err(format!(
                        "x-mcp-header at {at:?} is not on a property reached through properties alone"
                    ));
                }
                let Some(name) = value.as_str().filter(|n| is_token(n)) else {
                    return Err(format!("x-mcp-header at {at:?} is not an HTTP token"));
                };
                let kind = object.get("type").and_then(Value::as_str);
                if !matches!(kind, Some("string" | "integer" | "boolean")) {
                    return Err(format!(
                        "x-mcp-header at {at:?} is on a property that is not a string, integer or boolean"
                    ));
                }
                found.push(ParamHeader {
                    header: name.to_owned(),
                    path: path.clone(),
                });
            }
            "properties" => {
                if let Some(props) = value.as_object() {
                    for (name, sub) in props {
                        path.push(name.clone());
                        collect_annotations(sub, path, reachable, found)?;
                        path.pop();
                    }
                }
            }
            _ => {
                // Anywhere else (items, anyOf, $defs, ...) an annotation is
                // invalid; look for one only to refuse it.
                match value {
                    Value::Array(items) => {
                        for sub in items {
                            collect_annotations(sub, path, false, found)?;
                        }
                    }
                    Value::Object(_) => collect_annotations(value, path, false, found)?,
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The value at an annotated argument's path, when present and not null.
fn argument_at<'a>(arguments: Option<&'a Value>, path: &[String]) -> Option<&'a Value> {
    let mut at = arguments?;
    for key in path {
        at = at.get(key)?;
    }
    (!at.is_null()).then_some(at)
}

/// The text a header carries for an argument value.
fn header_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `Mcp-Param-*` headers a client sends for a call's arguments, encoded.
pub fn param_header_values(
    annotations: &[ParamHeader],
    arguments: Option<&Value>,
) -> Vec<(String, String)> {
    annotations
        .iter()
        .filter_map(|a| {
            let text = header_text(argument_at(arguments, &a.path)?)?;
            Some((format!("mcp-param-{}", a.header), encode_value(&text)))
        })
        .collect()
}

/// Checks the `Mcp-Param-*` headers of a tools/call against its arguments,
/// for the tool's annotations: each annotated argument present in the body
/// must be mirrored, decoded equal (integers compared as numbers).
pub fn check_param_headers(
    headers: &HeaderMap,
    annotations: &[ParamHeader],
    arguments: Option<&Value>,
) -> Result<(), Invalid> {
    for a in annotations {
        let name = format!("mcp-param-{}", a.header);
        let header = match single(headers, name.as_str())? {
            None => None,
            Some(raw) => Some(decode_value(raw).map_err(|why| {
                Invalid::Header(format!(
                    "Header mismatch: Mcp-Param-{} header: {why}",
                    a.header
                ))
            })?),
        };
        let body = argument_at(arguments, &a.path);
        let matches = match (&header, body) {
            (None, None) => true,
            (Some(h), Some(Value::Number(n))) => {
                h.parse::<f64>().ok() == n.as_f64() && !h.is_empty()
            }
            (Some(h), Some(b)) => header_text(b).as_deref() == Some(h.as_str()),
            _ => false,
        };
        if !matches {
            // The value is not repeated: the refusal is audited, and
            // arguments reach the audit only DLP-redacted.
            return Err(Invalid::Header(format!(
                "Header mismatch: Mcp-Param-{} header {} the argument {}",
                a.header,
                if header.is_some() {
                    "does not match"
                } else {
                    "is missing for"
                },
                a.path.join("."),
            )));
        }
    }
    Ok(())
}

/// Members of a request's `params._meta`, by key.
pub type Meta = Vec<(&'static str, Value)>;

/// `_meta` members with their JSON text, written once for every request
/// they go with (see `HttpUpstream`'s cache of them).
#[derive(Debug)]
pub struct WrittenMeta {
    pub members: Meta,
    text: Vec<(&'static str, Vec<u8>)>,
}

impl WrittenMeta {
    pub fn new(members: Meta) -> WrittenMeta {
        let text = members
            .iter()
            .map(|(key, value)| (*key, serde_json::to_vec(value).unwrap_or_default()))
            .collect();
        WrittenMeta { members, text }
    }
}

/// `message` with `meta`'s members set in its `params._meta` (both made
/// objects where they are not).
pub fn with_meta(message: &Value, meta: Meta) -> Value {
    let mut request = message.clone();
    if let Value::Object(envelope) = &mut request
        && !envelope.get("params").is_some_and(Value::is_object)
    {
        envelope.insert("params".into(), json!({}));
    }
    let params = &mut request["params"];
    if !params.get("_meta").is_some_and(Value::is_object) {
        params["_meta"] = json!({});
    }
    for (key, value) in meta {
        params["_meta"][key] = value;
    }
    request
}

/// What [`with_meta`] makes of the message whose text is `text` (accepted
/// by the strict parser), made by splicing the text: each of `meta`'s
/// members replaced or added in its `params._meta`, the rest as it came.
/// `meta_at` is where that object lies, when known. None when the text has
/// no `params._meta` object or a key there is not read plainly (the
/// message is then written out instead).
pub fn meta_spliced(
    text: &[u8],
    meta_at: Option<std::ops::Range<usize>>,
    meta: &WrittenMeta,
) -> Option<Vec<u8>> {
    use crate::raw;
    let at = match meta_at {
        Some(at) => at,
        None => {
            let params = raw::member(text, raw::whole(text), "params")?;
            raw::member(text, params, "_meta")?
        }
    };
    let (members, close) = raw::members(text, at)?;
    let mut splice = raw::Splice::default();
    let mut added: Vec<(&str, &[u8])> = Vec::new();
    for (key, written) in &meta.text {
        match members
            .iter()
            .find(|m| &text[m.key.clone()] == key.as_bytes())
        {
            Some(m) => splice.replace(m.value.clone(), written.as_slice()),
            None => added.push((key, written)),
        }
    }
    if !added.is_empty() {
        splice.add_members(&members, close, &added);
    }
    Some(splice.apply(text))
}

#[cfg(test)]
mod tests {

    #[test]
    fn meta_spliced_says_what_with_meta_says() {
        let meta = || {
            WrittenMeta::new(vec![
                (META_VERSION, json!(VERSION)),
                (META_CAPABILITIES, json!({"x": {}})),
                (META_CLIENT_INFO, json!({"name": "g", "version": "1"})),
            ])
        };
        let source = format!(
            r#"{{"id":1, "params":{{"arguments":{{"b":"caf\u00e9"}}, "_meta":{{"{META_VERSION}":"{VERSION}", "{META_CAPABILITIES}":{{"y":1}}, "k":[1.0]}}}}, "method":"tools/call","jsonrpc":"2.0"}}"#
        );
        let spliced = meta_spliced(source.as_bytes(), None, &meta()).unwrap();
        let at = source.find("{\"io.").unwrap()..source.find("]}").unwrap() + 2;
        assert_eq!(
            meta_spliced(source.as_bytes(), Some(at), &meta()),
            Some(spliced.clone())
        );
        let text = String::from_utf8(spliced.clone()).unwrap();
        assert!(
            text.contains(r#""b":"caf\u00e9""#) && text.contains(r#""k":[1.0]"#),
            "{text}"
        );
        let original: Value = serde_json::from_str(&source).unwrap();
        let said: Value = serde_json::from_slice(&spliced).unwrap();
        assert_eq!(said, with_meta(&original, meta().members));
        // Nothing to splice into: the message is written out instead.
        for source in [
            r#"{"id":1,"method":"tools/call"}"#,
            r#"{"id":1,"params":{"name":"a"}}"#,
        ] {
            assert_eq!(
                meta_spliced(source.as_bytes(), None, &meta()),
                None,
                "{source}"
            );
        }
    }

    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn call(name: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": name, "arguments": {},
            "_meta": {META_VERSION: VERSION, META_CAPABILITIES: {}}}})
    }

    #[test]
    fn values_are_encoded_as_the_revision_shows() {
        assert_eq!(encode_value("us-west1"), "us-west1");
        assert_eq!(
            encode_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(encode_value("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
        assert_eq!(
            encode_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        for v in ["us-west1", "Hello, 世界", " padded ", "", "=?base64?x?="] {
            assert_eq!(decode_value(&encode_value(v)).unwrap(), v);
        }
        assert!(
            decode_value("=?base64?SGVsbG8?=").is_err(),
            "padding is canonical"
        );
        assert!(decode_value("=?base64?SGVs!!!bG8=?=").is_err());
        assert!(decode_value("=?base64?/w==?=").is_err(), "not UTF-8");
        assert_eq!(
            decode_value("=?base64?SGVsbG8=").unwrap(),
            "=?base64?SGVsbG8="
        );
    }

    #[test]
    fn checks_run_in_the_revisions_order() {
        let mut no_meta = call("t");
        no_meta["params"].as_object_mut().unwrap().remove("_meta");
        let h = headers(&[("mcp-protocol-version", "2026-07-28")]);
        assert!(matches!(
            check_request(&no_meta, Some(&h)),
            Err(Invalid::Meta(_))
        ));

        let mut odd = call("t");
        odd["params"]["_meta"][META_VERSION] = json!("v999.0.0");
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ]);
        assert!(
            matches!(check_request(&odd, Some(&h)), Err(Invalid::Header(_))),
            "mismatch before version"
        );
        let h = headers(&[
            ("mcp-protocol-version", "v999.0.0"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ]);
        let refused = check_request(&odd, Some(&h)).unwrap_err();
        assert_eq!(refused, Invalid::Version("v999.0.0".into()));
        assert_eq!(
            refused.response(Some(&json!(1)))["error"]["data"]["requested"],
            "v999.0.0"
        );

        let ok = headers(&[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("MCP-METHOD", "tools/call"),
            ("mcp-name", "  t  "),
        ]);
        assert_eq!(check_request(&call("t"), Some(&ok)), Ok(()));
        let upper = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "TOOLS/CALL"),
            ("mcp-name", "t"),
        ]);
        assert!(matches!(
            check_request(&call("t"), Some(&upper)),
            Err(Invalid::Header(_))
        ));
        let twice = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
            ("mcp-name", "t"),
        ]);
        assert!(matches!(
            check_request(&call("t"), Some(&twice)),
            Err(Invalid::Header(_))
        ));
        let missing = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
        ]);
        assert!(matches!(
            check_request(&call("t"), Some(&missing)),
            Err(Invalid::Header(_))
        ));
        let encoded = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", &encode_value("naïve")),
        ]);
        assert_eq!(check_request(&call("naïve"), Some(&encoded)), Ok(()));

        let mut ping = call("t");
        ping["method"] = json!("ping");
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "ping"),
        ]);
        let refused = check_request(&ping, Some(&h)).unwrap_err();
        assert_eq!((refused.code(), refused.http_status()), (-32601, 404));
    }

    #[test]
    fn annotations_are_found_and_checked() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "nested": {"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}},
            "plain": {"type": "string"}}});
        let found = param_headers(&schema).unwrap();
        assert_eq!(found.len(), 2);
        let args = json!({"region": "us-west1", "nested": {"n": 42}});
        let sent = param_header_values(&found, Some(&args));
        assert!(sent.contains(&("mcp-param-Region".into(), "us-west1".into())));
        let h = headers(&[("mcp-param-region", "us-west1"), ("mcp-param-n", "42.0")]);
        assert_eq!(check_param_headers(&h, &found, Some(&args)), Ok(()));
        let h = headers(&[("mcp-param-region", "eu")]);
        assert!(check_param_headers(&h, &found, Some(&args)).is_err());
        let h = headers(&[("mcp-param-region", "us-west1")]);
        assert!(
            check_param_headers(&h, &found, Some(&args)).is_err(),
            "n is present: its header is required"
        );

        for bad in [
            json!({"properties": {"x": {"type": "number", "x-mcp-header": "X"}}}),
            json!({"properties": {"x": {"type": "string", "x-mcp-header": "bad name"}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": "A"}, "b": {"type": "string", "x-mcp-header": "a"}}}),
            json!({"properties": {"l": {"type": "array", "items": {"type": "string", "x-mcp-header": "L"}}}}),
            json!({"anyOf": [{"properties": {"x": {"type": "string", "x-mcp-header": "X"}}}]}),
        ] {
            assert!(param_headers(&bad).is_err(), "{bad}");
        }
    }
}

//! The two eras of MCP on one endpoint. A request is *modern* (2026-07-28:
//! stateless, every request carries its protocol version and client
//! capabilities in `params._meta`) or *legacy* (the `initialize` handshake
//! and sessions of 2025-11-25 and earlier). This module decides which a
//! request is and runs the modern request's envelope and header checks, in
//! the order the dual-era SDKs and the conformance suite agree on: `_meta`
//! first (-32602), then the routing headers against the body (-32020), then
//! the version (-32022). Method existence and `Mcp-Param-*` need the script
//! and live in [`crate::core`].

use serde::Deserialize;
use serde_json::{Value, json};

use crate::core::PROTOCOL_VERSIONS;

/// Modern protocol versions this server speaks, newest first.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

pub const HEADER_MISMATCH: i64 = -32020;
pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// Which eras a server answers (`--era`, `spec.era`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Eras {
    /// Dual-era: each request is served in the era it belongs to.
    #[default]
    Both,
    /// A 2025-11-25 server: modern requests get what such a server answers
    /// (no session: 400; `server/discover`: method not found).
    Legacy,
    /// A 2026-07-28-only server: `initialize` is refused naming the
    /// supported versions; GET and DELETE are 405.
    Modern,
}

impl Eras {
    pub fn as_str(self) -> &'static str {
        match self {
            Eras::Both => "both",
            Eras::Legacy => "legacy",
            Eras::Modern => "modern",
        }
    }
}

impl std::str::FromStr for Eras {
    type Err = String;

    fn from_str(text: &str) -> Result<Eras, String> {
        match text {
            "both" => Ok(Eras::Both),
            "legacy" => Ok(Eras::Legacy),
            "modern" => Ok(Eras::Modern),
            other => Err(format!("must be both, legacy or modern, found {other:?}")),
        }
    }
}

/// The era one request belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Era {
    #[default]
    Legacy,
    Modern,
}

/// Whether `version` is one of the handshake-era versions.
pub fn is_legacy_version(version: &str) -> bool {
    PROTOCOL_VERSIONS.contains(&version)
}

/// The era of `message`: the body decides (a protocol-version claim in
/// `params._meta` is modern, whatever the method); without a claim, a
/// `MCP-Protocol-Version` header naming anything but a handshake-era
/// version makes it modern too, so that it is told what its envelope lacks
/// rather than being served under a session it never opened. A header
/// never turns a claiming request legacy.
pub fn classify(message: &Value, header_version: Option<&str>) -> Era {
    let claims = message
        .pointer("/params/_meta")
        .and_then(Value::as_object)
        .is_some_and(|meta| meta.contains_key(META_PROTOCOL_VERSION));
    if claims || header_version.is_some_and(|v| !is_legacy_version(v)) {
        Era::Modern
    } else {
        Era::Legacy
    }
}

/// The routing headers of one HTTP request, as the transport read them:
/// names compared case-insensitively, values with RFC 9110 optional
/// whitespace trimmed.
#[derive(Debug, Clone, Default)]
pub struct RoutingHeaders {
    pub protocol_version: Option<String>,
    pub method: Option<String>,
    pub name: Option<String>,
    /// Every `Mcp-Param-*` header: (lowercase name, value), duplicates kept.
    pub params: Vec<(String, String)>,
    /// A routing header that was repeated or is not visible ASCII.
    pub unusable: Option<String>,
}

impl RoutingHeaders {
    /// Reads the routing headers from `(name, raw value)` pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> RoutingHeaders {
        let mut headers = RoutingHeaders::default();
        for (name, raw) in pairs {
            let name = name.to_ascii_lowercase();
            let slot = match name.as_str() {
                "mcp-protocol-version" => &mut headers.protocol_version,
                "mcp-method" => &mut headers.method,
                "mcp-name" => &mut headers.name,
                n if n.starts_with("mcp-param-") => {
                    match header_text(raw) {
                        Some(v) => headers.params.push((name, v)),
                        None => {
                            headers.unusable.get_or_insert(format!(
                                "{name} header is not visible ASCII (use the =?base64?...?= form)"
                            ));
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            let problem = match (slot.is_some(), header_text(raw)) {
                (true, _) => format!("{name} header appears more than once"),
                (false, Some(v)) => {
                    *slot = Some(v);
                    continue;
                }
                (false, None) => {
                    format!("{name} header is not visible ASCII (use the =?base64?...?= form)")
                }
            };
            headers.unusable.get_or_insert(problem);
        }
        headers
    }
}

/// A header value as text with optional whitespace (SP, HTAB) trimmed, or
/// None when it holds bytes outside visible ASCII and HTAB.
fn header_text(raw: &[u8]) -> Option<String> {
    let ok = raw.iter().all(|b| *b == b'\t' || (0x20..0x7f).contains(b));
    let text = std::str::from_utf8(raw).ok().filter(|_| ok)?;
    Some(text.trim_matches([' ', '\t']).to_owned())
}

/// What a modern request declared about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub protocol_version: String,
    pub client_capabilities: Value,
}

/// A request refused before dispatch: its JSON-RPC error and HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl Rejection {
    pub fn new(code: i64, message: impl Into<String>) -> Rejection {
        Rejection {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The status a modern HTTP server answers this error with.
    pub fn http_status(&self) -> u16 {
        match self.code {
            -32601 => 404,
            _ => 400,
        }
    }

    /// The error response to the request with `id`.
    pub fn response(&self, id: &Value) -> Value {
        crate::core::error(id, self.code, &self.message, self.data.clone())
    }
}

/// -32022 naming the versions this server speaks and the one `requested`
/// (left out when the request named none).
pub fn unsupported_version(requested: Option<&str>) -> Rejection {
    let mut data = json!({"supported": MODERN_VERSIONS});
    if let Some(r) = requested {
        data["requested"] = json!(r);
    }
    Rejection {
        code: UNSUPPORTED_VERSION,
        message: "Unsupported protocol version".to_owned(),
        data: Some(data),
    }
}

/// The checks every modern request passes before its method is looked at:
/// the `_meta` envelope, then (on HTTP, `headers` given) the routing
/// headers against the body, then the version.
pub fn check_envelope(
    message: &Value,
    headers: Option<&RoutingHeaders>,
) -> Result<Envelope, Rejection> {
    let meta = message.pointer("/params/_meta").and_then(Value::as_object);
    let Some(meta) = meta else {
        return Err(Rejection::new(
            -32602,
            format!(
                "Invalid params: params._meta must be an object with {META_PROTOCOL_VERSION} and {META_CLIENT_CAPABILITIES}"
            ),
        ));
    };
    let missing: Vec<&str> = [META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(Rejection::new(
            -32602,
            format!(
                "Invalid params: params._meta is missing {}",
                missing.join(" and ")
            ),
        ));
    }
    let version = &meta[META_PROTOCOL_VERSION];
    if let Some(headers) = headers {
        check_headers(message, version, headers)?;
    }
    let Some(version) = version.as_str() else {
        return Err(Rejection::new(
            -32602,
            format!("Invalid params: params._meta.{META_PROTOCOL_VERSION} must be a string"),
        ));
    };
    if !MODERN_VERSIONS.contains(&version) {
        return Err(unsupported_version(Some(version)));
    }
    let capabilities = &meta[META_CLIENT_CAPABILITIES];
    if !capabilities.is_object() {
        return Err(Rejection::new(
            -32602,
            format!("Invalid params: params._meta.{META_CLIENT_CAPABILITIES} must be an object"),
        ));
    }
    Ok(Envelope {
        protocol_version: version.to_owned(),
        client_capabilities: capabilities.clone(),
    })
}

/// The body field `Mcp-Name` mirrors for `method`, if it mirrors one.
pub fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

fn check_headers(
    message: &Value,
    version: &Value,
    headers: &RoutingHeaders,
) -> Result<(), Rejection> {
    let mismatch = |text: String| {
        Err(Rejection::new(
            HEADER_MISMATCH,
            format!("Header mismatch: {text}"),
        ))
    };
    if let Some(problem) = &headers.unusable {
        return mismatch(problem.clone());
    }
    match &headers.protocol_version {
        None => return mismatch("the MCP-Protocol-Version header is required".to_owned()),
        Some(h) if version.as_str() != Some(h.as_str()) => {
            return mismatch(format!(
                "MCP-Protocol-Version header value {h:?} does not match params._meta.{META_PROTOCOL_VERSION} {version}"
            ));
        }
        Some(_) => {}
    }
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match &headers.method {
        None => return mismatch("the Mcp-Method header is required".to_owned()),
        Some(h) if h != method => {
            return mismatch(format!(
                "Mcp-Method header value {h:?} does not match the body's method {method:?}"
            ));
        }
        Some(_) => {}
    }
    let Some(field) = name_field(method) else {
        return Ok(());
    };
    let Some(body) = message
        .pointer(&format!("/params/{field}"))
        .filter(|v| !v.is_null())
    else {
        return Ok(());
    };
    match headers.name.as_deref().map(|h| (h, decode_header_value(h))) {
        None => mismatch(format!(
            "the Mcp-Name header is required for {method} (params.{field})"
        )),
        Some((h, None)) => mismatch(format!(
            "Mcp-Name header value {h:?} is not valid =?base64?...?= (canonical padding, UTF-8)"
        )),
        Some((h, Some(decoded))) if body.as_str() != Some(decoded.as_str()) => mismatch(format!(
            "Mcp-Name header value {h:?} does not match the body's params.{field} {body}"
        )),
        Some(_) => Ok(()),
    }
}

/// A header value as it was meant: the `=?base64?...?=` form decoded
/// (canonical padding, UTF-8), anything else as it is. None for a
/// malformed encoded value, so that it never matches a body value.
pub fn decode_header_value(value: &str) -> Option<String> {
    let Some(payload) = value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    else {
        return Some(value.to_owned());
    };
    String::from_utf8(base64_decode(payload)?).ok()
}

/// Standard-alphabet base64 with canonical padding only: the length is a
/// multiple of 4, `=` only at the end, unused trailing bits zero.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.chunks(4);
    let last = chunks.len().saturating_sub(1);
    for (i, chunk) in chunks.enumerate() {
        let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && i != last) {
            return None;
        }
        let mut n = 0u32;
        for c in &chunk[..4 - pad] {
            n = (n << 6) | sextet(*c)?;
        }
        n <<= 6 * pad as u32;
        let [_, a, b, c] = n.to_be_bytes();
        let unused = match pad {
            2 => u32::from(b) | u32::from(c),
            1 => u32::from(c),
            _ => 0,
        };
        if unused != 0 {
            return None; // non-canonical: bits the encoder would have zeroed
        }
        out.extend_from_slice(&[a, b, c][..3 - pad]);
    }
    Some(out)
}

/// `x-mcp-header` annotations of a tool's input schema: (property path,
/// header token, property type). None when any annotation is invalid (a
/// conforming client drops such a tool and sends no `Mcp-Param-*` for it).
pub fn param_annotations(schema: &Value) -> Option<Vec<(Vec<String>, String, String)>> {
    // Applicators that lead to subschemas other than through `properties`:
    // an annotation found through one of them is not statically reachable.
    const SINGLE: &[&str] = &[
        "items",
        "contains",
        "additionalProperties",
        "unevaluatedItems",
        "unevaluatedProperties",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
    ];
    const LISTS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
    const MAPS: &[&str] = &[
        "patternProperties",
        "dependentSchemas",
        "$defs",
        "definitions",
    ];
    let mut found = Vec::new();
    let mut stack: Vec<(Option<Vec<String>>, &Value)> = vec![(Some(Vec::new()), schema)];
    while let Some((path, node)) = stack.pop() {
        let Some(object) = node.as_object() else {
            continue;
        };
        if let Some(token) = object.get("x-mcp-header") {
            let path = path.clone().filter(|p| !p.is_empty())?;
            let token = token.as_str().filter(|t| is_token(t))?;
            let kind = object.get("type").and_then(Value::as_str);
            let kind = kind.filter(|k| ["string", "integer", "boolean"].contains(k))?;
            let taken = |(_, t, _): &(Vec<String>, String, String)| t.eq_ignore_ascii_case(token);
            if found.iter().any(taken) {
                return None;
            }
            found.push((path, token.to_owned(), kind.to_owned()));
        }
        for (key, value) in object {
            if key == "properties" {
                for (name, sub) in value.as_object().into_iter().flatten() {
                    let sub_path = path.clone().map(|mut p| {
                        p.push(name.clone());
                        p
                    });
                    stack.push((sub_path, sub));
                }
            } else if SINGLE.contains(&key.as_str()) {
                stack.push((None, value));
            } else if LISTS.contains(&key.as_str()) {
                stack.extend(value.as_array().into_iter().flatten().map(|v| (None, v)));
            } else if MAPS.contains(&key.as_str()) {
                stack.extend(
                    value
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(_, v)| (None, v)),
                );
            }
        }
    }
    Some(found)
}

/// An RFC 9110 token (`1*tchar`).
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks a tools/call's `Mcp-Param-*` headers against its arguments for
/// the tool's annotated properties: present together and equal (after
/// decoding; integers by value), or absent together (`null` is absent).
pub fn check_param_headers(
    schema: &Value,
    arguments: &Value,
    headers: &RoutingHeaders,
) -> Result<(), Rejection> {
    let Some(annotations) = param_annotations(schema) else {
        return Ok(());
    };
    let mismatch = |text: String| {
        Err(Rejection::new(
            HEADER_MISMATCH,
            format!("Header mismatch: {text}"),
        ))
    };
    for (path, token, kind) in annotations {
        let name = format!("mcp-param-{}", token.to_ascii_lowercase());
        let shown = format!("Mcp-Param-{token}");
        let mut values = headers.params.iter().filter(|(n, _)| *n == name);
        let raw = values.next().map(|(_, v)| v.as_str());
        if values.next().is_some() {
            return mismatch(format!("{shown} header appears more than once"));
        }
        let mut value = Some(arguments);
        for key in &path {
            value = value.and_then(|v| v.get(key));
        }
        let argument = format!("arguments.{}", path.join("."));
        let rendered = match value.filter(|v| !v.is_null()) {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                if raw.is_some() {
                    return mismatch(format!("{shown} header does not match {argument}"));
                }
                continue;
            }
        };
        match (raw, rendered) {
            (None, None) => {}
            (Some(_), None) => {
                return mismatch(format!(
                    "{shown} header is present but {argument} is absent"
                ));
            }
            (None, Some(_)) => {
                return mismatch(format!(
                    "{shown} header is missing but {argument} is present"
                ));
            }
            (Some(raw), Some(rendered)) => {
                let Some(decoded) = decode_header_value(raw) else {
                    return mismatch(format!("{shown} header is not valid =?base64?...?="));
                };
                let same =
                    decoded == rendered || (kind == "integer" && same_integer(&decoded, value));
                if !same {
                    return mismatch(format!(
                        "{shown} header value {raw:?} does not match {argument} {rendered}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether a decimal header value names the same integer as the argument
/// (`42` and `42.0` are one value).
fn same_integer(header: &str, value: Option<&Value>) -> bool {
    let Some(expected) = value.and_then(Value::as_f64).filter(|f| f.fract() == 0.0) else {
        return false;
    };
    let (whole, fraction) = header.split_once('.').unwrap_or((header, ""));
    let digits = whole.strip_prefix('-').unwrap_or(whole);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b == b'0');
    canonical && whole.parse::<i64>().is_ok_and(|n| n as f64 == expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_sentinel_needs_canonical_padding() {
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?="),
            Some("Hello, 世界".to_owned())
        );
        assert_eq!(
            decode_header_value("=?base64?IHBhZGRlZCA=?="),
            Some(" padded ".to_owned())
        );
        assert_eq!(decode_header_value("=?base64??="), Some(String::new()));
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8?="),
            None,
            "missing padding"
        );
        assert_eq!(
            decode_header_value("=?base64?SGVs!!!bG8=?="),
            None,
            "bad alphabet"
        );
        assert_eq!(
            decode_header_value("=?base64?SGVsbG9=?="),
            None,
            "non-zero unused bits"
        );
        assert_eq!(
            decode_header_value("=?base64?SG==VsbG8=?="),
            None,
            "padding inside"
        );
        assert_eq!(decode_header_value("=?base64?/w==?="), None, "not UTF-8");
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8="),
            Some("=?base64?SGVsbG8=".to_owned())
        );
        assert_eq!(decode_header_value("plain"), Some("plain".to_owned()));
    }

    #[test]
    fn annotations_only_on_properties_chains() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "object", "properties": {"count": {"type": "integer", "x-mcp-header": "Count"}}}}});
        let mut found = param_annotations(&schema).unwrap();
        found.sort();
        assert_eq!(
            found,
            vec![
                (
                    vec!["n".to_owned(), "count".to_owned()],
                    "Count".to_owned(),
                    "integer".to_owned()
                ),
                (
                    vec!["region".to_owned()],
                    "Region".to_owned(),
                    "string".to_owned()
                ),
            ]
        );
        let through_items = json!({"properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}});
        assert_eq!(param_annotations(&through_items), None);
        let number = json!({"properties": {"a": {"type": "number", "x-mcp-header": "A"}}});
        assert_eq!(param_annotations(&number), None);
        let twice = json!({"properties": {"a": {"type": "string", "x-mcp-header": "A"}, "b": {"type": "string", "x-mcp-header": "a"}}});
        assert_eq!(param_annotations(&twice), None);
    }

    #[test]
    fn integers_compare_by_value() {
        assert!(same_integer("42.0", Some(&json!(42))));
        assert!(same_integer("-7", Some(&json!(-7.0))));
        assert!(!same_integer("42.5", Some(&json!(42))));
        assert!(!same_integer("4e1", Some(&json!(40))));
    }
}

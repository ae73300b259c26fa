//! Strict JSON-RPC parsing and canonical re-serialization.
//!
//! A message is parsed once, strictly, and what is forwarded is the canonical
//! serialization of exactly the tree that was checked, so that no message can
//! mean one thing to the gateway and another to the server. Refused:
//!
//! - bodies over the size limit, invalid UTF-8 (the byte is named), trailing
//!   bytes, anything that is not JSON (NaN, Infinity, comments, ...);
//! - duplicate object keys, compared after unescaping and under every
//!   decoder's case folding at once (see [`key_skeleton`]), so `method`,
//!   `Method`, `\u006dethod` and `METHOD` collide, and so do `arguments` and
//!   `argumentſ` (ſ folds to s): some servers look keys up
//!   case-insensitively, and every parser picks a different duplicate;
//! - a key the gateway reads (`method`, `params`, `arguments`, `name`, ...)
//!   spelled any other way that some decoder reads as it: Go's
//!   `encoding/json` hands a lone `Arguments` to a server as `arguments`,
//!   while an exact-match reader (the policy's) sees no arguments at all;
//! - whole numbers beyond ±(2^53 − 1), where parsers disagree (Python keeps
//!   them exact, JavaScript rounds them);
//! - more JSON values than the size limit allows ([`Limits::max_values`]);
//! - nesting deeper than the limit; batches; anything that is not a JSON-RPC
//!   2.0 request, notification or response: a `notifications/...` method
//!   with an `id`, and any other method without one, are neither.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The largest whole number every common JSON parser reads exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Limits {
    /// The most JSON values (every string, number, array, object, ...) a
    /// message may hold: one per 32 bytes of the size limit (131,072 for
    /// 4 MiB). A parsed value costs 32 bytes or more, so a message of tiny
    /// numbers would otherwise need far more memory than its size; with
    /// this bound, at most a few times its size.
    pub fn max_values(&self) -> usize {
        (self.max_bytes / 32).max(4096)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 4 * 1024 * 1024,
            max_depth: 64,
        }
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("message is {size} bytes; the limit is {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 { offset: usize },
    #[error("invalid JSON at line {line} column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "duplicate key {key:?} at {path} (keys are compared after unescaping and case folding)"
    )]
    DuplicateKey { path: String, key: String },
    #[error(
        "key {key:?} at {path} reads as {reads_as:?} to case-insensitive decoders; spell it exactly {reads_as:?}"
    )]
    ConfusableKey {
        path: String,
        key: String,
        reads_as: String,
    },
    #[error("number at {path} is beyond ±(2^53 − 1), where JSON parsers disagree")]
    UnsafeNumber { path: String },
    #[error("the message holds more than {limit} JSON values")]
    TooManyValues { limit: usize },
    #[error("nesting deeper than {limit} at {path}")]
    TooDeep { path: String, limit: usize },
    #[error("batches are not supported")]
    Batch,
    #[error("invalid JSON-RPC message: {0}")]
    Invalid(&'static str),
}

impl Refusal {
    /// -32700 when the bytes are not acceptable JSON, -32600 when the JSON is
    /// not an acceptable JSON-RPC message.
    pub fn code(&self) -> i64 {
        match self {
            Refusal::TooLarge { .. }
            | Refusal::InvalidUtf8 { .. }
            | Refusal::Syntax { .. }
            | Refusal::DuplicateKey { .. }
            | Refusal::UnsafeNumber { .. }
            | Refusal::TooDeep { .. }
            | Refusal::TooManyValues { .. } => -32700,
            Refusal::ConfusableKey { path, .. } if path != "$" => -32602,
            Refusal::Batch | Refusal::Invalid(_) | Refusal::ConfusableKey { .. } => -32600,
        }
    }
}

/// What kind of JSON-RPC message this is.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Request { id: Value, method: String },
    Notification { method: String },
    Response { id: Value },
}

/// A message that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub value: Value,
    pub kind: Kind,
    /// The text `value` was parsed from ([`parse_bytes`]), kept while
    /// `value` still says exactly what it says, so that what forwards the
    /// message can splice it instead of writing it again: whoever changes
    /// `value` sets this to None.
    pub source: Option<bytes::Bytes>,
}

impl Message {
    pub fn method(&self) -> Option<&str> {
        match &self.kind {
            Kind::Request { method, .. } | Kind::Notification { method } => Some(method),
            Kind::Response { .. } => None,
        }
    }

    pub fn id(&self) -> Option<&Value> {
        match &self.kind {
            Kind::Request { id, .. } | Kind::Response { id } => Some(id),
            Kind::Notification { .. } => None,
        }
    }

    pub fn params(&self) -> Option<&Value> {
        self.value.get("params")
    }

    /// The canonical bytes to forward: compact JSON, keys sorted, numbers as
    /// parsed.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).unwrap_or_default()
    }
}

/// A refusal, with the request id when it could still be known.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub refusal: Refusal,
    pub id: Option<Value>,
}

impl Refused {
    /// The JSON-RPC error response to send back.
    pub fn response(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id.clone().unwrap_or(Value::Null),
            "error": {"code": self.refusal.code(), "message": self.refusal.to_string()},
        })
    }
}

/// Parses one JSON-RPC message strictly.
pub fn parse(bytes: &[u8], limits: Limits) -> Result<Message, Refused> {
    let value = parse_value(bytes, limits).map_err(|refusal| Refused {
        id: recover_id(bytes, &refusal),
        refusal,
    })?;
    let kind = classify(&value).map_err(|refusal| Refused {
        id: value.get("id").filter(|id| is_valid_id(id)).cloned(),
        refusal,
    })?;
    Ok(Message {
        value,
        kind,
        source: None,
    })
}

/// [`parse`], keeping the text as the message's `source`.
pub fn parse_bytes(bytes: bytes::Bytes, limits: Limits) -> Result<Message, Refused> {
    let mut message = parse(&bytes, limits)?;
    message.source = Some(bytes);
    Ok(message)
}

/// Parses any JSON value strictly (the same rules, without the JSON-RPC
/// shape): used for upstream responses too.
pub fn parse_value(bytes: &[u8], limits: Limits) -> Result<Value, Refusal> {
    if bytes.len() > limits.max_bytes {
        return Err(Refusal::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            return Err(Refusal::InvalidUtf8 {
                offset: e.valid_up_to(),
            });
        }
    };
    // From the text, checked once: read from the bytes, every string
    // would be checked again.
    let mut de = serde_json::Deserializer::from_str(text);
    let mut error = None;
    let values = std::cell::Cell::new(0);
    let value = StrictSeed {
        depth: 0,
        limits,
        path: Path::Root,
        error: &mut error,
        values: &values,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    match (value, error) {
        (_, Some(refusal)) => Err(refusal),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(Refusal::Syntax {
            line: e.line(),
            column: e.column(),
            message: syntax_message(&e),
        }),
    }
}

fn syntax_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    // serde_json appends " at line L column C"; we report those separately.
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

fn classify(value: &Value) -> Result<Kind, Refusal> {
    let obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => return Err(Refusal::Batch),
        _ => return Err(Refusal::Invalid("a message must be a JSON object")),
    };
    refuse_confusable(obj, ENVELOPE_KEYS, "$")?;
    if let Some(Value::Object(params)) = obj.get("params") {
        refuse_confusable(params, PARAMS_KEYS, "$.params")?;
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Refusal::Invalid("\"jsonrpc\" must be \"2.0\""));
    }
    let id = match obj.get("id") {
        None => None,
        Some(id) if is_valid_id(id) => Some(id.clone()),
        Some(_) => return Err(Refusal::Invalid("\"id\" must be a string or an integer")),
    };
    if let Some(method) = obj.get("method") {
        let method = method
            .as_str()
            .ok_or(Refusal::Invalid("\"method\" must be a string"))?;
        if obj.contains_key("result") || obj.contains_key("error") {
            return Err(Refusal::Invalid(
                "a request cannot carry \"result\" or \"error\"",
            ));
        }
        if let Some(p) = obj.get("params")
            && !(p.is_object() || p.is_array())
        {
            return Err(Refusal::Invalid("\"params\" must be an object or an array"));
        }
        return match id {
            // Neither: one server would run it as a request and answer,
            // another drop it as a notification.
            Some(_) if method.starts_with("notifications/") => Err(Refusal::Invalid(
                "a notifications/... method is a notification and carries no \"id\"",
            )),
            Some(id) => Ok(Kind::Request {
                id,
                method: method.to_owned(),
            }),
            // MCP's notifications are all `notifications/...`; anything else
            // without an id is a request that lost it (to one server a call
            // to run, to another an invalid request), never forwarded.
            None if method.starts_with("notifications/") => Ok(Kind::Notification {
                method: method.to_owned(),
            }),
            None => Err(Refusal::Invalid(
                "a request needs an \"id\" (only notifications/... methods are notifications)",
            )),
        };
    }
    let id = id.ok_or(Refusal::Invalid(
        "a message needs \"method\", or \"id\" with \"result\" or \"error\"",
    ))?;
    match (obj.contains_key("result"), obj.contains_key("error")) {
        (true, false) | (false, true) => Ok(Kind::Response { id }),
        _ => Err(Refusal::Invalid(
            "a response carries exactly one of \"result\" and \"error\"",
        )),
    }
}

/// MCP ids: a string or an integer (never null).
fn is_valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// After a refusal, the id if a lenient parse can still tell it and the
/// refusal is not about the id itself.
fn recover_id(bytes: &[u8], refusal: &Refusal) -> Option<Value> {
    if let Refusal::DuplicateKey { path, key } = refusal
        && path == "$"
        && key_skeleton(key) == "id"
    {
        return None;
    }
    if matches!(
        refusal,
        Refusal::TooLarge { .. } | Refusal::InvalidUtf8 { .. }
    ) {
        return None;
    }
    // Everything but the id is skipped, not built: the memory a refused
    // message costs stays bounded.
    #[derive(serde::Deserialize)]
    struct IdOnly {
        #[serde(default)]
        id: Option<Value>,
    }
    let only: IdOnly = serde_json::from_slice(bytes).ok()?;
    only.id.filter(is_valid_id)
}

/// The keys the gateway and the policy read in a message's envelope.
const ENVELOPE_KEYS: &[&str] = &["jsonrpc", "id", "method", "params", "result", "error"];

/// The keys they read in `params` (of any method: the set is small, and no
/// MCP method has a legitimate key that folds to one of these).
const PARAMS_KEYS: &[&str] = &[
    "name",
    "arguments",
    "uri",
    "cursor",
    "requestId",
    "protocolVersion",
    "capabilities",
    "_meta",
    "task",
];

/// The longest skeleton of any key in the two lists, in bytes.
const LONGEST_READ_KEY: usize = 15;

/// Refuses a key of `obj` that is not one of `read` but has the skeleton of
/// one: to a decoder that matches keys case-insensitively it is that key,
/// while the policy, reading exactly, never saw it.
fn refuse_confusable(obj: &Map<String, Value>, read: &[&str], path: &str) -> Result<(), Refusal> {
    for key in obj.keys() {
        if read.contains(&key.as_str()) || key.len() > 4 * LONGEST_READ_KEY {
            continue;
        }
        let skeleton = key_skeleton(key);
        if let Some(reads_as) = read.iter().find(|k| k.eq_ignore_ascii_case(&skeleton)) {
            return Err(Refusal::ConfusableKey {
                path: path.to_owned(),
                key: key.clone(),
                reads_as: (*reads_as).to_owned(),
            });
        }
    }
    Ok(())
}

/// Non-ASCII characters some decoder folds to ASCII letters when it matches
/// keys: Go's `encoding/json` (per rune, upper of lower: `İ` -> `I`, `ı` ->
/// `I`, `ſ` -> `S`, the Kelvin sign -> `K`), Unicode simple case folding
/// (`ſ`, Kelvin), full case folding (`ß` -> `ss`, the Latin ligatures), and
/// Java's and .NET's upper- and lower-casing. The table is complete for
/// Unicode's own mappings (a unit test walks every code point) and for Go's
/// (the decoder differential asks Go).
const ASCII_FOLDS: &[(char, &str)] = &[
    ('\u{0130}', "i"),   // İ LATIN CAPITAL LETTER I WITH DOT ABOVE
    ('\u{0131}', "i"),   // ı LATIN SMALL LETTER DOTLESS I
    ('\u{017F}', "s"),   // ſ LATIN SMALL LETTER LONG S
    ('\u{212A}', "k"),   // K KELVIN SIGN
    ('\u{00DF}', "ss"),  // ß
    ('\u{1E9E}', "ss"),  // ẞ
    ('\u{FB00}', "ff"),  // ﬀ
    ('\u{FB01}', "fi"),  // ﬁ
    ('\u{FB02}', "fl"),  // ﬂ
    ('\u{FB03}', "ffi"), // ﬃ
    ('\u{FB04}', "ffl"), // ﬄ
    ('\u{FB05}', "st"),  // ﬅ
    ('\u{FB06}', "st"),  // ﬆ
];

/// A key as every case-insensitive decoder at once would compare it: ASCII
/// lowercased, the characters of [`ASCII_FOLDS`] replaced by the ASCII they
/// fold to, everything else by its Unicode simple case folding. Two keys with
/// one skeleton may be one key to some server.
pub fn key_skeleton(key: &str) -> std::borrow::Cow<'_, str> {
    if key.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
        } else if let Some((_, ascii)) = ASCII_FOLDS.iter().find(|(f, _)| *f == c) {
            out.push_str(ascii);
        } else {
            out.push(
                unicode_case_mapping::case_folded(c)
                    .and_then(|cp| char::from_u32(cp.get()))
                    .unwrap_or(c),
            );
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The hash of `key`'s [`key_skeleton`]. A short ASCII key with capitals
/// (`protocolVersion`) is lowercased on the stack; any other key's skeleton
/// is [`key_skeleton`]'s, borrowed when it is the key itself: every key of
/// every object passes here.
fn skeleton_hash(hasher: &foldhash::fast::RandomState, key: &str) -> u64 {
    const SHORT: usize = 64;
    if key.len() <= SHORT && key.is_ascii() && key.bytes().any(|b| b.is_ascii_uppercase()) {
        let mut buffer = [0u8; SHORT];
        let lower = &mut buffer[..key.len()];
        lower.copy_from_slice(key.as_bytes());
        lower.make_ascii_lowercase();
        if let Ok(lower) = std::str::from_utf8(lower) {
            return hasher.hash_one(lower);
        }
    }
    hasher.hash_one(&*key_skeleton(key))
}

/// The skeleton hashes of one object's keys: on the stack while the object
/// has few keys (almost every object), in a set beyond.
#[derive(Default)]
struct SeenHashes {
    inline: [u64; SeenHashes::INLINE],
    len: usize,
    spilled: Option<HashSet<u64, foldhash::fast::RandomState>>,
}

impl SeenHashes {
    const INLINE: usize = 16;

    /// Whether `hash` is new (as `HashSet::insert`).
    fn insert(&mut self, hash: u64) -> bool {
        if let Some(set) = &mut self.spilled {
            return set.insert(hash);
        }
        if self.inline[..self.len].contains(&hash) {
            return false;
        }
        if self.len < Self::INLINE {
            self.inline[self.len] = hash;
            self.len += 1;
        } else {
            let mut set = HashSet::with_capacity_and_hasher(
                2 * Self::INLINE,
                foldhash::fast::RandomState::default(),
            );
            set.extend(self.inline);
            set.insert(hash);
            self.spilled = Some(set);
        }
        true
    }
}

/// Where in the document a value sits, for error messages (`$.params.arguments`).
#[derive(Clone)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("$"),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Deserializes a `Value`, recording the first strictness violation in
/// `error` (and failing the parse so it stops there).
struct StrictSeed<'a, 'p> {
    depth: usize,
    limits: Limits,
    path: Path<'p>,
    error: &'a mut Option<Refusal>,
    /// Values read so far in the whole message.
    values: &'a std::cell::Cell<usize>,
}

impl StrictSeed<'_, '_> {
    fn refuse<E: de::Error>(self, refusal: Refusal) -> Result<Value, E> {
        let message = refusal.to_string();
        *self.error = Some(refusal);
        Err(E::custom(message))
    }

    fn number<E: de::Error>(self, n: Number, whole: Option<u64>) -> Result<Value, E> {
        match whole {
            Some(magnitude) if magnitude > MAX_SAFE_INTEGER => {
                let path = self.path.to_string();
                self.refuse(Refusal::UnsafeNumber { path })
            }
            _ => Ok(Value::Number(n)),
        }
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        let seen = self.values.get() + 1;
        self.values.set(seen);
        if seen > self.limits.max_values() {
            let limit = self.limits.max_values();
            let refusal = Refusal::TooManyValues { limit };
            let message = refusal.to_string();
            *self.error = Some(refusal);
            return Err(de::Error::custom(message));
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.number(Number::from(v), Some(v.unsigned_abs()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.number(Number::from(v), Some(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        let Some(n) = Number::from_f64(v) else {
            return Err(E::custom("number is not finite"));
        };
        // Every f64 beyond 2^53 is whole; whether it was written `1e20` or as
        // digits, parsers do not agree on it.
        let whole = (v.fract() == 0.0 && v.abs() > MAX_SAFE_INTEGER as f64).then_some(u64::MAX);
        self.number(n, whole)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.depth >= self.limits.max_depth {
            let path = self.path.to_string();
            let limit = self.limits.max_depth;
            return self.refuse(Refusal::TooDeep { path, limit });
        }
        let mut items = Vec::new();
        loop {
            let path = Path::Index(&self.path, items.len());
            let seed = StrictSeed {
                depth: self.depth + 1,
                limits: self.limits,
                path,
                error: &mut *self.error,
                values: self.values,
            };
            match seq.next_element_seed(seed)? {
                Some(v) => items.push(v),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.depth >= self.limits.max_depth {
            let path = self.path.to_string();
            let limit = self.limits.max_depth;
            return self.refuse(Refusal::TooDeep { path, limit });
        }
        let mut out = Map::new();
        // The hashes of the keys' skeletons so far, not the skeletons: no
        // string is kept per key. A hash seen before is confirmed against
        // the keys themselves, so a collision never refuses a message.
        let hasher = foldhash::fast::RandomState::default();
        let mut seen = SeenHashes::default();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(skeleton_hash(&hasher, &key)) {
                let skeleton = key_skeleton(&key);
                if out.keys().any(|k| key_skeleton(k) == skeleton) {
                    drop(skeleton);
                    let path = self.path.to_string();
                    return self.refuse(Refusal::DuplicateKey { path, key });
                }
            }
            let path = Path::Key(&self.path, &key);
            let seed = StrictSeed {
                depth: self.depth + 1,
                limits: self.limits,
                path,
                error: &mut *self.error,
                values: self.values,
            };
            let value = map.next_value_seed(seed)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that one case-insensitive decoder or another reads as one are
    /// duplicates, at any depth; keys that differ under every folding are
    /// not, however many an object holds.
    #[test]
    fn keys_one_under_folding_are_duplicates_and_others_are_not() {
        let limits = Limits::default();
        for (doc, key) in [
            (r#"{"a":1,"a":2}"#, "a"),
            (r#"{"x":{"path":1,"PATH":2}}"#, "PATH"),
            (r#"{"arguments":1,"argumentſ":2}"#, "argumentſ"),
            (r#"{"kelvin":1,"\u212Aelvin":2}"#, "\u{212a}elvin"),
        ] {
            match parse_value(doc.as_bytes(), limits) {
                Err(Refusal::DuplicateKey { key: k, .. }) => {
                    assert_eq!(format!("{k:?}").trim_matches('"'), key, "{doc}");
                }
                other => panic!("{doc}: {other:?}"),
            }
        }
        // Short ASCII keys are hashed without their skeleton being made:
        // still one key with a folded or a long one, and with keys read
        // before an object's set spills to the heap.
        let long = "A".repeat(70);
        let twenty: Vec<String> = (0..20).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let twenty = twenty.join(",");
        for (doc, key) in [
            (r#"{"ss":1,"ß":2}"#.to_owned(), "ß".to_owned()),
            (r#"{"ß":1,"SS":2}"#.to_owned(), "SS".to_owned()),
            (
                format!(r#"{{"{}":1,"{long}":2}}"#, long.to_lowercase()),
                long.clone(),
            ),
            (format!(r#"{{{twenty},"K3":0}}"#), "K3".to_owned()),
            (format!(r#"{{{twenty},"K19":0}}"#), "K19".to_owned()),
        ] {
            match parse_value(doc.as_bytes(), limits) {
                Err(Refusal::DuplicateKey { key: k, .. }) => assert_eq!(k, key, "{doc}"),
                other => panic!("{doc}: {other:?}"),
            }
        }
        let many: Vec<String> = (0..2000).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let doc = format!("{{{},\"K\":0,\"q\":1}}", many.join(","));
        let value = parse_value(doc.as_bytes(), limits).unwrap();
        assert_eq!(value.as_object().unwrap().len(), 2002);
    }

    /// Every code point whose Unicode case mappings (lower, upper, either of
    /// the other, simple folding) are pure ASCII is in the table, with that
    /// ASCII: the table cannot fall behind Unicode's data.
    #[test]
    fn ascii_folds_cover_every_unicode_mapping_to_ascii() {
        let simple = |c: char| {
            unicode_case_mapping::case_folded(c)
                .and_then(|cp| char::from_u32(cp.get()))
                .map(String::from)
        };
        for c in (0x80..=0x10FFFFu32).filter_map(char::from_u32) {
            let lower: String = c.to_lowercase().collect();
            let upper: String = c.to_uppercase().collect();
            let candidates = [
                upper.to_lowercase(),
                lower.to_uppercase(),
                lower,
                upper,
                simple(c).unwrap_or_default(),
            ];
            for candidate in candidates.iter().filter(|s| !s.is_empty() && s.is_ascii()) {
                let folded = key_skeleton(candidate).into_owned();
                assert_eq!(
                    key_skeleton(&c.to_string()),
                    folded,
                    "U+{:04X} maps to {candidate:?}: add it to ASCII_FOLDS",
                    c as u32
                );
            }
        }
    }
}

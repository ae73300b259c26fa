//! Checking a parsed document field by field, every error with its path:
//! the typed accessors the AgentPolicy check is built of, public so that a
//! check of a document that embeds an AgentPolicy (the cluster object `aip
//! policy check` reads) words its errors, and writes its paths, the same.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use crate::document::FieldError;
use crate::regexes::LazyRegex;

/// Walks a document, collecting errors as it goes.
#[derive(Debug, Default)]
pub struct Checker {
    pub errors: Vec<FieldError>,
    /// The argument regexes that passed, by pattern, for the compiler.
    pub regexes: FxHashMap<Box<str>, Arc<LazyRegex>>,
}

impl Checker {
    pub fn error(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.to_owned(),
            message: message.into(),
        });
    }

    pub fn object<'v>(&mut self, value: &'v Value, path: &str) -> Option<&'v Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            other => {
                let what = if path.is_empty() {
                    "the document"
                } else {
                    "value"
                };
                self.error(
                    path,
                    format!("{what} must be a mapping, found {}", type_name(other)),
                );
                None
            }
        }
    }

    pub fn array<'v>(&mut self, value: &'v Value, path: &str) -> Option<&'v Vec<Value>> {
        match value {
            Value::Array(items) => Some(items),
            other => {
                self.error(path, format!("must be a list, found {}", type_name(other)));
                None
            }
        }
    }

    pub fn known_keys(&mut self, map: &Map<String, Value>, path: &str, known: &[&str]) {
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.error(
                    &join_key(path, key),
                    format!("unknown field; expected one of: {}", known.join(", ")),
                );
            }
        }
    }
}

/// `spec.tool_rules[0].allow_args.url`, or `...allow_args["odd key"]` when the
/// key would not read as one path segment.
pub fn join_key(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{key:?}]"),
    }
}

pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

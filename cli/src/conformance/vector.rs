//! The vector file format: a suite with `tests`, each with a policy (inline
//! YAML text, an inline mapping, or null for "no policy loaded"), an `input`
//! and the `expected` outcome. Fields beside these (notes, descriptions) are
//! ignored; a field inside `input` or `expected` that this runner does not
//! understand makes the vector unsupported (reported as such, never passed),
//! as does a vector that states no expected outcome at all.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub struct Suite {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tests: Vec<Vector>,
}

#[derive(Debug, Deserialize)]
pub struct Vector {
    pub id: String,
    #[serde(default)]
    pub policy: Value,
    #[serde(default)]
    pub input: Input,
    #[serde(default)]
    pub expected: Expected,
}

#[derive(Debug, Default, Deserialize)]
pub struct Input {
    /// `request` (the default) or `response` (a DLP vector).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(default)]
    pub args: Option<Value>,
    #[serde(default)]
    pub request_id: Option<Value>,
    #[serde(default)]
    pub context: Context,
    /// Response text (or a tool result object) for DLP vectors.
    #[serde(default)]
    pub content: Option<Value>,
    /// Fields this runner does not understand.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Context {
    /// Calls of the same tool made just before this one (rate limits).
    #[serde(default)]
    pub previous_calls: Option<u32>,
    /// The span the previous calls were made in, ending with this one
    /// (`1m`, `30s`, `500ms`, `2h`).
    #[serde(default)]
    pub window: Option<String>,
    /// The person's answer to an ASK: approve, deny or timeout.
    #[serde(default)]
    pub user_response: Option<String>,
    /// Fields this runner does not understand.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// Every field is optional: only what a vector states is checked. Fields
/// that may be stated as null keep null distinct from absent.
#[derive(Debug, Default, Deserialize)]
pub struct Expected {
    /// `false` when the policy itself must be refused (also spelled
    /// `policy_valid`, or stated as decision ERROR / INVALID).
    #[serde(default, alias = "policy_valid")]
    pub valid: Option<bool>,
    #[serde(default)]
    pub decision: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub error_code: Option<Value>,
    #[serde(default)]
    pub violation: Option<bool>,
    #[serde(default)]
    pub error_message: Option<String>,
    #[serde(default)]
    pub error_data: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub redacted: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    pub output: Option<Value>,
    #[serde(default)]
    pub dlp_events: Option<Vec<ExpectedEvent>>,
    /// Fields this runner does not understand.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExpectedEvent {
    pub rule: String,
    pub count: usize,
}

impl Vector {
    /// Why this runner cannot interpret the vector, if it cannot: such a
    /// vector is reported unsupported, never counted as passed.
    pub fn unsupported(&self) -> Option<String> {
        let unknown = |at: &str, fields: &BTreeMap<String, Value>| {
            let names: Vec<String> = fields.keys().map(|k| format!("{at}.{k}")).collect();
            (!names.is_empty()).then(|| format!("not understood: {}", names.join(", ")))
        };
        unknown("input", &self.input.unknown)
            .or_else(|| unknown("input.context", &self.input.context.unknown))
            .or_else(|| unknown("expected", &self.expected.unknown))
            .or_else(|| match self.input.kind.as_deref() {
                None | Some("request" | "response") => None,
                Some(other) => Some(format!(
                    "input.type {other:?} is neither request nor response"
                )),
            })
            .or_else(|| {
                self.expected
                    .states_nothing()
                    .then(|| "the vector states no expected outcome".to_owned())
            })
    }
}

impl Expected {
    /// Whether no expectation at all is stated (nothing could fail).
    fn states_nothing(&self) -> bool {
        let Expected {
            valid,
            decision,
            error_code,
            violation,
            error_message,
            error_data,
            response_format,
            redacted,
            output,
            dlp_events,
            unknown: _,
        } = self;
        valid.is_none()
            && decision.is_none()
            && error_code.is_none()
            && violation.is_none()
            && error_message.is_none()
            && error_data.is_none()
            && response_format.is_none()
            && redacted.is_none()
            && output.is_none()
            && dlp_events.is_none()
    }

    /// Whether the vector expects the policy to be refused.
    pub fn expects_invalid_policy(&self) -> bool {
        self.valid == Some(false)
            || matches!(
                self.decision.as_deref(),
                Some("ERROR" | "INVALID" | "INVALID_POLICY")
            )
    }
}

/// Some(Value::Null) for an explicit null, None (via `default`) when absent.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

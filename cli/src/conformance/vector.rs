//! The vector file format: a suite with `tests`, each with a policy (inline
//! YAML text, an inline mapping, or null for "no policy loaded"), an `input`
//! and the `expected` outcome. Unknown fields (notes, descriptions) are
//! ignored so that newer vector files still run.

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
}

#[derive(Debug, Default, Deserialize)]
pub struct Context {
    /// Calls of the same tool made just before this one (rate limits).
    #[serde(default)]
    pub previous_calls: Option<u32>,
    /// The person's answer to an ASK: approve, deny or timeout.
    #[serde(default)]
    pub user_response: Option<String>,
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
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExpectedEvent {
    pub rule: String,
    pub count: usize,
}

impl Expected {
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

//! The JSON-RPC error objects a gateway returns to the agent (spec §4).

use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;

/// AIP error codes, and the standard JSON-RPC codes gateways answer with.
pub mod codes {
    pub const FORBIDDEN: i64 = -32001;
    pub const RATE_LIMITED: i64 = -32002;
    pub const USER_DENIED: i64 = -32004;
    pub const APPROVAL_TIMEOUT: i64 = -32005;
    pub const METHOD_NOT_ALLOWED: i64 = -32006;
    pub const PROTECTED_PATH: i64 = -32007;
    pub const SCHEMA_MISMATCH: i64 = -32013;
    /// The project's own, in MCP's implementation-defined range outside the
    /// codes AIP v1alpha2 assigns (-32015 to -32019; docs/approvals.md
    /// lists them beside AIP's): an ask ended undecided, `data.cause` says
    /// why.
    pub const APPROVAL_WITHDRAWN: i64 = -32015;
    /// The gateway is shutting down: what it held is answered at once.
    pub const GATEWAY_SHUTTING_DOWN: i64 = -32016;
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// The message that goes with each code.
pub fn message_for(code: i64) -> &'static str {
    match code {
        codes::FORBIDDEN => "Forbidden",
        codes::RATE_LIMITED => "Rate limit exceeded",
        codes::USER_DENIED => "User denied",
        codes::APPROVAL_TIMEOUT => "User approval timeout",
        codes::METHOD_NOT_ALLOWED => "Method not allowed",
        codes::PROTECTED_PATH => "Access denied: protected path",
        codes::SCHEMA_MISMATCH => "Schema mismatch",
        codes::APPROVAL_WITHDRAWN => "Approval withdrawn",
        codes::GATEWAY_SHUTTING_DOWN => "Gateway shutting down",
        codes::INVALID_REQUEST => "Invalid Request",
        codes::INVALID_PARAMS => "Invalid params",
        codes::PARSE_ERROR => "Parse error",
        codes::METHOD_NOT_FOUND => "Method not found",
        codes::INTERNAL_ERROR => "Internal error",
        _ => "Error",
    }
}

/// What an error is about: a tool or a method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Tool(String),
    Method(String),
}

/// A JSON-RPC error object: `{"code", "message", "data": {"tool"|"method",
/// "reason"}}`, and `data.cause` (a stable word) when the code alone does
/// not say what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub subject: Subject,
    pub reason: String,
    pub cause: Option<&'static str>,
}

impl RpcError {
    pub fn new(code: i64, subject: Subject, reason: impl Into<String>) -> RpcError {
        RpcError {
            code,
            subject,
            reason: reason.into(),
            cause: None,
        }
    }

    /// The same with `data.cause`.
    pub fn with_cause(self, cause: &'static str) -> RpcError {
        RpcError {
            cause: Some(cause),
            ..self
        }
    }

    pub fn message(&self) -> &'static str {
        message_for(self.code)
    }

    /// The full JSON-RPC response carrying this error, echoing `id` exactly
    /// (number or string).
    pub fn response(&self, id: &Value) -> Value {
        serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": self })
    }
}

impl Serialize for RpcError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("code", &self.code)?;
        m.serialize_entry("message", self.message())?;
        m.serialize_entry("data", &ErrorData(self))?;
        m.end()
    }
}

struct ErrorData<'a>(&'a RpcError);

impl Serialize for ErrorData<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2 + usize::from(self.0.cause.is_some())))?;
        match &self.0.subject {
            Subject::Tool(t) => m.serialize_entry("tool", t)?,
            Subject::Method(x) => m.serialize_entry("method", x)?,
        }
        m.serialize_entry("reason", &self.0.reason)?;
        if let Some(cause) = self.0.cause {
            m.serialize_entry("cause", cause)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_echoes_number_and_string_ids() {
        let e = RpcError::new(
            codes::FORBIDDEN,
            Subject::Tool("any_tool".into()),
            "Tool not in allowed_tools list",
        );
        assert_eq!(
            e.response(&json!(123)),
            json!({"jsonrpc": "2.0", "id": 123, "error": {"code": -32001, "message": "Forbidden",
                   "data": {"tool": "any_tool", "reason": "Tool not in allowed_tools list"}}})
        );
        assert_eq!(e.response(&json!("abc-123"))["id"], json!("abc-123"));
    }

    #[test]
    fn every_code_has_its_spec_message() {
        for (code, msg) in [
            (-32001, "Forbidden"),
            (-32002, "Rate limit exceeded"),
            (-32004, "User denied"),
            (-32005, "User approval timeout"),
            (-32006, "Method not allowed"),
            (-32007, "Access denied: protected path"),
            (-32013, "Schema mismatch"),
            (-32015, "Approval withdrawn"),
            (-32016, "Gateway shutting down"),
        ] {
            assert_eq!(message_for(code), msg);
        }
    }
}

//! A read-only view of one JSON-RPC message from the agent: just the parts
//! the policy looks at. Strict wire parsing (duplicate keys, number forms,
//! trailing bytes) is the gateway's job; this checks the JSON-RPC shape.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// None for a notification.
    pub id: Option<&'a Value>,
    pub method: &'a str,
    pub params: Option<&'a Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("message must be a JSON object")]
    NotAnObject,
    #[error("jsonrpc: must be the string \"2.0\"")]
    Version,
    #[error("method: required, and must be a string")]
    Method,
    #[error("id: must be a string or a number")]
    Id,
    #[error("params: must be an object or an array")]
    Params,
}

impl<'a> Request<'a> {
    pub fn from_value(message: &'a Value) -> Result<Request<'a>, MessageError> {
        let obj = message.as_object().ok_or(MessageError::NotAnObject)?;
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(MessageError::Version);
        }
        let method = obj
            .get("method")
            .and_then(Value::as_str)
            .ok_or(MessageError::Method)?;
        let id = match obj.get("id") {
            None => None,
            Some(id @ (Value::String(_) | Value::Number(_))) => Some(id),
            Some(_) => return Err(MessageError::Id),
        };
        let params = match obj.get("params") {
            None => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => return Err(MessageError::Params),
        };
        Ok(Request { id, method, params })
    }
}

/// The tool name and arguments of a tools/call.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    pub name: &'a str,
    pub arguments: Option<&'a Map<String, Value>>,
}

impl<'a> ToolCall<'a> {
    pub fn from_params(params: Option<&'a Value>) -> Result<ToolCall<'a>, &'static str> {
        let params = params
            .and_then(Value::as_object)
            .ok_or("tools/call params must be an object with a \"name\"")?;
        // One pass over the (small) map: comparisons against fixed literals
        // compile to a few integer compares, where two `get`s would each
        // walk the tree with general string comparisons.
        let (mut name, mut arguments) = (None, None);
        for (key, value) in params {
            match key.as_str() {
                "name" => name = Some(value),
                "arguments" => arguments = Some(value),
                _ => {}
            }
        }
        let name = name
            .and_then(Value::as_str)
            .ok_or("tools/call params.name must be a string")?;
        let arguments = match arguments {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map),
            Some(_) => return Err("tools/call params.arguments must be an object"),
        };
        Ok(ToolCall { name, arguments })
    }
}

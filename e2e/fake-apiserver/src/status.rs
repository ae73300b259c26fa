//! Errors as the real server reports them: a `Status` object with kind,
//! reason, code and details.

use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` of the Status (name, group, kind, causes), if any.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let resource = qualified(group, plural);
        ApiError {
            details: Some(json!({"name": name, "group": group, "kind": plural})),
            ..ApiError::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
        }
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        let resource = qualified(group, plural);
        ApiError {
            details: Some(json!({"name": name, "group": group, "kind": plural})),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{resource} \"{name}\" already exists"),
            )
        }
    }

    /// A write based on a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> ApiError {
        let resource = qualified(group, plural);
        ApiError {
            details: Some(json!({"name": name, "group": group, "kind": plural})),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                ),
            )
        }
    }

    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 422 with one cause per field error.
    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> ApiError {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let details = json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|(field, message)| json!({
                "reason": "FieldValueInvalid", "message": message, "field": field,
            })).collect::<Vec<_>>(),
        });
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{kind} \"{name}\" is invalid: {}", text.join(", ")),
            )
        }
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/merge-patch+json, application/json-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (found {content_type:?})"
            ),
        )
    }

    /// The Status object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `plural.group` as the real server names a resource in messages.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic
//! merge patch (treated as a merge patch — the difference only matters for
//! lists with merge keys in built-in kinds, documented), and server-side
//! apply (for now: the applied configuration merged in; field managers and
//! conflicts are not tracked yet).

use serde_json::Value;

use crate::status::ApiError;

/// `stored` with `body` applied as `content_type` says.
pub fn apply(stored: &Value, body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let mut object = stored.clone();
    match media {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let patch: Value = json(body)?;
            json_patch::merge(&mut object, &patch);
        }
        "application/json-patch+json" => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut object, &patch)
                .map_err(|e| ApiError::invalid("", "", vec![("patch".into(), e.to_string())]))?;
        }
        "application/apply-patch+yaml" | "application/apply-patch+json" => {
            let applied = yaml(body)?;
            json_patch::merge(&mut object, &applied);
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    Ok(object)
}

fn json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))
}

/// A YAML (or JSON, which is YAML) document as JSON.
pub fn yaml(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")))
}

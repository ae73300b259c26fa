//! The generated schemas in the dialect kube-apiserver speaks. schemars
//! writes JSON Schema, which differs in two places the API server notices:
//!
//! - unsigned integers carry the formats `uint16`, `uint32` and `uint64`,
//!   which it does not know: every write of such a CRD answers `Warning:
//!   unrecognized format "uint32"` (and `helm install` prints it). They
//!   become `int32` and `int64`, beside the `minimum: 0` schemars writes;
//! - an optional enum lists `null` among its values. The API server checks
//!   `enum` even for null (`nullable` does not exempt it), so a null is
//!   refused all the same, with the misleading `Unsupported value: null:
//!   supported values: "enforce", "monitor", "null"`, and `kubectl
//!   explain` lists `<no value>` as a value. The null goes.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use serde_json::Value;

/// Rewrites every version's schema of `crd` as described above.
pub(crate) fn for_kubernetes(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        // A JSONSchemaProps always serializes, and what comes back is the
        // same shape with fewer values.
        let Ok(mut value) = serde_json::to_value(&*schema) else {
            continue;
        };
        rewrite(&mut value);
        if let Ok(rewritten) = serde_json::from_value::<JSONSchemaProps>(value) {
            *schema = rewritten;
        }
    }
}

/// The Kubernetes format for a schemars one; None: keep it.
fn kubernetes_format(format: &str) -> Option<&'static str> {
    match format {
        "uint8" | "uint16" => Some("int32"),
        "uint" | "uint32" | "uint64" => Some("int64"),
        _ => None,
    }
}

fn rewrite(value: &mut Value) {
    match value {
        Value::Object(schema) => {
            if let Some(format) = schema.get("format").and_then(Value::as_str)
                && let Some(replacement) = kubernetes_format(format)
            {
                schema.insert("format".to_owned(), Value::from(replacement));
            }
            if let Some(Value::Array(values)) = schema.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            // Every nested schema: properties, items, additionalProperties,
            // allOf/anyOf/oneOf, not.
            for nested in schema.values_mut() {
                rewrite(nested);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unsigned_formats_become_kubernetes_ones_and_enums_lose_null() {
        let mut schema = json!({"properties": {
            "count": {"type": "integer", "format": "uint32", "minimum": 0.0},
            "status": {"type": "integer", "format": "uint16"},
            "when": {"type": "string", "format": "date-time"},
            "mode": {"type": "string", "nullable": true, "enum": ["enforce", "monitor", null]},
            "list": {"type": "array", "items": {"type": "integer", "format": "uint64"}},
        }});
        rewrite(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["count"]["format"], "int64");
        assert_eq!(p["status"]["format"], "int32");
        assert_eq!(p["when"]["format"], "date-time");
        assert_eq!(p["mode"]["enum"], json!(["enforce", "monitor"]));
        assert_eq!(p["list"]["items"]["format"], "int64");
    }
}

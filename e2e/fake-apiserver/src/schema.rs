//! CRD structural schemas applied to custom objects, in the real server's
//! order: defaults filled in, unknown fields pruned (or, with
//! `fieldValidation=Strict`, refused), then the values validated — types,
//! required, enum, pattern, bounds, lengths, item counts. CEL rules
//! (`x-kubernetes-validations`) are out of scope: the operator's admission
//! webhook validates instead.

use serde_json::{Map, Value, json};

/// Fills in `default`s for absent properties of objects that are present.
pub fn default(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (key, sub) in properties {
                    if !map.contains_key(key)
                        && let Some(d) = sub.get("default")
                    {
                        map.insert(key.clone(), d.clone());
                    }
                    if let Some(child) = map.get_mut(key) {
                        default(sub, child);
                    }
                }
            }
            if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in map.values_mut() {
                    default(additional, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for child in items {
                    default(item, child);
                }
            }
        }
        _ => {}
    }
}

/// Removes fields the schema does not declare (unless it preserves
/// unknown fields there); returns their paths.
pub fn prune(schema: &Value, value: &mut Value, path: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_into(schema, value, path, &mut unknown);
    unknown
}

fn prune_into(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && schema.get("properties").is_none()
    {
        return;
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve =
                schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let child_path = format!("{path}.{key}");
                let sub = properties
                    .and_then(|p| p.get(&key))
                    .or(additional.filter(|a| a.is_object()));
                match sub {
                    Some(sub) => {
                        if let Some(child) = map.get_mut(&key) {
                            prune_into(sub, child, &child_path, unknown);
                        }
                    }
                    None if preserve || additional == Some(&Value::Bool(true)) => {}
                    None if properties.is_some() || additional == Some(&Value::Bool(false)) => {
                        map.remove(&key);
                        unknown.push(child_path.trim_start_matches('.').to_owned());
                    }
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, child) in items.iter_mut().enumerate() {
                    prune_into(item, child, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Every way `value` breaks `schema`: (field path, message as the real
/// server words it).
pub fn validate(schema: &Value, value: &Value, path: &str) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    check(schema, value, path, &mut errors);
    errors
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<(String, String)>) {
    let field = path.trim_start_matches('.').to_owned();
    let mut fail = |message: String| errors.push((field.clone(), message));
    if value.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if let Some(wanted) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let fits = actual == wanted
            || (wanted == "number" && actual == "integer")
            || (int_or_string && matches!(actual, "integer" | "string"));
        if !fits {
            fail(format!(
                "Invalid value: \"{actual}\": {field} in body must be of type {wanted}: \"{actual}\""
            ));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let listed: Vec<String> = options.iter().map(Value::to_string).collect();
        fail(format!(
            "Unsupported value: {value}: supported values: {}",
            listed.join(", ")
        ));
    }
    match value {
        Value::String(s) => check_string(schema, s, &mut fail),
        Value::Number(n) => check_number(schema, n.as_f64().unwrap_or(0.0), value, &mut fail),
        Value::Array(items) => {
            let count = items.len() as u64;
            if schema
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| count < m)
            {
                fail(format!(
                    "Invalid value: {count}: {field} in body should have at least {} items",
                    schema["minItems"]
                ));
            }
            if schema
                .get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| count > m)
            {
                fail(format!(
                    "Too many: {count}: must have at most {} items",
                    schema["maxItems"]
                ));
            }
            if let Some(item) = schema.get("items") {
                for (i, child) in items.iter().enumerate() {
                    check(item, child, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(map) => check_object(schema, map, path, errors),
        _ => {}
    }
}

fn check_string(schema: &Value, s: &str, fail: &mut impl FnMut(String)) {
    let length = s.chars().count() as u64;
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && length < min
    {
        fail(format!(
            "Invalid value: {}: should be at least {min} chars long",
            json!(s)
        ));
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && length > max
    {
        fail(format!("Too long: may not be more than {max} bytes"));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && regex::Regex::new(pattern).is_ok_and(|re| !re.is_match(s))
    {
        fail(format!(
            "Invalid value: {}: should match '{pattern}'",
            json!(s)
        ));
    }
}

fn check_number(schema: &Value, n: f64, value: &Value, fail: &mut impl FnMut(String)) {
    let exclusive = |f: &str| schema.get(f) == Some(&Value::Bool(true));
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let below = if exclusive("exclusiveMinimum") {
            n <= min
        } else {
            n < min
        };
        if below {
            let relation = if exclusive("exclusiveMinimum") {
                "greater than"
            } else {
                "greater than or equal to"
            };
            fail(format!(
                "Invalid value: {value}: should be {relation} {}",
                schema["minimum"]
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let above = if exclusive("exclusiveMaximum") {
            n >= max
        } else {
            n > max
        };
        if above {
            let relation = if exclusive("exclusiveMaximum") {
                "less than"
            } else {
                "less than or equal to"
            };
            fail(format!(
                "Invalid value: {value}: should be {relation} {}",
                schema["maximum"]
            ));
        }
    }
}

fn check_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    errors: &mut Vec<(String, String)>,
) {
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(key) = required.as_str()
            && !map.contains_key(key)
        {
            errors.push((
                format!("{path}.{key}").trim_start_matches('.').to_owned(),
                "Required value".into(),
            ));
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, child) in map {
        if let Some(sub) = properties.and_then(|p| p.get(key)).or(additional) {
            check(sub, child, &format!("{path}.{key}"), errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
    }

    #[test]
    fn defaults_pruning_and_validation() {
        let mut o =
            json!({"spec": {"size": 3, "extra": 1, "free": {"anything": [1]}}, "bogus": true});
        default(&schema(), &mut o);
        assert_eq!(o["spec"]["mode"], "safe");
        let unknown = prune(&schema(), &mut o, "");
        assert_eq!(unknown, ["bogus", "spec.extra"]);
        assert_eq!(o["spec"]["free"], json!({"anything": [1]}), "preserved");
        assert!(validate(&schema(), &o, "").is_empty());

        let bad =
            json!({"spec": {"size": "3", "mode": "slow", "name": "Ab1", "tags": ["a", "b", "c"]}});
        let errors: Vec<String> = validate(&schema(), &bad, "")
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        assert_eq!(errors, ["spec.mode", "spec.name", "spec.size", "spec.tags"]);
        let too_big = validate(&schema(), &json!({"spec": {"size": 11}}), "");
        assert_eq!(too_big.len(), 1);
        assert_eq!(too_big[0].0, "spec.size");
        assert!(
            too_big[0].1.contains("less than or equal to 10"),
            "{too_big:?}"
        );
        let missing = validate(&schema(), &json!({"spec": {}}), "");
        assert_eq!(
            missing,
            [("spec.size".to_owned(), "Required value".to_owned())]
        );
    }
}

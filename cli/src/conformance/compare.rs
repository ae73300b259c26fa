//! Expected-versus-actual checks; each mismatch names its field.

use serde_json::Value;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Mismatch {
    pub field: &'static str,
    pub expected: String,
    pub actual: String,
}

#[derive(Default)]
pub struct Mismatches(pub Vec<Mismatch>);

impl Mismatches {
    pub fn check(
        &mut self,
        field: &'static str,
        ok: bool,
        expected: impl ToString,
        actual: impl ToString,
    ) {
        if !ok {
            self.0.push(Mismatch {
                field,
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
    }

    pub fn fail(&mut self, field: &'static str, expected: impl ToString, actual: impl ToString) {
        self.check(field, false, expected, actual);
    }
}

/// Every key of `expected` is in `actual` with a matching value (recursively);
/// arrays match element by element; numbers compare by value.
pub fn subset(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| subset(v, av))),
        (Value::Array(e), Value::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(x, y)| subset(x, y))
        }
        (Value::Number(e), Value::Number(a)) => e.as_f64() == a.as_f64(),
        (e, a) => e == a,
    }
}

pub fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_owned(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::subset;
    use serde_json::json;

    #[test]
    fn subset_semantics() {
        let actual =
            json!({"id": 1, "error": {"code": -32001, "data": {"tool": "t", "reason": "r"}}});
        assert!(subset(&json!({"id": 1}), &actual));
        assert!(subset(&json!({"error": {"data": {"tool": "t"}}}), &actual));
        assert!(!subset(&json!({"error": {"data": {"tool": "u"}}}), &actual));
        assert!(!subset(&json!({"missing": null}), &actual));
        assert!(subset(&json!(1.0), &json!(1)));
        assert!(!subset(&json!([1]), &json!([1, 2])));
    }
}

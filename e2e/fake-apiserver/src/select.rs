//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and
//! the field selectors this server supports (`metadata.name`,
//! `metadata.namespace`, with `=`, `==` or `!=`).

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed labelSelector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {why} in labelSelector {text:?}"
            ))
        };
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, set)) = part.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), set_of(set).ok_or_else(|| bad(part))?)
            } else if let Some((key, set)) = part.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), set_of(set).ok_or_else(|| bad(part))?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(bad(part));
            } else {
                Requirement::Exists(part.to_owned())
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, set) => label(k).is_some_and(|l| set.iter().any(|s| s == l)),
            Requirement::NotIn(k, set) => label(k).is_none_or(|l| !set.iter().any(|s| s == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn set_of(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// A parsed fieldSelector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: {part:?}; can't understand it"
                )));
            };
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_owned(), equal, value.to_owned()));
        }
        Ok(FieldSelector(terms))
    }

    /// The one name it requires (`metadata.name=X`), as kube-apiserver
    /// reads it to authorize a list or watch against RBAC resourceNames.
    pub fn required_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, equal, _)| field == "metadata.name" && *equal)
            .map(|(_, _, value)| value.as_str())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let path = format!("/{}", field.replace('.', "/"));
            let actual = object.pointer(&path).and_then(Value::as_str).unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_as_kubernetes_reads_them() {
        let pod = json!({"metadata": {"name": "p", "namespace": "a", "labels": {"app": "web", "tier": "front"}}});
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("app=web,tier=back", false),
            ("app in (api),tier", false),
        ] {
            assert_eq!(
                LabelSelector::parse(selector).unwrap().matches(&pod),
                expected,
                "{selector}"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
        let f = FieldSelector::parse("metadata.name=p,metadata.namespace!=b").unwrap();
        assert!(f.matches(&pod));
        assert!(FieldSelector::parse("spec.nodeName=x").is_err());
    }
}

//! `Table` responses (meta.k8s.io/v1), which `kubectl get` asks for: a
//! CRD's additionalPrinterColumns evaluated on each object (the JSONPath
//! forms CRDs use: fields, indexes, `[*]`, and `[?(@.key=="value")]`
//! filters), and NAME and AGE for built-in kinds.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::kinds::Kind;

/// Whether an Accept header asks for a Table.
pub fn wanted(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .next()
            .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
    })
}

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub fn parse(value: Option<&str>) -> Include {
        match value {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

/// A Table of `objects` as `kind` prints them.
pub fn table(kind: &Kind, objects: &[Value], include: Include, resource_version: &str) -> Value {
    let columns = columns(kind);
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description,
                   "priority": c.priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells: Vec<Value> = columns.iter().map(|c| c.cell(o)).collect();
            let mut row = json!({"cells": cells});
            match include {
                Include::None => {}
                Include::Object => row["object"] = o.clone(),
                Include::Metadata => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                           "metadata": o.get("metadata").cloned().unwrap_or(json!({}))});
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

struct Column {
    name: String,
    kind: String,
    format: String,
    description: String,
    priority: i64,
    path: String,
}

impl Column {
    fn cell(&self, object: &Value) -> Value {
        if self.format == "name" {
            return object
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
        }
        let found = evaluate(object, &self.path);
        if self.kind == "date" {
            return found
                .first()
                .and_then(|v| v.as_str())
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                .map_or(Value::Null, |t| json!(age(t)));
        }
        match found.as_slice() {
            [] => Value::Null,
            [one] => match one {
                Value::String(_) | Value::Number(_) | Value::Bool(_) => (*one).clone(),
                other => json!(other.to_string()),
            },
            many => json!(
                many.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

fn columns(kind: &Kind) -> Vec<Column> {
    let name = Column {
        name: "Name".into(),
        kind: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        path: ".metadata.name".into(),
    };
    let age = Column {
        name: "Age".into(),
        kind: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        path: ".metadata.creationTimestamp".into(),
    };
    if kind.columns.is_empty() {
        return vec![name, age];
    }
    let mut out = vec![name];
    for c in &kind.columns {
        let text = |f: &str| {
            c.get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        out.push(Column {
            name: text("name"),
            kind: text("type"),
            format: text("format"),
            description: text("description"),
            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            path: text("jsonPath"),
        });
    }
    out
}

/// kubectl's short age: 45s, 3m, 5h, 2d.
fn age(since: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(since)
        .map_or(0, |d| d.as_secs());
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The values `path` selects in `value`.
pub fn evaluate<'a>(value: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut current = vec![value];
    for step in steps(path) {
        let mut next = Vec::new();
        for v in current {
            match &step {
                Step::Field(f) => next.extend(v.get(f.as_str())),
                Step::Index(i) => next.extend(v.as_array().and_then(|a| a.get(*i))),
                Step::All => next.extend(v.as_array().into_iter().flatten()),
                Step::Filter(key, wanted) => {
                    next.extend(v.as_array().into_iter().flatten().filter(|item| {
                        item.get(key.as_str()).and_then(Value::as_str) == Some(wanted.as_str())
                    }))
                }
            }
        }
        current = next;
    }
    current
}

enum Step {
    Field(String),
    Index(usize),
    All,
    Filter(String, String),
}

fn steps(path: &str) -> Vec<Step> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut out = Vec::new();
    let mut rest = path.trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end > 0 {
                out.push(Step::Field(r[..end].to_owned()));
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { break };
            let inside = &r[..end];
            rest = &r[end + 1..];
            if inside == "*" {
                out.push(Step::All);
            } else if let Ok(i) = inside.parse() {
                out.push(Step::Index(i));
            } else if let Some((key, value)) = inside
                .strip_prefix("?(@.")
                .and_then(|f| f.strip_suffix(')'))
                .and_then(|f| f.split_once("=="))
            {
                let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
                out.push(Step::Filter(key.trim().to_owned(), value.to_owned()));
            }
        } else {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_forms_printer_columns_use() {
        let o = json!({"spec": {"size": 3, "items": [{"n": 1}, {"n": 2}]},
                       "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(evaluate(&o, ".spec.size"), vec![&json!(3)]);
        assert_eq!(evaluate(&o, ".spec.items[1].n"), vec![&json!(2)]);
        assert_eq!(evaluate(&o, ".spec.items[*].n"), vec![&json!(1), &json!(2)]);
        assert_eq!(
            evaluate(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            vec![&json!("True")]
        );
        assert!(evaluate(&o, ".spec.missing").is_empty());
        assert!(wanted(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        )));
        assert!(!wanted(Some("application/json")));
    }
}

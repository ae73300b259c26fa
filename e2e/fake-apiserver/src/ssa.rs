//! Server-side apply with field managers: each manager's fields are
//! recorded in `metadata.managedFields` (FieldsV1); an apply that changes a
//! field another manager set is a 409 conflict unless forced (then the
//! field changes hands); fields a manager applied before and no longer
//! applies are removed unless someone else owns them; ordinary writes
//! (create, update, patch) take ownership of what they change.
//!
//! Difference from the real server, documented in the README: lists are
//! atomic (one field each), whatever `x-kubernetes-list-type` says.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde_json::{Map, Value, json};

use crate::status::ApiError;

type Path = Vec<String>;

/// One manager's fields, for one operation and subresource.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    fields: BTreeSet<Path>,
}

/// Fields no manager owns, whatever they say.
fn unmanaged(path: &Path) -> bool {
    matches!(
        path.first().map(String::as_str),
        Some("apiVersion" | "kind")
    ) || (path.first().is_some_and(|p| p == "metadata")
        && !matches!(
            path.get(1).map(String::as_str),
            Some("labels" | "annotations" | "finalizers")
        ))
}

/// Leaf paths of a value: objects recursed (an empty one is structure,
/// not a field), arrays and scalars leaves.
fn leaves(value: &Value, prefix: &mut Path, out: &mut BTreeMap<Path, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                prefix.push(k.clone());
                leaves(v, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() && !unmanaged(prefix) {
                out.insert(prefix.clone(), value.clone());
            }
        }
    }
}

fn leaf_map(value: &Value) -> BTreeMap<Path, Value> {
    let mut out = BTreeMap::new();
    leaves(value, &mut Vec::new(), &mut out);
    out
}

fn get<'a>(value: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, k| v.get(k.as_str()))
}

fn set(value: &mut Value, path: &Path, leaf: Value) {
    let mut current = value;
    for key in &path[..path.len() - 1] {
        if !current.get(key.as_str()).is_some_and(Value::is_object) {
            current[key.as_str()] = json!({});
        }
        current = &mut current[key.as_str()];
    }
    current[path[path.len() - 1].as_str()] = leaf;
}

fn remove(value: &mut Value, path: &Path) {
    let mut current = value;
    for key in &path[..path.len() - 1] {
        match current.get_mut(key.as_str()) {
            Some(next) => current = next,
            None => return,
        }
    }
    if let Some(map) = current.as_object_mut() {
        map.remove(&path[path.len() - 1]);
    }
}

/// FieldsV1 for a set of paths: `{"f:spec": {"f:size": {}}}`.
fn fields_v1(fields: &BTreeSet<Path>) -> Value {
    let mut root = json!({});
    for path in fields {
        let mut current = &mut root;
        for key in path {
            let name = format!("f:{key}");
            if current.get(&name).is_none() {
                current[name.as_str()] = json!({});
            }
            current = &mut current[name.as_str()];
        }
    }
    root
}

fn paths_of(fields: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = fields.as_object() else {
        return;
    };
    if map.is_empty() && !prefix.is_empty() {
        out.insert(prefix.clone());
        return;
    }
    for (k, v) in map {
        if let Some(name) = k.strip_prefix("f:") {
            prefix.push(name.to_owned());
            paths_of(v, prefix, out);
            prefix.pop();
        }
    }
}

fn entries(object: &Value) -> Vec<Entry> {
    let list = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .map(|e| {
            let text = |f: &str| {
                e.get(f)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let mut fields = BTreeSet::new();
            paths_of(
                e.get("fieldsV1").unwrap_or(&Value::Null),
                &mut Vec::new(),
                &mut fields,
            );
            Entry {
                manager: text("manager"),
                operation: text("operation"),
                subresource: text("subresource"),
                api_version: text("apiVersion"),
                fields,
            }
        })
        .collect()
}

fn write_entries(object: &mut Value, entries: &[Entry]) {
    let time = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                               "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&e.fields)});
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Whether `path` and `other` overlap (one is a prefix of the other).
fn overlaps(path: &Path, other: &Path) -> bool {
    let n = path.len().min(other.len());
    path[..n] == other[..n]
}

pub struct Apply<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub subresource: Option<&'a str>,
    pub api_version: String,
}

/// `applied` by `a.manager` on top of `stored` (None: the object is new).
pub fn apply(stored: Option<&Value>, applied: &Value, a: &Apply<'_>) -> Result<Value, ApiError> {
    let base = stored.cloned().unwrap_or_else(|| json!({}));
    let mut owners = entries(&base);
    let subresource = a.subresource.unwrap_or_default();
    let wanted = leaf_map(applied);
    // Conflicts: another manager set the field to something else.
    let mut conflicts = Vec::new();
    for (path, value) in &wanted {
        if get(&base, path) == Some(value) {
            continue;
        }
        for e in &owners {
            let mine = e.manager == a.manager && e.operation == "Apply";
            if !mine && e.fields.iter().any(|f| overlaps(f, path)) {
                conflicts.push((e.manager.clone(), e.api_version.clone(), path.join(".")));
            }
        }
    }
    if !conflicts.is_empty() && !a.force {
        return Err(conflict(&conflicts));
    }
    let taken: BTreeSet<Path> = wanted.keys().cloned().collect();
    for e in &mut owners {
        if !(e.manager == a.manager && e.operation == "Apply") {
            e.fields.retain(|f| !taken.iter().any(|t| overlaps(f, t)));
        }
    }
    let mut object = base.clone();
    // Fields this manager applied before and no longer does go, unless
    // someone else still owns them.
    if let Some(previous) = owners
        .iter()
        .find(|e| e.manager == a.manager && e.operation == "Apply" && e.subresource == subresource)
    {
        for path in previous.fields.difference(&taken) {
            let owned_elsewhere = owners.iter().any(|e| {
                !(e.manager == a.manager && e.operation == "Apply")
                    && e.fields.iter().any(|f| overlaps(f, path))
            });
            if !owned_elsewhere {
                remove(&mut object, path);
            }
        }
    }
    for (path, value) in &wanted {
        set(&mut object, path, value.clone());
    }
    for key in ["apiVersion", "kind"] {
        if let Some(v) = applied.get(key) {
            object[key] = v.clone();
        }
    }
    for key in ["name", "namespace", "generateName"] {
        if let Some(v) = applied.pointer(&format!("/metadata/{key}")) {
            object["metadata"][key] = v.clone();
        }
    }
    owners.retain(|e| {
        !(e.manager == a.manager && e.operation == "Apply" && e.subresource == subresource)
    });
    owners.push(Entry {
        manager: a.manager.to_owned(),
        operation: "Apply".into(),
        subresource: subresource.to_owned(),
        api_version: a.api_version.clone(),
        fields: taken,
    });
    write_entries(&mut object, &owners);
    Ok(object)
}

/// An ordinary write by `manager` (create, update, patch): it owns what it
/// changed, taking it from whoever had it.
pub fn record_update(
    stored: Option<&Value>,
    object: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    api_version: &str,
) {
    let base = stored.cloned().unwrap_or_else(|| json!({}));
    let mut owners = entries(&base);
    let before = leaf_map(&base);
    let after = leaf_map(object);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    if changed.is_empty() {
        write_entries(object, &owners);
        return;
    }
    for e in &mut owners {
        if e.manager != manager {
            e.fields.retain(|f| !changed.iter().any(|c| overlaps(f, c)));
        }
    }
    let subresource = subresource.unwrap_or_default();
    match owners
        .iter_mut()
        .find(|e| e.manager == manager && e.operation == "Update" && e.subresource == subresource)
    {
        Some(e) => e.fields.extend(changed),
        None => owners.push(Entry {
            manager: manager.to_owned(),
            operation: "Update".into(),
            subresource: subresource.to_owned(),
            api_version: api_version.to_owned(),
            fields: changed,
        }),
    }
    write_entries(object, &owners);
}

fn conflict(conflicts: &[(String, String, String)]) -> ApiError {
    let n = conflicts.len();
    let plural = if n == 1 { "conflict" } else { "conflicts" };
    let lines: Vec<String> = conflicts
        .iter()
        .map(|(m, v, f)| format!("conflict with \"{m}\" using {v}: .{f}"))
        .collect();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, v, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {v}"), "field": format!(".{f}")}))
        .collect();
    let mut details = Map::new();
    details.insert("causes".into(), Value::Array(causes));
    ApiError {
        code: 409,
        reason: "Conflict",
        message: format!("Apply failed with {n} {plural}: {}", lines.join("\n")),
        details: Some(Value::Object(details)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applying<'a>(manager: &'a str, force: bool) -> Apply<'a> {
        Apply {
            manager,
            force,
            subresource: None,
            api_version: "example.io/v1".into(),
        }
    }

    #[test]
    fn managers_conflicts_force_and_removal() {
        let first = apply(
            None,
            &json!({"metadata": {"name": "w"}, "spec": {"size": 1, "mode": "a"}}),
            &applying("alice", false),
        )
        .unwrap();
        assert_eq!(
            first["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {"f:mode": {}, "f:size": {}}})
        );
        // Bob sets size differently: a conflict, unless forced.
        let bob = json!({"metadata": {"name": "w"}, "spec": {"size": 2}});
        let e = apply(Some(&first), &bob, &applying("bob", false)).unwrap_err();
        assert_eq!(e.code, 409);
        assert!(
            e.message
                .contains(r#"conflict with "alice" using example.io/v1: .spec.size"#),
            "{}",
            e.message
        );
        let forced = apply(Some(&first), &bob, &applying("bob", true)).unwrap();
        assert_eq!(forced["spec"], json!({"size": 2, "mode": "a"}));
        // The same value is no conflict; dropping a field removes it.
        let again = apply(
            Some(&forced),
            &json!({"metadata": {"name": "w"}, "spec": {"size": 2}}),
            &applying("carol", false),
        )
        .unwrap();
        assert_eq!(again["spec"]["size"], 2);
        let dropped = apply(
            Some(&again),
            &json!({"metadata": {"name": "w"}, "spec": {}}),
            &applying("alice", false),
        )
        .unwrap();
        assert_eq!(
            dropped["spec"],
            json!({"size": 2}),
            "alice's mode goes; bob and carol own size"
        );
        // An ordinary update takes ownership of what it changes.
        let mut edited = dropped.clone();
        edited["spec"]["size"] = json!(5);
        record_update(
            Some(&dropped),
            &mut edited,
            "kubectl-edit",
            None,
            "example.io/v1",
        );
        let e = apply(
            Some(&edited),
            &json!({"metadata": {"name": "w"}, "spec": {"size": 3}}),
            &applying("bob", false),
        )
        .unwrap_err();
        assert!(e.message.contains("kubectl-edit"), "{}", e.message);
    }
}

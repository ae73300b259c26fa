//! OpenAPI v3 documents, as kubectl reads them: the root listing one
//! document per group/version, and each document with the operations of its
//! kinds (tagged with `x-kubernetes-group-version-kind`, the PATCH taking
//! `fieldValidation`, which is how kubectl learns that the server validates
//! fields itself) and a schema per kind — a CRD's own schema, or an open
//! object for built-in kinds, whose fields this server does not check.

use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::kinds::Kind;

/// `/openapi/v3`: where each group/version's document is.
pub fn root(kinds: &[Kind]) -> Value {
    let mut paths = Map::new();
    for (prefix, group_kinds) in by_group_version(kinds) {
        let hash = hash_of(&document(&group_kinds));
        paths.insert(
            prefix.trim_start_matches('/').to_owned(),
            json!({"serverRelativeURL": format!("/openapi/v3{prefix}?hash={hash}")}),
        );
    }
    json!({ "paths": paths })
}

/// The document for the group/version served under `prefix` (`/api/v1`,
/// `/apis/GROUP/VERSION`), if any.
pub fn for_prefix(kinds: &[Kind], prefix: &str) -> Option<Value> {
    by_group_version(kinds)
        .into_iter()
        .find(|(p, _)| p == prefix)
        .map(|(_, group_kinds)| document(&group_kinds))
}

fn prefix_of(kind: &Kind) -> String {
    if kind.group.is_empty() {
        format!("/api/{}", kind.version)
    } else {
        format!("/apis/{}/{}", kind.group, kind.version)
    }
}

fn by_group_version(kinds: &[Kind]) -> Vec<(String, Vec<Kind>)> {
    let mut out: Vec<(String, Vec<Kind>)> = Vec::new();
    for kind in kinds.iter().filter(|k| !k.review) {
        let prefix = prefix_of(kind);
        match out.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, list)) => list.push(kind.clone()),
            None => out.push((prefix, vec![kind.clone()])),
        }
    }
    out
}

/// The schema name of a kind, as Kubernetes names definitions.
fn schema_name(kind: &Kind) -> String {
    let group = if kind.group.is_empty() {
        "core"
    } else {
        &kind.group
    };
    format!("{group}.{}.{}", kind.version, kind.kind)
}

fn gvk(kind: &Kind) -> Value {
    json!({"group": kind.group, "version": kind.version, "kind": kind.kind})
}

fn document(kinds: &[Kind]) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for kind in kinds {
        let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(kind))});
        let (collection, item) = if kind.namespaced {
            let base = format!(
                "{}/namespaces/{{namespace}}/{}",
                prefix_of(kind),
                kind.plural
            );
            (base.clone(), format!("{base}/{{name}}"))
        } else {
            let base = format!("{}/{}", prefix_of(kind), kind.plural);
            (base.clone(), format!("{base}/{{name}}"))
        };
        let op = |action: &str, writes: bool| {
            let mut parameters = vec![query("dryRun"), query("fieldManager")];
            if writes {
                parameters.push(query("fieldValidation"));
            }
            if action == "patch" {
                parameters.push(query("force"));
            }
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk(kind),
                "parameters": parameters,
                "responses": {"200": {"content": {"application/json": {"schema": reference}}}},
            })
        };
        paths.insert(
            collection,
            json!({"get": op("list", false), "post": op("post", true)}),
        );
        let mut item_ops = json!({
            "get": op("get", false), "put": op("put", true),
            "patch": op("patch", true), "delete": op("delete", false),
        });
        if kind.status {
            paths.insert(
                format!("{item}/status"),
                json!({"get": op("get", false), "put": op("put", true), "patch": op("patch", true)}),
            );
        }
        paths.insert(item, item_ops.take());
        schemas.insert(schema_name(kind), schema(kind));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0", crate::server::MINOR)},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn query(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

/// A CRD version's schema with the fields every object has, or an open
/// object for a built-in kind.
fn schema(kind: &Kind) -> Value {
    let mut schema = kind
        .schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    schema["x-kubernetes-group-version-kind"] = json!([gvk(kind)]);
    if let Some(properties) = schema
        .as_object_mut()
        .map(|s| s.entry("properties").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        properties.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
        properties.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
        properties.insert("metadata".into(), json!({"type": "object", "description": "Standard object's metadata.", "x-kubernetes-preserve-unknown-fields": true}));
    }
    schema
}

fn hash_of(value: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

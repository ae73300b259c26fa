//! RBAC authorization from the Role, ClusterRole, RoleBinding and
//! ClusterRoleBinding objects in the store, for every resource request
//! (verbs, resources, subresources, resourceNames), with the real server's
//! 403 messages. Members of `system:masters` may do everything; any
//! authenticated user may read discovery and OpenAPI documents (as the
//! default `system:discovery` binding allows).

use serde_json::{Value, json};

use crate::auth::User;
use crate::kinds::Resource;
use crate::status::ApiError;
use crate::store::Store;

/// What a request asks to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

fn rbac(plural: &str) -> Resource {
    Resource {
        group: "rbac.authorization.k8s.io".into(),
        plural: plural.into(),
    }
}

/// Whether `user` may do `a`; the real server's 403 if not.
pub fn authorize(store: &Store, user: &User, a: &Attributes<'_>) -> Result<(), ApiError> {
    if allowed(store, user, a) {
        return Ok(());
    }
    Err(forbidden(user, a))
}

pub fn allowed(store: &Store, user: &User, a: &Attributes<'_>) -> bool {
    if user.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let (cluster_bindings, _) = store.list(&rbac("clusterrolebindings"), None);
    for binding in cluster_bindings.iter().filter(|b| binds(b, user)) {
        if role_allows(store, &binding["roleRef"], None, a) {
            return true;
        }
    }
    let Some(namespace) = a.namespace else {
        return false;
    };
    let (bindings, _) = store.list(&rbac("rolebindings"), Some(namespace));
    bindings
        .iter()
        .filter(|b| binds(b, user))
        .any(|b| role_allows(store, &b["roleRef"], Some(namespace), a))
}

/// Whether a binding's subjects include `user`.
fn binds(binding: &Value, user: &User) -> bool {
    let subjects = binding.get("subjects").and_then(Value::as_array);
    subjects.into_iter().flatten().any(|s| {
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        match s.get("kind").and_then(Value::as_str) {
            Some("User") => name == user.name,
            Some("Group") => user.groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let ns = s
                    .get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        }
    })
}

/// Whether the role a binding refers to has a rule allowing `a`.
fn role_allows(
    store: &Store,
    role_ref: &Value,
    namespace: Option<&str>,
    a: &Attributes<'_>,
) -> bool {
    let name = role_ref
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let role = match role_ref.get("kind").and_then(Value::as_str) {
        Some("ClusterRole") => store.get(&rbac("clusterroles"), "", name),
        Some("Role") => namespace.and_then(|ns| store.get(&rbac("roles"), ns, name)),
        _ => None,
    };
    let Some(role) = role else {
        return false;
    };
    let rules = role.get("rules").and_then(Value::as_array);
    rules.into_iter().flatten().any(|rule| rule_allows(rule, a))
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule.get(field)
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let has = |field: &str, wanted: &str| list(field).iter().any(|v| *v == "*" || *v == wanted);
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.to_owned(),
    };
    let resources = list("resources");
    let resource_ok = resources.iter().any(|r| {
        *r == "*" || *r == resource || a.subresource.is_some_and(|sub| *r == format!("*/{sub}"))
    });
    let names = list("resourceNames");
    let name_ok = names.is_empty() || a.name.is_some_and(|n| names.contains(&n));
    has("verbs", a.verb) && has("apiGroups", a.group) && resource_ok && name_ok
}

/// The 403 exactly as kube-apiserver words it.
fn forbidden(user: &User, a: &Attributes<'_>) -> ApiError {
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.to_owned(),
    };
    let qualified = if a.group.is_empty() {
        a.resource.to_owned()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let subject = match a.name {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let scope = match a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    let message = format!(
        "{subject} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, a.verb, a.group
    );
    let mut details = json!({"group": a.group, "kind": a.resource});
    if let Some(name) = a.name {
        details["name"] = json!(name);
    }
    ApiError {
        code: 403,
        reason: "Forbidden",
        message,
        details: Some(details),
    }
}

//! The cluster form of an AgentPolicy: the object `kubectl apply` takes,
//! whose spec adds to the AIP document the fields that bind it to pods —
//! `podSelector`, `toolConnections` and `approval` (the CRD type is
//! api/src/agent_policy.rs). Their shapes are checked here as the API server
//! and the operator read them; everything else — the AIP document exactly
//! as written — goes to aip-policy's strict validation, so what the two
//! forms share is held to the same rules. A file is the cluster form when
//! its spec has any binding field.

use std::collections::BTreeSet;

use aip_policy::fields::{self, join_key, type_name};
use aip_policy::kubernetes::name_problem;
use aip_policy::{AgentPolicy, PolicyErrors};
use serde_json::{Map, Value};

pub const BINDING_FIELDS: [&str; 3] = ["podSelector", "toolConnections", "approval"];

/// The approval timeout the operator applies when a policy sets none.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u64 = 300;

/// What the binding fields say, once valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The pod selector as `kubectl get -l` writes one; empty: every pod of
    /// the namespace that runs the sidecar.
    pub selector: String,
    pub tool_connections: Vec<String>,
    pub approval_timeout_seconds: Option<u64>,
    pub allowed_service_accounts: Vec<String>,
}

/// A validated policy file of either form.
#[derive(Debug, Clone)]
pub struct PolicyFile {
    pub policy: AgentPolicy,
    /// Present for the cluster form.
    pub binding: Option<Binding>,
}

/// Validates a parsed file: the plain AIP document as aip-policy alone
/// does, the cluster form as its binding fields plus the AIP document within.
/// Every problem is reported, with its field path, in document order.
pub fn validate(value: &Value) -> Result<PolicyFile, PolicyErrors> {
    let Some(spec) = value
        .get("spec")
        .and_then(Value::as_object)
        .filter(|spec| BINDING_FIELDS.iter().any(|f| spec.contains_key(*f)))
    else {
        return AgentPolicy::from_value(value).map(|policy| PolicyFile {
            policy,
            binding: None,
        });
    };
    let mut check = Checker::default();
    if let Some(metadata) = value.get("metadata").and_then(Value::as_object) {
        check.metadata(metadata);
    }
    let binding = check.binding(spec);
    let mut document = value.clone();
    if let Some(spec) = document.get_mut("spec").and_then(Value::as_object_mut) {
        for field in BINDING_FIELDS {
            spec.remove(field);
        }
    }
    let policy = AgentPolicy::from_value(&document).map_err(|e| {
        e.0.into_iter()
            .map(|mut e| {
                // The AIP fields are not all a cluster spec may hold.
                if e.path.starts_with("spec.") && e.message.starts_with("unknown field;") {
                    e.message.push_str(", ");
                    e.message.push_str(&BINDING_FIELDS.join(", "));
                }
                e
            })
            .collect::<Vec<_>>()
    });
    match (policy, binding) {
        (Ok(policy), Some(binding)) if check.errors.is_empty() => Ok(PolicyFile {
            policy,
            binding: Some(binding),
        }),
        (policy, _) => {
            let mut errors = policy.err().unwrap_or_default();
            errors.extend(check.0.errors);
            // A stable sort: apiVersion and kind, then metadata, then spec,
            // aip-policy's findings before the binding's within each.
            errors.sort_by_key(|e| section(&e.path));
            Err(PolicyErrors(errors))
        }
    }
}

fn section(path: &str) -> u8 {
    match path.split(['.', '[']).next().unwrap_or_default() {
        "" => 0,
        "apiVersion" | "kind" => 1,
        "metadata" => 2,
        _ => 3,
    }
}

/// aip-policy's field checker, with the binding fields' checks.
#[derive(Default)]
struct Checker(fields::Checker);

impl std::ops::Deref for Checker {
    type Target = fields::Checker;
    fn deref(&self) -> &fields::Checker {
        &self.0
    }
}

impl std::ops::DerefMut for Checker {
    fn deref_mut(&mut self) -> &mut fields::Checker {
        &mut self.0
    }
}

impl Checker {
    /// What Kubernetes refuses in metadata that a plain AIP file may hold
    /// (aip-policy checks the shapes the two share).
    fn metadata(&mut self, metadata: &Map<String, Value>) {
        for key in ["version", "owner"] {
            if metadata.contains_key(key) {
                self.error(
                    &format!("metadata.{key}"),
                    format!(
                        "Kubernetes metadata has no {key} field; the cluster form carries it as the aip.io/{key} annotation (as `aip policy convert` writes it)"
                    ),
                );
            }
        }
        if let Some(Value::String(name)) = metadata.get("name")
            && let Some(problem) = name_problem(name)
        {
            self.error(
                "metadata.name",
                format!("{name:?} is not a valid Kubernetes name: it {problem}"),
            );
        }
        if let Some(Value::String(namespace)) = metadata.get("namespace")
            && let Some(problem) = label_problem(namespace)
        {
            self.error(
                "metadata.namespace",
                format!("{namespace:?} is not a valid namespace name: it {problem}"),
            );
        }
        if let Some(Value::Object(labels)) = metadata.get("labels") {
            for (key, value) in labels {
                let path = join_key("metadata.labels", key);
                self.qualified_name(&path, key, "label key");
                if let Value::String(value) = value {
                    self.label_value(&path, value);
                }
            }
        }
        if let Some(Value::Object(annotations)) = metadata.get("annotations") {
            for key in annotations.keys() {
                let path = join_key("metadata.annotations", key);
                self.qualified_name(&path, key, "annotation key");
            }
        }
    }

    fn binding(&mut self, spec: &Map<String, Value>) -> Option<Binding> {
        let before = self.errors.len();
        let selector = match spec.get("podSelector") {
            None | Some(Value::Null) => Some(String::new()),
            Some(v) => self.pod_selector(v, "spec.podSelector"),
        };
        let tool_connections = match spec.get("toolConnections") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => self.names(v, "spec.toolConnections", "ToolConnection"),
        };
        let (approval_timeout_seconds, allowed_service_accounts) = match spec.get("approval") {
            None | Some(Value::Null) => (None, Vec::new()),
            Some(v) => self.approval(v, "spec.approval"),
        };
        (self.errors.len() == before).then(|| Binding {
            selector: selector.unwrap_or_default(),
            tool_connections,
            approval_timeout_seconds,
            allowed_service_accounts,
        })
    }

    /// A metav1.LabelSelector, rendered as `kubectl get -l` takes one.
    fn pod_selector(&mut self, value: &Value, path: &str) -> Option<String> {
        let map = self.object(value, path)?;
        self.known_keys(map, path, &["matchLabels", "matchExpressions"]);
        let mut terms = Vec::new();
        if let Some(labels) = map.get("matchLabels").filter(|v| !v.is_null()) {
            let labels_path = format!("{path}.matchLabels");
            for (key, value) in self.object(labels, &labels_path).into_iter().flatten() {
                let key_path = join_key(&labels_path, key);
                self.qualified_name(&key_path, key, "label key");
                match value {
                    Value::String(value) => {
                        self.label_value(&key_path, value);
                        terms.push(format!("{key}={value}"));
                    }
                    other => self.error(
                        &key_path,
                        format!("must be a string, found {} (quote it)", type_name(other)),
                    ),
                }
            }
        }
        if let Some(expressions) = map.get("matchExpressions").filter(|v| !v.is_null()) {
            let list_path = format!("{path}.matchExpressions");
            for (i, item) in self
                .array(expressions, &list_path)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(term) = self.expression(item, &format!("{list_path}[{i}]")) {
                    terms.push(term);
                }
            }
        }
        Some(terms.join(","))
    }

    fn expression(&mut self, value: &Value, path: &str) -> Option<String> {
        let map = self.object(value, path)?;
        self.known_keys(map, path, &["key", "operator", "values"]);
        let key = self.required_string(map, path, "key");
        if let Some(key) = &key {
            self.qualified_name(&format!("{path}.key"), key, "label key");
        }
        let operator = self.required_string(map, path, "operator");
        let values_path = format!("{path}.values");
        let values: Vec<String> = match map.get("values") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => self
                .array(v, &values_path)
                .into_iter()
                .flatten()
                .enumerate()
                .filter_map(|(i, item)| {
                    let item_path = format!("{values_path}[{i}]");
                    match item {
                        Value::String(s) => {
                            self.label_value(&item_path, s);
                            Some(s.clone())
                        }
                        other => {
                            self.error(
                                &item_path,
                                format!("must be a string, found {} (quote it)", type_name(other)),
                            );
                            None
                        }
                    }
                })
                .collect(),
        };
        let operator = operator?;
        let needs_values = match operator.as_str() {
            "In" | "NotIn" => true,
            "Exists" | "DoesNotExist" => false,
            other => {
                self.error(
                    &format!("{path}.operator"),
                    format!(
                        "invalid operator {other:?}; expected one of: In, NotIn, Exists, DoesNotExist"
                    ),
                );
                return None;
            }
        };
        if needs_values && values.is_empty() {
            self.error(
                &values_path,
                format!("operator {operator} needs at least one value"),
            );
        }
        if !needs_values && !values.is_empty() {
            self.error(&values_path, format!("operator {operator} takes no values"));
        }
        let key = key?;
        Some(match operator.as_str() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key,
            _ => format!("!{key}"),
        })
    }

    fn approval(&mut self, value: &Value, path: &str) -> (Option<u64>, Vec<String>) {
        let Some(map) = self.object(value, path) else {
            return (None, Vec::new());
        };
        self.known_keys(map, path, &["timeoutSeconds", "allowedServiceAccounts"]);
        let timeout = match map.get("timeoutSeconds") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some_and(|s| (1..=86_400).contains(&s)) => {
                n.as_u64()
            }
            Some(other) => {
                let found = match other {
                    Value::Number(n) => n.to_string(),
                    other => type_name(other).to_owned(),
                };
                self.error(
                    &format!("{path}.timeoutSeconds"),
                    format!("must be a whole number of seconds from 1 to 86400, found {found}"),
                );
                None
            }
        };
        let accounts = match map.get("allowedServiceAccounts") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => self.names(
                v,
                &format!("{path}.allowedServiceAccounts"),
                "service account",
            ),
        };
        (timeout, accounts)
    }

    /// A list of Kubernetes object names, each listed once.
    fn names(&mut self, value: &Value, path: &str, what: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, item) in self.array(value, path).into_iter().flatten().enumerate() {
            let item_path = format!("{path}[{i}]");
            match item {
                Value::String(name) => {
                    if let Some(problem) = name_problem(name) {
                        self.error(
                            &item_path,
                            format!("{name:?} is not a {what} name: it {problem}"),
                        );
                    } else if !seen.insert(name.as_str()) {
                        self.error(&item_path, format!("{name:?} is listed twice"));
                    } else {
                        names.push(name.clone());
                    }
                }
                other => self.error(
                    &item_path,
                    format!("must be a string, found {}", type_name(other)),
                ),
            }
        }
        names
    }

    /// A label or annotation key: an optional DNS-subdomain prefix and `/`,
    /// then a name of at most 63 characters.
    fn qualified_name(&mut self, path: &str, key: &str, what: &str) {
        let (prefix, name) = match key.split_once('/') {
            Some((prefix, name)) => (Some(prefix), name),
            None => (None, key),
        };
        let problem = prefix
            .and_then(|p| name_problem(p).map(|problem| format!("its prefix {p:?} {problem}")))
            .or_else(|| label_value_problem(name).map(|problem| format!("its name {problem}")))
            .or_else(|| name.is_empty().then(|| "its name is empty".to_owned()));
        if let Some(problem) = problem {
            self.error(path, format!("{key:?} is not a valid {what}: {problem}"));
        }
    }

    fn label_value(&mut self, path: &str, value: &str) {
        if let Some(problem) = label_value_problem(value) {
            self.error(
                path,
                format!("{value:?} is not a valid label value: it {problem}"),
            );
        }
    }

    // --- typed accessors, worded as aip-policy words them ----------------

    fn required_string(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<String> {
        let key_path = join_key(path, key);
        match map.get(key) {
            None => {
                self.error(&key_path, "required field is missing");
                None
            }
            Some(Value::String(s)) if s.is_empty() => {
                self.error(&key_path, "must not be empty");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                self.error(
                    &key_path,
                    format!("must be a string, found {} (quote it)", type_name(other)),
                );
                None
            }
        }
    }
}

/// Why `value` cannot be a label value (at most 63 characters of letters,
/// digits, `-`, `_` and `.`, starting and ending with a letter or digit;
/// empty is allowed), or None.
fn label_value_problem(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some(format!(
            "is {} characters long; at most 63 are allowed",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    let edge_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if !edge_ok(value.chars().next()) || !edge_ok(value.chars().last()) {
        return Some("must start and end with a letter or digit".to_owned());
    }
    None
}

/// Why `name` cannot name a namespace (an RFC 1123 label), or None.
fn label_problem(name: &str) -> Option<String> {
    if name.contains('.') {
        return Some("contains '.', which a namespace name may not".to_owned());
    }
    if name.len() > 63 {
        return Some(format!(
            "is {} characters long; at most 63 are allowed",
            name.len()
        ));
    }
    name_problem(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn cluster(spec: Value) -> Value {
        json!({"apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
               "metadata": {"name": "files", "namespace": "agents"}, "spec": spec})
    }

    fn errors(value: &Value) -> Vec<String> {
        validate(value)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn selector_renders_as_kubectl_writes_it() {
        let file = validate(&cluster(json!({
            "podSelector": {
                "matchLabels": {"app": "agent"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a", "b"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                    {"key": "app.kubernetes.io/part-of", "operator": "Exists"}
                ]
            },
            "toolConnections": ["fs"],
            "allowed_tools": ["fs_read_file"]
        })))
        .unwrap();
        let binding = file.binding.unwrap();
        assert_eq!(
            binding.selector,
            "app=agent,tier in (a,b),!canary,app.kubernetes.io/part-of"
        );
        assert_eq!(binding.tool_connections, ["fs"]);
        assert_eq!(binding.approval_timeout_seconds, None);
    }

    #[test]
    fn an_empty_selector_selects_every_pod() {
        let file = validate(&cluster(json!({"podSelector": {}, "allowed_tools": []}))).unwrap();
        assert_eq!(file.binding.unwrap().selector, "");
    }

    #[test]
    fn a_plain_document_is_left_to_aip_policy() {
        let plain = json!({"apiVersion": "aip.io/v1alpha1", "kind": "AgentPolicy",
                           "metadata": {"name": "Files", "version": "1"}, "spec": {}});
        let file = validate(&plain).unwrap();
        assert!(file.binding.is_none());
        assert_eq!(file.policy.metadata.version.as_deref(), Some("1"));
    }

    #[test]
    fn selector_expression_operators_and_values() {
        let e = errors(&cluster(json!({"podSelector": {"matchExpressions": [
            {"key": "a", "operator": "in", "values": ["x"]},
            {"key": "b", "operator": "In"},
            {"key": "c", "operator": "Exists", "values": ["x"]},
            {"operator": "NotIn", "values": [1]}
        ]}})));
        assert_eq!(
            e,
            [
                "spec.podSelector.matchExpressions[0].operator: invalid operator \"in\"; expected one of: In, NotIn, Exists, DoesNotExist",
                "spec.podSelector.matchExpressions[1].values: operator In needs at least one value",
                "spec.podSelector.matchExpressions[2].values: operator Exists takes no values",
                "spec.podSelector.matchExpressions[3].key: required field is missing",
                "spec.podSelector.matchExpressions[3].values[0]: must be a string, found a number (quote it)",
                "spec.podSelector.matchExpressions[3].values: operator NotIn needs at least one value",
            ]
        );
    }

    #[test]
    fn labels_keys_and_values_follow_kubernetes() {
        let e = errors(&cluster(json!({"podSelector": {"matchLabels": {
            "example.com/app": "ok",
            "Bad_Prefix/x": "v",
            "app": "has space",
            "-x": "v",
            "n": 3
        }}})));
        // In the map's order, which is the document's or, with serde_json
        // built without preserve_order, sorted: compare as sets.
        let mut e = e;
        e.sort();
        let mut expected = [
            "spec.podSelector.matchLabels[\"Bad_Prefix/x\"]: \"Bad_Prefix/x\" is not a valid label key: its prefix \"Bad_Prefix\" contains 'B'; only lowercase letters, digits, '-' and '.' are allowed",
            "spec.podSelector.matchLabels.app: \"has space\" is not a valid label value: it contains ' '; only letters, digits, '-', '_' and '.' are allowed",
            "spec.podSelector.matchLabels.-x: \"-x\" is not a valid label key: its name must start and end with a letter or digit",
            "spec.podSelector.matchLabels.n: must be a string, found a number (quote it)",
        ];
        expected.sort();
        assert_eq!(e, expected);
    }

    #[test]
    fn connections_and_approval_settings() {
        let e = errors(&cluster(json!({
            "toolConnections": ["fs", "Git Hub", "fs", 7],
            "approval": {"timeoutSeconds": 0, "allowedServiceAccounts": ["ci-bot", "ops_bot"], "timeout": 5}
        })));
        assert_eq!(
            e,
            [
                "spec.toolConnections[1]: \"Git Hub\" is not a ToolConnection name: it contains 'G'; only lowercase letters, digits, '-' and '.' are allowed",
                "spec.toolConnections[2]: \"fs\" is listed twice",
                "spec.toolConnections[3]: must be a string, found a number",
                "spec.approval.timeout: unknown field; expected one of: timeoutSeconds, allowedServiceAccounts",
                "spec.approval.timeoutSeconds: must be a whole number of seconds from 1 to 86400, found 0",
                "spec.approval.allowedServiceAccounts[1]: \"ops_bot\" is not a service account name: it contains '_'; only lowercase letters, digits, '-' and '.' are allowed",
            ]
        );
        let e = errors(&cluster(json!({"approval": {"timeoutSeconds": "120"}})));
        assert_eq!(
            e,
            [
                "spec.approval.timeoutSeconds: must be a whole number of seconds from 1 to 86400, found a string"
            ]
        );
    }

    #[test]
    fn cluster_metadata_is_kubernetes_metadata() {
        let mut value = cluster(json!({"toolConnections": ["fs"]}));
        value["metadata"] = json!({"name": "Files", "namespace": "a.b", "owner": "me",
                                   "labels": {"team": "-x"}});
        assert_eq!(
            errors(&value),
            [
                "metadata.owner: Kubernetes metadata has no owner field; the cluster form carries it as the aip.io/owner annotation (as `aip policy convert` writes it)",
                "metadata.name: \"Files\" is not a valid Kubernetes name: it contains 'F'; only lowercase letters, digits, '-' and '.' are allowed",
                "metadata.namespace: \"a.b\" is not a valid namespace name: it contains '.', which a namespace name may not",
                "metadata.labels.team: \"-x\" is not a valid label value: it must start and end with a letter or digit",
            ]
        );
    }

    #[test]
    fn aip_errors_keep_their_paths_and_come_in_document_order() {
        let mut value = cluster(json!({
            "podSelector": {"matchLabel": {"app": "agent"}},
            "allowed_tool": ["x"],
            "tool_rules": [{"tool": "x", "action": "maybe"}]
        }));
        value["apiVersion"] = json!("aip.io/v1");
        assert_eq!(
            errors(&value),
            [
                "apiVersion: unsupported apiVersion \"aip.io/v1\"; expected \"aip.io/v1alpha1\"",
                "spec.allowed_tool: unknown field; expected one of: mode, allowed_tools, allowed_methods, denied_methods, protected_paths, strict_args_default, tool_rules, dlp, podSelector, toolConnections, approval",
                "spec.tool_rules[0].action: invalid action \"maybe\"; expected one of: allow, block, ask",
                "spec.podSelector.matchLabel: unknown field; expected one of: matchLabels, matchExpressions",
            ]
        );
    }
}

//! The AgentPolicy document (spec §1): its types, how it is read from YAML or
//! JSON, and every validation rule, each failure reported with its field path.
//!
//! The document is walked by hand rather than derived with serde so that one
//! pass reports *every* problem (a wrong apiVersion, an unknown field and a bad
//! regex together), each named by its path.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::fields::{Checker, join_key, type_name};
use crate::limits;
use crate::ratelimit::RateLimit;
use crate::regexes::{Checked, LazyRegex};

pub const API_VERSION: &str = "aip.io/v1alpha1";
pub const KIND: &str = "AgentPolicy";

/// A parsed and validated AgentPolicy, as written (absent optional fields stay
/// absent, so a converted or re-serialized policy says what its author said).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentPolicy {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: PolicySpec,
    /// The spec's argument regexes as validation checked them (its
    /// compilation takes them instead of parsing each again).
    #[serde(skip)]
    pub(crate) checked: Checked,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Metadata {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Kubernetes-only metadata, accepted so that a converted policy still
    /// checks; it does not take part in evaluation or in the policy hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicySpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denied_methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protected_paths: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict_args_default: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_rules: Option<Vec<ToolRule>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dlp: Option<DlpConfig>,
}

impl PolicySpec {
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Monitor,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Monitor => "monitor",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolRule {
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict_args: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_args: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_hash: Option<String>,
}

impl ToolRule {
    pub fn action(&self) -> Action {
        self.action.unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Allow,
    Block,
    Ask,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DlpConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detect_encoding: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_stderr: Option<bool>,
    pub patterns: Vec<DlpPattern>,
}

impl DlpConfig {
    /// A present DLP block is on unless it says `enabled: false`.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DlpPattern {
    pub name: String,
    pub regex: String,
}

/// One validation failure: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a policy document, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyErrors(pub Vec<FieldError>);

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl PolicyErrors {
    fn one(path: &str, message: impl Into<String>) -> Self {
        PolicyErrors(vec![FieldError {
            path: path.to_owned(),
            message: message.into(),
        }])
    }
}

impl AgentPolicy {
    /// Reads a policy from YAML (which includes JSON) text and validates it.
    pub fn from_yaml(text: &str) -> Result<AgentPolicy, PolicyErrors> {
        Self::from_value(&parse_yaml(text)?)
    }

    /// Reads a policy from JSON text and validates it.
    pub fn from_json(text: &str) -> Result<AgentPolicy, PolicyErrors> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            PolicyErrors::one(
                "",
                format!(
                    "invalid JSON at line {} column {}: {e}",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        Self::from_value(&value)
    }

    /// Validates an already-parsed document.
    pub fn from_value(value: &Value) -> Result<AgentPolicy, PolicyErrors> {
        let mut check = Checker::default();
        let policy = check.document(value);
        match policy {
            Some(p) if check.errors.is_empty() => Ok(p),
            _ => Err(PolicyErrors(check.errors)),
        }
    }
}

/// Parses YAML text into a JSON value, refusing duplicate keys and bounding
/// alias expansion (serde-saphyr's defaults), so that a hostile document
/// cannot blow up memory. Only YAML 1.2 booleans (`true`/`false`) are
/// booleans: a tool named `on`, `no` or `y` stays the string it reads as.
pub fn parse_yaml(text: &str) -> Result<Value, PolicyErrors> {
    if text.len() > limits::MAX_POLICY_BYTES {
        return Err(PolicyErrors::one(
            "",
            format!(
                "policy document is {} bytes; the limit is {}",
                text.len(),
                limits::MAX_POLICY_BYTES
            ),
        ));
    }
    let options = serde_saphyr::options! {
        strict_booleans: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    };
    serde_saphyr::from_str_with_options::<Value>(text, options)
        .map_err(|e| PolicyErrors::one("", format!("invalid YAML: {e}")))
}

impl Checker {
    fn document(&mut self, value: &Value) -> Option<AgentPolicy> {
        let root = self.object(value, "")?;
        self.known_keys(root, "", &["apiVersion", "kind", "metadata", "spec"]);
        let api_version = self.required_string(root, "", "apiVersion");
        if let Some(v) = &api_version
            && v != API_VERSION
        {
            self.error(
                "apiVersion",
                format!("unsupported apiVersion {v:?}; expected {API_VERSION:?}"),
            );
        }
        let kind = self.required_string(root, "", "kind");
        if let Some(k) = &kind
            && k != KIND
        {
            self.error("kind", format!("unexpected kind {k:?}; expected {KIND:?}"));
        }
        let metadata = match root.get("metadata") {
            Some(v) => self.metadata(v),
            None => {
                self.error("metadata", "required field is missing");
                None
            }
        };
        let spec = match root.get("spec") {
            Some(v) => self.spec(v),
            None => {
                self.error("spec", "required field is missing");
                None
            }
        };
        Some(AgentPolicy {
            api_version: api_version?,
            kind: kind?,
            metadata: metadata?,
            spec: spec?,
            checked: Checked::new(std::mem::take(&mut self.regexes)),
        })
    }

    fn metadata(&mut self, value: &Value) -> Option<Metadata> {
        let map = self.object(value, "metadata")?;
        self.known_keys(
            map,
            "metadata",
            &[
                "name",
                "version",
                "owner",
                "namespace",
                "labels",
                "annotations",
            ],
        );
        let name = self.required_string(map, "metadata", "name");
        Some(Metadata {
            name: name?,
            version: self.optional_string(map, "metadata", "version"),
            owner: self.optional_string(map, "metadata", "owner"),
            namespace: self.optional_string(map, "metadata", "namespace"),
            labels: self
                .string_map(map, "metadata", "labels")
                .unwrap_or_default(),
            annotations: self
                .string_map(map, "metadata", "annotations")
                .unwrap_or_default(),
        })
    }

    fn spec(&mut self, value: &Value) -> Option<PolicySpec> {
        let map = self.object(value, "spec")?;
        self.known_keys(
            map,
            "spec",
            &[
                "mode",
                "allowed_tools",
                "allowed_methods",
                "denied_methods",
                "protected_paths",
                "strict_args_default",
                "tool_rules",
                "dlp",
            ],
        );
        let mode = self
            .optional_string(map, "spec", "mode")
            .and_then(|m| match m.as_str() {
                "enforce" => Some(Mode::Enforce),
                "monitor" => Some(Mode::Monitor),
                other => {
                    self.error(
                        "spec.mode",
                        format!("invalid mode {other:?}; expected one of: enforce, monitor"),
                    );
                    None
                }
            });
        let allowed_tools = self.name_list(map, "spec", "allowed_tools");
        let allowed_methods = self.name_list(map, "spec", "allowed_methods");
        let denied_methods = self.name_list(map, "spec", "denied_methods");
        let protected_paths = self.name_list(map, "spec", "protected_paths");
        let strict_args_default = self.optional_bool(map, "spec", "strict_args_default");
        let tool_rules = map
            .get("tool_rules")
            .and_then(|v| self.tool_rules(v, "spec.tool_rules"));
        let dlp = map.get("dlp").and_then(|v| self.dlp(v, "spec.dlp"));
        Some(PolicySpec {
            mode,
            allowed_tools,
            allowed_methods,
            denied_methods,
            protected_paths,
            strict_args_default,
            tool_rules,
            dlp,
        })
    }

    fn tool_rules(&mut self, value: &Value, path: &str) -> Option<Vec<ToolRule>> {
        let items = self.array(value, path)?;
        let mut rules = Vec::with_capacity(items.len());
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(rule) = self.tool_rule(item, &item_path) else {
                continue;
            };
            let key = crate::normalize::normalize_name(&rule.tool).into_owned();
            if let Some(first) = seen.get(&key) {
                self.error(
                    &format!("{item_path}.tool"),
                    format!(
                        "duplicate rule for tool {:?} (also {path}[{first}]); merge them into one rule",
                        rule.tool
                    ),
                );
            } else {
                seen.insert(key, i);
            }
            rules.push(rule);
        }
        Some(rules)
    }

    fn tool_rule(&mut self, value: &Value, path: &str) -> Option<ToolRule> {
        let map = self.object(value, path)?;
        self.known_keys(
            map,
            path,
            &[
                "tool",
                "action",
                "rate_limit",
                "strict_args",
                "allow_args",
                "schema_hash",
            ],
        );
        let tool = self.required_string(map, path, "tool");
        let action = self
            .optional_string(map, path, "action")
            .and_then(|a| match a.as_str() {
                "allow" => Some(Action::Allow),
                "block" => Some(Action::Block),
                "ask" => Some(Action::Ask),
                other => {
                    self.error(
                        &format!("{path}.action"),
                        format!("invalid action {other:?}; expected one of: allow, block, ask"),
                    );
                    None
                }
            });
        let rate_limit = self.optional_string(map, path, "rate_limit");
        if let Some(r) = &rate_limit
            && let Err(e) = RateLimit::parse(r)
        {
            self.error(&format!("{path}.rate_limit"), e.to_string());
        }
        let strict_args = self.optional_bool(map, path, "strict_args");
        let allow_args = self.allow_args(map, path);
        let schema_hash = self.optional_string(map, path, "schema_hash");
        if let Some(h) = &schema_hash
            && !crate::tools::fingerprint::is_hash(h)
        {
            self.error(
                    &format!("{path}.schema_hash"),
                    format!("invalid schema_hash {h:?}; expected \"sha256:\" followed by 64 lowercase hex digits"),
                );
        }
        Some(ToolRule {
            tool: tool?,
            action,
            rate_limit,
            strict_args,
            allow_args,
            schema_hash,
        })
    }

    fn allow_args(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
    ) -> Option<BTreeMap<String, String>> {
        let args = self.string_map(map, path, "allow_args")?;
        let args_path = format!("{path}.allow_args");
        for (name, pattern) in &args {
            let arg_path = join_key(&args_path, name);
            if name.is_empty() {
                self.error(&arg_path, "argument name must not be empty");
            }
            // A pattern two rules share is checked once; one that failed is
            // checked again, so that each place it is used gets its error.
            if self.regexes.contains_key(pattern.as_str()) {
                continue;
            }
            match LazyRegex::new(pattern) {
                Ok(regex) => {
                    self.regexes
                        .insert(pattern.as_str().into(), Arc::new(regex));
                }
                Err(e) => self.error(&arg_path, e),
            }
        }
        Some(args)
    }

    fn dlp(&mut self, value: &Value, path: &str) -> Option<DlpConfig> {
        let map = self.object(value, path)?;
        self.known_keys(
            map,
            path,
            &["enabled", "detect_encoding", "filter_stderr", "patterns"],
        );
        let enabled = self.optional_bool(map, path, "enabled");
        let detect_encoding = self.optional_bool(map, path, "detect_encoding");
        let filter_stderr = self.optional_bool(map, path, "filter_stderr");
        let patterns_path = format!("{path}.patterns");
        let patterns = match map.get("patterns") {
            None => Vec::new(),
            Some(v) => self.dlp_patterns(v, &patterns_path).unwrap_or_default(),
        };
        Some(DlpConfig {
            enabled,
            detect_encoding,
            filter_stderr,
            patterns,
        })
    }

    fn dlp_patterns(&mut self, value: &Value, path: &str) -> Option<Vec<DlpPattern>> {
        let items = self.array(value, path)?;
        let mut patterns = Vec::with_capacity(items.len());
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(map) = self.object(item, &item_path) else {
                continue;
            };
            self.known_keys(map, &item_path, &["name", "regex"]);
            let name = self.required_string(map, &item_path, "name");
            let regex = self.required_string(map, &item_path, "regex");
            if let Some(r) = &regex
                && let Err(e) = crate::regexes::check(r)
            {
                self.error(&format!("{item_path}.regex"), e);
            }
            if let Some(n) = &name
                && let Some(first) = seen.insert(n.clone(), i)
            {
                self.error(
                    &format!("{item_path}.name"),
                    format!("duplicate DLP pattern name {n:?} (also {path}[{first}])"),
                );
            }
            if let (Some(name), Some(regex)) = (name, regex) {
                patterns.push(DlpPattern { name, regex });
            }
        }
        Some(patterns)
    }

    // --- typed accessors -------------------------------------------------

    fn required_string(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<String> {
        if !map.contains_key(key) {
            self.error(&join_key(path, key), "required field is missing");
            return None;
        }
        let s = self.optional_string(map, path, key)?;
        if s.trim().is_empty() {
            self.error(&join_key(path, key), "must not be empty");
            return None;
        }
        Some(s)
    }

    fn optional_string(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<String> {
        match map.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.error(
                    &join_key(path, key),
                    format!("must be a string, found {} (quote it)", type_name(other)),
                );
                None
            }
        }
    }

    fn optional_bool(&mut self, map: &Map<String, Value>, path: &str, key: &str) -> Option<bool> {
        match map.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                self.error(
                    &join_key(path, key),
                    format!("must be true or false, found {}", type_name(other)),
                );
                None
            }
        }
    }

    /// A list of non-empty strings (tool names, methods, paths).
    fn name_list(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<Vec<String>> {
        let list_path = join_key(path, key);
        let items = match map.get(key)? {
            Value::Null => return Some(Vec::new()),
            v => self.array(v, &list_path)?,
        };
        let mut names = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if !s.trim().is_empty() => names.push(s.clone()),
                Value::String(_) => self.error(&format!("{list_path}[{i}]"), "must not be empty"),
                other => self.error(
                    &format!("{list_path}[{i}]"),
                    format!("must be a string, found {}", type_name(other)),
                ),
            }
        }
        Some(names)
    }

    fn string_map(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<BTreeMap<String, String>> {
        let map_path = join_key(path, key);
        let entries = match map.get(key)? {
            Value::Null => return Some(BTreeMap::new()),
            v => self.object(v, &map_path)?,
        };
        let mut out = BTreeMap::new();
        for (k, v) in entries {
            match v {
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                other => self.error(
                    &join_key(&map_path, k),
                    format!("must be a string, found {} (quote it)", type_name(other)),
                ),
            }
        }
        Some(out)
    }
}

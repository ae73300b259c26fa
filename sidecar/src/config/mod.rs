//! The gateway's configuration: one AgentPolicy and any number of
//! ToolConnections. Standalone mode reads them from a multi-document YAML
//! file (`file`); in Kubernetes mode the operator's stream produces the same
//! Config (`crate::control`). Nothing here knows of the gateway or its
//! upstreams.

pub mod connection;
pub mod file;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use aip_policy::tools::Pins;
use aip_policy::{AgentPolicy, CompileOptions, Evaluator};
use serde::Deserialize;
use serde_json::Value;

pub use aip_mcp::{ClientCapabilities, Connection, Endpoint};

/// Everything the gateway enforces with. Immutable; replaced whole.
#[derive(Debug)]
pub struct Config {
    /// The compiled policy; `Evaluator::deny_all()` when there is none.
    pub evaluator: Arc<Evaluator>,
    pub policy: Option<AgentPolicy>,
    pub connections: Vec<Arc<Connection>>,
    /// What each connection's tools are held to, by connection name (a
    /// connection not named here serves its tools as listed, with the scan
    /// warning).
    pub tools: BTreeMap<String, ToolRules>,
}

/// What a connection's tools are held to: their pins, and what a finding
/// of the poisoning scan does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolRules {
    pub pins: Pins,
    pub scan: ScanAction,
}

/// What a finding of the poisoning scan does to its tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ScanAction {
    /// Logged, and the tool is served.
    #[default]
    Warn,
    /// The tool is withheld, as a drifted one is.
    Block,
    /// No scan.
    Off,
}

impl Config {
    /// No policy, no connections: every tool call is blocked.
    pub fn empty() -> Config {
        Config {
            evaluator: Arc::new(Evaluator::deny_all()),
            policy: None,
            connections: Vec::new(),
            tools: BTreeMap::new(),
        }
    }

    /// What `connection`'s tools are held to.
    pub fn tool_rules(&self, connection: &str) -> ToolRules {
        self.tools.get(connection).cloned().unwrap_or_default()
    }

    pub fn connection(&self, name: &str) -> Option<&Arc<Connection>> {
        self.connections.iter().find(|c| c.name == name)
    }
}

/// One problem in a configuration, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Which document, e.g. `document 2 (ToolConnection github)`.
    pub document: String,
    /// The field path inside it.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn at(document: &str, path: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            document: document.to_owned(),
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.document.is_empty(), self.path.is_empty()) {
            (true, true) => f.write_str(&self.message),
            (true, false) => write!(f, "{}: {}", self.path, self.message),
            (false, true) => write!(f, "{}: {}", self.document, self.message),
            (false, false) => write!(f, "{}: {}: {}", self.document, self.path, self.message),
        }
    }
}

/// Every problem found, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

/// Builds a Config from parsed documents. `options` says what `~` is and
/// which file holds the policy (it is always protected).
pub fn from_documents(
    documents: &[Value],
    options: &CompileOptions,
) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut policy: Option<(String, AgentPolicy)> = None;
    let mut connections: Vec<Arc<Connection>> = Vec::new();
    let mut tools = BTreeMap::new();
    for (i, doc) in documents.iter().enumerate() {
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        match doc.get("kind").and_then(Value::as_str) {
            Some("AgentPolicy") => {
                let at = format!("document {} (AgentPolicy {name})", i + 1);
                match AgentPolicy::from_value(doc) {
                    Ok(_) if policy.is_some() => errors.push(ConfigError::at(
                        &at,
                        "",
                        "a configuration holds one AgentPolicy; this is the second",
                    )),
                    Ok(p) => policy = Some((at, p)),
                    Err(e) => errors.extend(
                        e.0.into_iter()
                            .map(|f| ConfigError::at(&at, &f.path, f.message)),
                    ),
                }
            }
            Some("ToolConnection") => {
                let at = format!("document {} (ToolConnection {name})", i + 1);
                match serde_path_to_error::deserialize(doc) {
                    Err(e) => errors.push(ConfigError::at(
                        &at,
                        e.path().to_string().trim_start_matches('.'),
                        e.into_inner().to_string(),
                    )),
                    Ok(parsed) => match connection::from_doc(parsed, &at) {
                        Ok((c, _)) if connections.iter().any(|o| o.name == c.name) => {
                            errors.push(ConfigError::at(
                                &at,
                                "metadata.name",
                                format!("duplicate connection {:?}", c.name),
                            ));
                        }
                        Ok((c, rules)) => {
                            tools.insert(c.name.clone(), rules);
                            connections.push(Arc::new(c));
                        }
                        Err(e) => errors.push(e),
                    },
                }
            }
            other => errors.push(ConfigError::at(
                &format!("document {}", i + 1),
                "kind",
                format!("expected AgentPolicy or ToolConnection, found {other:?}"),
            )),
        }
    }
    let evaluator = match &policy {
        None => Evaluator::deny_all(),
        Some((at, p)) => match Evaluator::compile(p, options) {
            Ok(e) => e,
            Err(e) => {
                errors.extend(
                    e.0.into_iter()
                        .map(|f| ConfigError::at(at, &f.path, f.message)),
                );
                Evaluator::deny_all()
            }
        },
    };
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        evaluator: Arc::new(evaluator),
        policy: policy.map(|(_, p)| p),
        connections,
        tools,
    })
}

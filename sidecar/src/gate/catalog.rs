//! Where each agent-facing name leads: the tools of every connection's last
//! catalog under their agent-facing names (`{prefix}{name}`), with the
//! normalized names more than one tool claims (hidden and refused: which one
//! a caller meant is unknowable). Prompts and resources are routed by
//! their listings (listings.rs).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aip_policy::normalize_name;
use aip_policy::tools::{Context, Finding, Fingerprint, Scanner};
use aip_service::sync::lock;
use serde_json::Value;

use super::call::Route;
use super::connections::Connections;
use crate::config::ScanAction;
use crate::upstream::health::ConnectionState;

/// The routing index of one version of the catalogs, shared by the calls
/// made while it is current.
pub(super) struct Catalog {
    /// The `Connections::listing` count it was built at.
    version: u64,
    pub entries: Vec<CatalogEntry>,
    /// Looked up on every call: a fast hash (keys are the catalog's own
    /// names, not chosen by the agent alone).
    by_name: HashMap<String, usize, foldhash::fast::RandomState>,
    ambiguous: HashSet<String>,
}

pub(super) struct CatalogEntry {
    pub agent_name: String,
    pub connection: Arc<ConnectionState>,
    /// The upstream's definition, name byte-identical to its tools/list.
    pub definition: Value,
    pub seen: Fingerprint,
    /// Why it is neither listed nor called: its pin no longer matches, it
    /// has none where pins are kept, or the scan blocks it.
    pub withheld: Option<Arc<str>>,
    /// What the poisoning scan found in it.
    pub findings: Vec<Finding>,
}

/// A `tools/call`'s tool, as one lookup found it.
#[derive(Default)]
pub(super) struct Lookup {
    pub known: bool,
    pub route: Option<Route>,
    pub param_headers: Vec<aip_mcp::modern::ParamHeader>,
    /// Why the tool is withheld (the call is refused with -32013).
    pub withheld: Option<Arc<str>>,
}

impl CatalogEntry {
    pub fn upstream_name(&self) -> &str {
        self.definition
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

impl Catalog {
    /// Finds the one tool whose agent-facing name is exactly `name`.
    pub fn route(&self, name: &str) -> Option<Route> {
        let entry = &self.entries[*self.by_name.get(name)?];
        if self.is_ambiguous(name) || entry.withheld.is_some() {
            return None;
        }
        Some(Route {
            upstream_name: entry.upstream_name().to_owned(),
            connection: entry.connection.clone(),
        })
    }

    /// What a `tools/call` of `name` needs of the catalog, in one lookup:
    /// whether the name is catalogued, its route, and (for a 2026-07-28
    /// agent) the `x-mcp-header` annotations of its arguments; and why it
    /// is withheld, by its pin or by the `schema_hash` the policy pins
    /// (`pinned`: AIP v1alpha2) when its definition no longer has it.
    pub fn lookup(&self, name: &str, annotations: bool, pinned: Option<&str>) -> Lookup {
        let Some(&i) = self.by_name.get(name) else {
            return Lookup::default();
        };
        let entry = &self.entries[i];
        let withheld = entry.withheld.clone().or_else(|| {
            let listed = &entry.seen.schema_hash;
            let pinned = pinned.filter(|p| p != listed)?;
            Some(Arc::from(format!(
                "the policy pins schema_hash {pinned}; the server's definition now hashes to {listed}"
            )))
        });
        let route = (!self.is_ambiguous(name) && withheld.is_none()).then(|| Route {
            upstream_name: entry.upstream_name().to_owned(),
            connection: entry.connection.clone(),
        });
        let param_headers = match (annotations, &route) {
            (true, Some(_)) => entry
                .definition
                .get("inputSchema")
                .and_then(|schema| aip_mcp::modern::param_headers(schema).ok())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        Lookup {
            known: true,
            route,
            param_headers,
            withheld,
        }
    }

    pub fn is_ambiguous(&self, agent_name: &str) -> bool {
        !self.ambiguous.is_empty() && self.ambiguous.contains(normalize_name(agent_name).as_ref())
    }

    /// Tools hidden because their agent-facing names collide after
    /// normalization: (connection, agent-facing name).
    pub fn colliding(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .filter(|e| self.is_ambiguous(&e.agent_name))
            .map(|e| (e.connection.connection().name.clone(), e.agent_name.clone()))
            .collect()
    }

    fn build(
        version: u64,
        connections: &[Arc<ConnectionState>],
        previous: Option<&Catalog>,
    ) -> Catalog {
        let mut entries = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for state in connections {
            let prefix = &state.connection().tool_prefix;
            for listed in state.catalog().iter() {
                if listed
                    .definition
                    .get("name")
                    .and_then(Value::as_str)
                    .is_none()
                {
                    continue;
                }
                let agent_name = format!("{prefix}{}", listed.name());
                *seen
                    .entry(normalize_name(&agent_name).into_owned())
                    .or_default() += 1;
                entries.push(CatalogEntry {
                    agent_name,
                    connection: state.clone(),
                    definition: listed.definition.clone(),
                    seen: listed.seen.clone(),
                    withheld: listed.standing.reason().map(Arc::from),
                    findings: Vec::new(),
                });
            }
        }
        scan(&mut entries, previous);
        let ambiguous: HashSet<String> = seen
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k)
            .collect();
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.agent_name.clone(), i))
            .collect();
        let catalog = Catalog {
            version,
            entries,
            by_name,
            ambiguous,
        };
        for entry in &catalog.entries {
            if catalog.is_ambiguous(&entry.agent_name) {
                tracing::warn!(
                    connection = %entry.connection.connection().name,
                    tool = %entry.agent_name,
                    "tool hidden: its name collides with another after normalization"
                );
            }
        }
        catalog
    }
}

/// The poisoning scan of every entry, with the names of the other
/// connections' tools as context. A finding is logged once (not again for
/// the same tool in the next version of the catalog); on a connection that
/// blocks on findings, the tool is withheld.
fn scan(entries: &mut [CatalogEntry], previous: Option<&Catalog>) {
    let scanner = match Scanner::builtin() {
        Ok(scanner) => scanner,
        Err(e) => {
            tracing::error!(
                error = e,
                "the poisoning scan's rules do not compile; no scan"
            );
            return;
        }
    };
    let names: Vec<(String, String)> = entries
        .iter()
        .map(|e| (e.connection.connection().name.clone(), e.agent_name.clone()))
        .collect();
    for entry in entries.iter_mut() {
        let action = entry.connection.scan_action();
        if action == ScanAction::Off {
            continue;
        }
        let connection = &entry.connection.connection().name;
        let others: Vec<String> = names
            .iter()
            .filter(|(c, _)| c != connection)
            .map(|(_, n)| n.clone())
            .collect();
        let context = Context {
            other_tools: &others,
        };
        // What the agent would be shown: a credential the server echoed
        // in a description is redacted before any excerpt is taken, so no
        // finding (logged, or a withheld tool's reason) can carry one.
        let mut shown = entry.definition.clone();
        entry.connection.redact_echoes(&mut shown);
        entry.findings = scanner.scan(&shown, &context);
        let Some(first) = entry.findings.first() else {
            continue;
        };
        let known = previous.is_some_and(|p| {
            p.by_name.get(&entry.agent_name).is_some_and(|&i| {
                let before = &p.entries[i];
                before.seen == entry.seen && before.findings == entry.findings
            })
        });
        if !known {
            for finding in &entry.findings {
                tracing::warn!(
                    connection = %connection,
                    tool = %entry.agent_name,
                    rule = %finding.rule,
                    class = %finding.class,
                    field = %finding.field,
                    excerpt = %finding.excerpt,
                    blocked = action == ScanAction::Block,
                    "poisoning scan finding"
                );
            }
        }
        if action == ScanAction::Block && entry.withheld.is_none() {
            entry.withheld = Some(Arc::from(format!(
                "the poisoning scan found {} ({}) at {}: {:?}",
                first.rule, first.class, first.field, first.excerpt
            )));
        }
    }
}

/// The gateway's routing state.
#[derive(Default)]
pub(super) struct Routes {
    index: Mutex<Option<Arc<Catalog>>>,
}

impl Routes {
    /// The routing index of the current catalogs: reused while nothing an
    /// agent's tool list depends on has changed, rebuilt (once) when it has.
    pub fn catalog(&self, connections: &Connections) -> Arc<Catalog> {
        // Read the count before the catalogs: a change while building
        // leaves a newer count, and the next caller rebuilds.
        let version = *connections.listing.borrow();
        let mut index = lock(&self.index);
        if let Some(current) = index.as_ref().filter(|c| c.version == version) {
            return current.clone();
        }
        let built = Arc::new(Catalog::build(
            version,
            &connections.all(),
            index.as_deref(),
        ));
        *index = Some(built.clone());
        built
    }

    /// Forgets the index (a reload removed a connection).
    pub fn forget(&self) {
        *lock(&self.index) = None;
    }
}

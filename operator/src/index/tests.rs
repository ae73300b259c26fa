//! The index without Kubernetes: objects in, each pod's configuration out.
//! The helpers that build objects are here; the tests, one file per topic,
//! in tests/.

mod acks;
mod connections;
mod peers;
mod pods;
mod policies;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aip_api::agent_policy::AgentPolicySpec;
use aip_api::tool_connection::ToolConnectionSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use secrecy::ExposeSecret;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn pod(ns: &str, name: &str, uid: &str, pairs: &[(&str, &str)]) -> PodMeta {
    PodMeta {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        labels: labels(pairs),
        injected: true,
        lock: None,
    }
}

fn policy(app: &str, tools: &[&str], connections: &[&str]) -> AgentPolicySpec {
    AgentPolicySpec {
        allowed_tools: Some(tools.iter().map(|t| (*t).to_owned()).collect()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("app", app)])),
            ..LabelSelector::default()
        }),
        tool_connections: connections.iter().map(|c| (*c).to_owned()).collect(),
        ..AgentPolicySpec::default()
    }
}

fn connection(secret: &str, key: &str) -> ToolConnectionSpec {
    serde_json::from_value(serde_json::json!({
        "url": "https://mcp.example.com/mcp",
        "bearerToken": {"valueFrom": {"secretKeyRef": {"name": secret, "key": key}}},
    }))
    .unwrap()
}

fn secret(pairs: &[(&str, &str)]) -> SecretData {
    SecretData(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect(),
    )
}

fn current(index: &Index, ns: &str, name: &str, uid: &str) -> Arc<PodConfig> {
    index.subscribe(ns, name, uid).unwrap().borrow().clone()
}

fn bearer(config: &PodConfig, connection: &str) -> Result<String, String> {
    let c = config
        .connections
        .iter()
        .find(|c| c.name == connection)
        .expect("connection granted");
    c.credentials
        .as_ref()
        .map_err(ToString::to_string)
        .map(|cred| {
            cred.headers
                .iter()
                .find(|(n, _)| n == "authorization")
                .map(|(_, v)| v.expose_secret().to_owned())
                .unwrap_or_default()
        })
}

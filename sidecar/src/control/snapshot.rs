//! A snapshot from the operator, in the gateway's terms.

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::{ClientCapabilities, Connection, Endpoint, Tls};
use aip_policy::{AgentPolicy, CompileOptions, Evaluator};
use aip_proto::v1;
use secrecy::SecretString;

use crate::config::Config;

/// The gateway's Config for a snapshot. The policy is validated and
/// compiled here as well: the sidecar trusts no one to have done it. A
/// policy whose hash is unchanged keeps its compiled evaluator (and so its
/// rate-limit buckets); a changed one keeps the buckets of unchanged rules.
pub fn from_snapshot(snapshot: &v1::Snapshot, previous: &Config) -> Result<Config, String> {
    let connections = snapshot
        .connections
        .iter()
        .map(connection)
        .collect::<Result<Vec<_>, _>>()?;
    if snapshot.keep_previous && previous.policy.is_some() {
        tracing::warn!(reason = %snapshot.deny_reason, "the policy is invalid upstream; keeping the one in force");
        // The same connections as before, with whatever fresh credentials
        // the operator has for them; nothing newly granted.
        let fresh: Vec<Arc<Connection>> = snapshot
            .connections
            .iter()
            .map(connection)
            .collect::<Result<_, _>>()?;
        let connections = previous
            .connections
            .iter()
            .map(|old| {
                fresh
                    .iter()
                    .find(|c| c.name == old.name)
                    .unwrap_or(old)
                    .clone()
            })
            .collect();
        return Ok(Config {
            evaluator: previous.evaluator.clone(),
            policy: previous.policy.clone(),
            connections,
            tools: Default::default(),
        });
    }
    let Some(p) = &snapshot.policy else {
        if !snapshot.deny_reason.is_empty() {
            tracing::warn!(reason = %snapshot.deny_reason, "no policy applies to this pod; every tool call is refused");
        }
        return Ok(Config {
            connections,
            ..Config::empty()
        });
    };
    let policy = AgentPolicy::from_json(&p.document_json)
        .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?;
    let unchanged = previous
        .policy
        .as_ref()
        .is_some_and(|old| aip_policy::hash::policy_hash(old) == p.hash);
    let evaluator = if unchanged {
        previous.evaluator.clone()
    } else {
        let options = CompileOptions::default();
        Arc::new(
            Evaluator::compile_after(&policy, &options, &previous.evaluator)
                .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?,
        )
    };
    Ok(Config {
        evaluator,
        policy: Some(policy),
        connections,
        tools: Default::default(),
    })
}

/// A connection as the operator sends it, in the gateway's terms.
pub fn connection(c: &v1::Connection) -> Result<Arc<Connection>, String> {
    let at = |field: &str| format!("connection {}: {field}", c.name);
    if !(c.url.starts_with("http://") || c.url.starts_with("https://")) {
        return Err(at("url is not http(s)"));
    }
    let credentials = if c.credentials_error.is_empty() {
        Ok(c.headers
            .iter()
            .map(|h| (h.name.clone(), SecretString::from(h.value.clone())))
            .collect())
    } else {
        Err(c.credentials_error.clone())
    };
    let millis = |ms: u32, field: &str| {
        if ms == 0 {
            Err(at(&format!("{field} is zero")))
        } else {
            Ok(Duration::from_millis(ms.into()))
        }
    };
    let tls = c.tls.clone().unwrap_or_default();
    let caps = c.capabilities.unwrap_or_default();
    Ok(Arc::new(Connection {
        name: c.name.clone(),
        endpoint: Endpoint::Http { url: c.url.clone() },
        credentials,
        timeout: millis(c.timeout_ms, "timeout")?,
        max_response_bytes: usize::try_from(c.max_response_bytes).unwrap_or(usize::MAX),
        health_interval: millis(c.health_interval_ms, "health interval")?,
        health_deadline: millis(c.health_deadline_ms, "health deadline")?,
        tool_prefix: c.tool_prefix.clone(),
        capabilities: ClientCapabilities {
            sampling: caps.sampling,
            elicitation: caps.elicitation,
            roots: caps.roots,
        },
        tls: Tls {
            ca_pem: (!tls.ca_pem.is_empty()).then_some(tls.ca_pem),
            server_name: (!tls.server_name.is_empty()).then_some(tls.server_name),
        },
    }))
}

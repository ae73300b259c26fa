//! Full validation of the custom resources, shared by the admission webhook
//! (refuse at apply time) and the index (never publish what fails). Errors
//! carry the field path of the object as the user wrote it.

use std::sync::Arc;
use std::time::Duration;

use aip_api::agent_policy::AgentPolicySpec;
use aip_api::tool_connection::ToolConnectionSpec;
use aip_policy::{CompileOptions, Evaluator, FieldError};
use serde_json::{Value, json};

use crate::selector::Selector;

pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);

/// A policy that passed aip-policy's validation and compiles: what a pod's
/// sidecar receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedPolicy {
    pub namespace: String,
    pub name: String,
    /// sha256:..., as `aip policy hash` prints it.
    pub hash: String,
    /// The AIP document (apiVersion, kind, metadata.name, spec) as JSON.
    pub document_json: String,
    pub mode: aip_policy::Mode,
    pub approval_timeout: Duration,
}

/// What the binding fields say, once valid.
#[derive(Debug, Clone)]
pub struct Binding {
    pub selector: Selector,
    pub connections: Vec<String>,
}

/// Validates an AgentPolicy: the AIP part with aip-policy (every error, each
/// with its path), the binding fields here.
pub fn agent_policy(
    namespace: &str,
    name: &str,
    spec: &AgentPolicySpec,
) -> Result<(Arc<AcceptedPolicy>, Binding), Vec<FieldError>> {
    let mut errors = Vec::new();
    let document = aip_document(name, spec);
    let accepted = match aip_policy::AgentPolicy::from_value(&document) {
        Err(e) => {
            errors.extend(e.0);
            None
        }
        Ok(policy) => match Evaluator::compile(&policy, &CompileOptions::default()) {
            Err(e) => {
                errors.extend(e.0);
                None
            }
            Ok(_) => Some(policy),
        },
    };
    let binding = binding(spec).map_err(|e| errors.extend(e)).ok();
    match (accepted, binding) {
        (Some(policy), Some(binding)) if errors.is_empty() => {
            let approval_timeout = spec
                .approval
                .as_ref()
                .and_then(|a| a.timeout_seconds)
                .map_or(DEFAULT_APPROVAL_TIMEOUT, |s| Duration::from_secs(s.into()));
            let accepted = AcceptedPolicy {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                hash: aip_policy::hash::policy_hash(&policy),
                // A validated policy always serializes.
                document_json: serde_json::to_string(&policy).unwrap_or_default(),
                mode: policy.spec.mode(),
                approval_timeout,
            };
            Ok((Arc::new(accepted), binding))
        }
        _ => Err(errors),
    }
}

/// The binding fields alone: which pods, which connections. Valid even when
/// the AIP part is not, so that the pods a broken policy selects are known.
pub fn binding(spec: &AgentPolicySpec) -> Result<Binding, Vec<FieldError>> {
    let mut errors = Vec::new();
    let selector = Selector::from_label_selector(spec.pod_selector.as_ref())
        .map_err(|e| errors.push(field("spec.podSelector", e.to_string())))
        .ok();
    for (i, c) in spec.tool_connections.iter().enumerate() {
        if let Some(problem) = aip_policy::kubernetes::name_problem(c) {
            errors.push(field(
                &format!("spec.toolConnections[{i}]"),
                format!("{c:?} is not a ToolConnection name: it {problem}"),
            ));
        }
    }
    match selector {
        Some(selector) if errors.is_empty() => Ok(Binding {
            selector,
            connections: spec.tool_connections.clone(),
        }),
        _ => Err(errors),
    }
}

/// The AIP document inside an AgentPolicy: the binding fields removed, the
/// AIP fields exactly as written.
fn aip_document(name: &str, spec: &AgentPolicySpec) -> Value {
    // Serializing plain data cannot fail.
    let mut spec = serde_json::to_value(spec).unwrap_or_default();
    if let Some(map) = spec.as_object_mut() {
        for binding in ["podSelector", "toolConnections", "approval"] {
            map.remove(binding);
        }
    }
    json!({
        "apiVersion": aip_policy::document::API_VERSION,
        "kind": aip_policy::document::KIND,
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// What the schema cannot say about a ToolConnection (the API server checks
/// the rest, and the webhook re-checks it for servers that skip CEL).
/// `namespace` is the ToolConnection's own.
pub fn tool_connection(namespace: &str, spec: &ToolConnectionSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    for (path, r) in spec.secret_refs() {
        if let Some(other) = r.namespace.as_deref().filter(|n| *n != namespace) {
            errors.push(field(
                &format!("{path}.namespace"),
                format!(
                    "Secrets are read only from the ToolConnection's own namespace ({namespace}), not {other}"
                ),
            ));
        }
    }
    if !(spec.url.starts_with("http://") || spec.url.starts_with("https://")) {
        errors.push(field(
            "spec.url",
            format!("must be an http:// or https:// URL, found {:?}", spec.url),
        ));
    }
    if spec.tls.is_some() && !spec.url.starts_with("https://") {
        errors.push(field("spec.tls", "applies to https:// URLs only"));
    }
    if let Some(t) = spec.timeout_seconds
        && !(1..=aip_api::tool_connection::MAX_TIMEOUT_SECONDS).contains(&t)
    {
        errors.push(field("spec.timeoutSeconds", "must be 1..60"));
    }
    if let Some(b) = spec.max_response_bytes
        && b < 1024
    {
        errors.push(field("spec.maxResponseBytes", "must be at least 1024"));
    }
    for (i, h) in spec.headers.iter().enumerate() {
        let lower = h.name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "mcp-session-id" | "mcp-protocol-version" | "content-type" | "content-length" | "host"
        ) {
            errors.push(field(
                &format!("spec.headers[{i}].name"),
                format!("{} is set by the gateway itself", h.name),
            ));
        }
        if h.name.is_empty()
            || !h
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            errors.push(field(
                &format!("spec.headers[{i}].name"),
                format!("{:?} is not a valid header name", h.name),
            ));
        }
    }
    if let Some(prefix) = &spec.tool_prefix
        && !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        errors.push(field(
            "spec.toolPrefix",
            "may hold only letters, digits, '_', '-' and '.'",
        ));
    }
    if let Some(name) = spec.tls.as_ref().and_then(|t| t.server_name.as_ref())
        && rustls_pki_types::ServerName::try_from(name.as_str()).is_err()
    {
        errors.push(field(
            "spec.tls.serverName",
            format!("{name:?} is not a valid DNS name or IP address"),
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn field(path: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.to_owned(),
        message: message.into(),
    }
}

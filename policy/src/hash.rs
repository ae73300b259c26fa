//! The policy hash: `sha256:` + hex of the SHA-256 of the RFC 8785 canonical
//! JSON of what decides behaviour (apiVersion, kind, metadata.name, spec). The
//! same policy hashes the same however its YAML is formatted or ordered;
//! informational metadata (version, owner, labels, annotations) does not count.

use sha2::{Digest, Sha256};

use crate::document::AgentPolicy;

pub fn policy_hash(policy: &AgentPolicy) -> String {
    let view = serde_json::json!({
        "apiVersion": policy.api_version,
        "kind": policy.kind,
        "metadata": { "name": policy.metadata.name },
        "spec": policy.spec,
    });
    // Serializing plain strings, bools and maps cannot fail.
    let canonical = serde_json_canonicalizer::to_vec(&view).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(&canonical)))
}

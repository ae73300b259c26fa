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

/// A tool's schema hash (spec §6): see [`crate::tools::fingerprint`].
pub fn tool_schema_hash(tool: &serde_json::Value) -> String {
    crate::tools::fingerprint::schema_hash(tool)
}

/// The hash of a call's arguments as the agent sent them: `sha256:` + hex
/// of the SHA-256 of their RFC 8785 canonical JSON. An approver's record of
/// exactly which call was allowed, whatever the redacted copy shows.
pub fn arguments_hash(arguments: &serde_json::Value) -> String {
    let canonical = serde_json_canonicalizer::to_vec(arguments).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(&canonical)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn tool_schema_hash_ignores_member_order_and_other_members() {
        let a = json!({"name": "t", "inputSchema": {"type": "object", "properties": {"b": {}, "a": {}}}, "title": "x"});
        let b = json!({"inputSchema": {"properties": {"a": {}, "b": {}}, "type": "object"}, "name": "t"});
        assert_eq!(super::tool_schema_hash(&a), super::tool_schema_hash(&b));
        let c =
            json!({"name": "t", "description": "now different", "inputSchema": {"type": "object"}});
        assert_ne!(super::tool_schema_hash(&a), super::tool_schema_hash(&c));
        assert!(super::tool_schema_hash(&a).starts_with("sha256:"));
    }

    #[test]
    fn arguments_hash_is_canonical() {
        let a = json!({"b": 1, "a": "x"});
        let b = json!({"a": "x", "b": 1});
        assert_eq!(super::arguments_hash(&a), super::arguments_hash(&b));
        assert_ne!(
            super::arguments_hash(&a),
            super::arguments_hash(&json!({"a": "y", "b": 1}))
        );
    }
}

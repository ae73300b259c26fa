//! The Kubernetes shape of an AgentPolicy. An AIP file is already
//! Kubernetes-shaped except for two metadata fields Kubernetes metadata cannot
//! hold, `version` and `owner`; they travel as annotations.

use crate::document::AgentPolicy;

pub const VERSION_ANNOTATION: &str = "aip.io/version";
pub const OWNER_ANNOTATION: &str = "aip.io/owner";

/// Why `name` cannot name a Kubernetes object (RFC 1123 subdomain, as
/// custom resources require), or None when it can.
pub fn name_problem(name: &str) -> Option<String> {
    if name.len() > 253 {
        return Some(format!(
            "is {} characters long; at most 253 are allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Some(format!(
            "contains {c:?}; only lowercase letters, digits, '-' and '.' are allowed"
        ));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Some("must start and end with a lowercase letter or digit".to_owned());
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.len() > 63)
    {
        return Some("each '.'-separated part must be 1 to 63 characters".to_owned());
    }
    None
}

impl AgentPolicy {
    /// The policy as a Kubernetes object: version and owner moved into
    /// annotations, optionally placed in `namespace`.
    pub fn to_kubernetes(&self, namespace: Option<&str>) -> Result<AgentPolicy, String> {
        if let Some(problem) = name_problem(&self.metadata.name) {
            return Err(format!(
                "metadata.name {:?} is not a valid Kubernetes name: it {problem}",
                self.metadata.name
            ));
        }
        let mut out = self.clone();
        let meta = &mut out.metadata;
        if let Some(v) = meta.version.take() {
            meta.annotations.insert(VERSION_ANNOTATION.to_owned(), v);
        }
        if let Some(o) = meta.owner.take() {
            meta.annotations.insert(OWNER_ANNOTATION.to_owned(), o);
        }
        if let Some(ns) = namespace {
            meta.namespace = Some(ns.to_owned());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::name_problem;

    #[test]
    fn kubernetes_names() {
        assert_eq!(name_problem("github-agent.v2"), None);
        assert!(name_problem("GitHub Agent").unwrap().contains("'G'"));
        assert!(name_problem("-x").unwrap().contains("start and end"));
        assert!(name_problem(&"a".repeat(254)).unwrap().contains("253"));
        assert!(name_problem("a..b").unwrap().contains("1 to 63"));
    }
}

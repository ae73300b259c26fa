//! Status conditions as Kubernetes API conventions describe them: a
//! condition keeps its lastTransitionTime while its status stays the same,
//! and the list is keyed by type, so each writer owns only its own types.
//! The operator server-side applies its types and leaves other writers'
//! alone; whether a write is needed is judged on its own types only.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Builds conditions for one status write.
pub struct Conditions<'a> {
    /// The conditions the object has now.
    pub before: &'a [Condition],
    pub generation: Option<i64>,
    pub now: Time,
}

/// `conditions` without those of types the operator does not write.
pub fn ours(conditions: &[Condition], types: &[&str]) -> Vec<Condition> {
    conditions
        .iter()
        .filter(|c| types.contains(&c.type_.as_str()))
        .cloned()
        .collect()
}

/// Whether `text` may be a condition's reason: Kubernetes' pattern
/// (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`), at most 128 characters
/// here (the API allows 1024; no reason of ours comes near).
pub fn is_reason(text: &str) -> bool {
    text.len() <= 128
        && text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && !text.ends_with([',', ':'])
}

impl Conditions<'_> {
    pub fn set(&self, type_: &str, ok: bool, reason: &str, message: String) -> Condition {
        self.set_status(type_, if ok { "True" } else { "False" }, reason, message)
    }

    /// A condition of any status: "True", "False" or "Unknown".
    pub fn set_status(
        &self,
        type_: &str,
        status: &str,
        reason: &str,
        message: String,
    ) -> Condition {
        let since = self
            .before
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| self.now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: self.generation,
            last_transition_time: since,
        }
    }
}

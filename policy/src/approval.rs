//! How an `ask` ends, named for what happened: a person approved or denied
//! it, it expired undecided, or it was withdrawn for a reason nobody
//! decided. One vocabulary for the gateway's answer to the agent, the audit
//! line, the metric label, the ApprovalRequest's status and its Events, so
//! that no record says a person decided what a fault decided.

use std::fmt;
use std::str::FromStr;

/// The end of an ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// A person approved it.
    Approved,
    /// A person denied it.
    Denied,
    /// Nobody decided before it expired.
    TimedOut,
    /// It ended undecided, for the reason given; no person decided.
    Withdrawn(Withdrawal),
}

/// Why an ask ended without a person's decision. Each has a stable word
/// (a Kubernetes condition reason: `error.data.cause`, the ApprovalRequest's
/// `status.reason`, the audit line's `reason`) and a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Withdrawal {
    /// A new policy refuses the held call outright.
    PolicyChanged,
    /// The operator refused to create the ApprovalRequest (no policy
    /// governs the pod, the ask was malformed, approvals are off).
    OperatorRefused,
    /// The operator could not be reached for longer than the sidecar's
    /// bound, so no decision could arrive.
    OperatorUnreachable,
    /// The gateway is shutting down (SIGTERM, a rollout).
    GatewayShutdown,
    /// The sidecar stayed away from every operator replica longer than the
    /// operator's bound (the operator's word; the sidecar gives up too).
    SidecarAway,
    /// A new instance of the pod's sidecar connected: the earlier one, and
    /// the calls it held, are gone.
    SidecarRestarted,
    /// The pod is gone, finished, or being deleted.
    PodGone,
    /// The agent cancelled the call (`notifications/cancelled`, a task's
    /// cancellation). No agent hears of it.
    Cancelled,
    /// The agent's session ended. No agent hears of it.
    SessionEnded,
    /// The agent's connection closed while its call waited. No agent hears
    /// of it.
    AgentDisconnected,
    /// The sidecar's stream closed and the sidecar (older than explicit
    /// withdrawals) said nothing more: treated as gone, as before.
    StreamClosed,
}

impl Withdrawal {
    pub const ALL: [Withdrawal; 11] = [
        Withdrawal::PolicyChanged,
        Withdrawal::OperatorRefused,
        Withdrawal::OperatorUnreachable,
        Withdrawal::GatewayShutdown,
        Withdrawal::SidecarAway,
        Withdrawal::SidecarRestarted,
        Withdrawal::PodGone,
        Withdrawal::Cancelled,
        Withdrawal::SessionEnded,
        Withdrawal::AgentDisconnected,
        Withdrawal::StreamClosed,
    ];

    /// The stable word (CamelCase, a valid condition reason).
    pub fn as_str(self) -> &'static str {
        match self {
            Withdrawal::PolicyChanged => "PolicyChanged",
            Withdrawal::OperatorRefused => "OperatorRefused",
            Withdrawal::OperatorUnreachable => "OperatorUnreachable",
            Withdrawal::GatewayShutdown => "GatewayShutdown",
            Withdrawal::SidecarAway => "SidecarAway",
            Withdrawal::SidecarRestarted => "SidecarRestarted",
            Withdrawal::PodGone => "PodGone",
            Withdrawal::Cancelled => "Cancelled",
            Withdrawal::SessionEnded => "SessionEnded",
            Withdrawal::AgentDisconnected => "AgentDisconnected",
            Withdrawal::StreamClosed => "StreamClosed",
        }
    }

    /// What happened, as a sentence that names no person.
    pub fn sentence(self) -> &'static str {
        match self {
            Withdrawal::PolicyChanged => "withdrawn: the policy changed and now refuses this call",
            Withdrawal::OperatorRefused => "withdrawn: the operator refused the approval request",
            Withdrawal::OperatorUnreachable => {
                "withdrawn: the operator could not be reached for too long to deliver a decision"
            }
            Withdrawal::GatewayShutdown => "withdrawn: the gateway is shutting down",
            Withdrawal::SidecarAway => {
                "withdrawn: the gateway stayed away from the operator for too long"
            }
            Withdrawal::SidecarRestarted => {
                "withdrawn: the gateway restarted and the call it held is gone"
            }
            Withdrawal::PodGone => "withdrawn: the agent's pod is gone or has finished",
            Withdrawal::Cancelled => "withdrawn: the agent cancelled the call",
            Withdrawal::SessionEnded => "withdrawn: the agent's session ended",
            Withdrawal::AgentDisconnected => {
                "withdrawn: the agent's connection closed while the call waited"
            }
            Withdrawal::StreamClosed => "withdrawn: the gateway's approval stream closed",
        }
    }

    /// Whether an agent can still receive this outcome (it is waiting for
    /// the call's answer). A cancelled call, an ended session and a pod
    /// that is gone have nobody waiting: those appear in the audit line,
    /// the metric and the Event only.
    pub fn reaches_agent(self) -> bool {
        !matches!(
            self,
            Withdrawal::Cancelled
                | Withdrawal::SessionEnded
                | Withdrawal::AgentDisconnected
                | Withdrawal::PodGone
                | Withdrawal::SidecarRestarted
                | Withdrawal::StreamClosed
        )
    }
}

impl fmt::Display for Withdrawal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that names no withdrawal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a withdrawal reason (one of PolicyChanged, OperatorRefused, OperatorUnreachable, GatewayShutdown, SidecarAway, SidecarRestarted, PodGone, Cancelled, SessionEnded, AgentDisconnected, StreamClosed)"
)]
pub struct UnknownWithdrawal(pub String);

impl FromStr for Withdrawal {
    type Err = UnknownWithdrawal;

    fn from_str(word: &str) -> Result<Withdrawal, UnknownWithdrawal> {
        Withdrawal::ALL
            .into_iter()
            .find(|w| w.as_str() == word)
            .ok_or_else(|| UnknownWithdrawal(word.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_reads_back_and_names_no_person() {
        for w in Withdrawal::ALL {
            assert_eq!(w.as_str().parse::<Withdrawal>(), Ok(w));
            let sentence = w.sentence();
            assert!(sentence.starts_with("withdrawn: "), "{sentence}");
            for person in ["denied", "user", "approver", "person"] {
                assert!(!sentence.contains(person), "{w}: {sentence}");
            }
        }
        assert!("Denied".parse::<Withdrawal>().is_err());
    }
}

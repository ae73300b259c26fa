//! The gRPC contract between the operator and the sidecars it configures.
//!
//! The package is versioned (`aip.config.v1`): a breaking change becomes
//! `v2`, and the operator keeps serving the previous version for sidecars one
//! release behind. Generated code only; no logic lives here.

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("aip.config.v1");
}

/// The audience a sidecar's projected service-account token must carry.
pub const TOKEN_AUDIENCE: &str = "aip.io/sidecar";

/// How long an ask waits for its sidecar to follow it again (on any
/// replica) before the operator withdraws it as `SidecarAway`.
pub const APPROVAL_AWAY_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a sidecar that cannot reach the operator keeps an ask before it
/// answers the agent's call as withdrawn (`OperatorUnreachable`): twice the
/// operator's bound, so that the operator, which may learn of a silent
/// partition only through HTTP/2 keepalive (up to 50 s), has withdrawn the
/// request first and no person can approve a call nobody waits for.
pub const APPROVAL_AWAY_BOUND_SIDECAR: std::time::Duration = std::time::Duration::from_secs(120);

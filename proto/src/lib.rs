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

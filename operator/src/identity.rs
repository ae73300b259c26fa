//! Who a sidecar is: the pod its projected service-account token was issued
//! for, as the gRPC service authenticated it. The approvals code reads it
//! too, so it lives here rather than in either.

use std::time::SystemTime;

/// The pod a token was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub service_account: String,
    /// When the token stops being valid (its `exp`), if it says.
    pub expires: Option<SystemTime>,
}

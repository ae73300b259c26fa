//! Waiting for deadlines that may not exist.

use tokio::time::Instant;

/// Sleeps until `at`, or forever without one (for a `select!` arm whose
/// deadline is optional).
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

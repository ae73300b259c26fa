//! Leader election on a coordination.k8s.io Lease: every replica serves
//! gRPC, only the holder writes status. Optimistic concurrency (the Lease's
//! resourceVersion) decides races; a holder that cannot renew in time steps
//! down before anyone else may take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name).
    pub identity: String,
    pub duration: Duration,
    pub renew_every: Duration,
}

/// Holds or contends for the Lease until `shutdown`, publishing whether this
/// replica leads. On shutdown a held Lease is released at once.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut last_renewed: Option<tokio::time::Instant> = None;
    loop {
        match attempt(&api, &config).await {
            Ok(true) => {
                last_renewed = Some(tokio::time::Instant::now());
                if set(&leader, true) {
                    tracing::info!(lease = %config.name, identity = %config.identity, "leading: writing status");
                }
            }
            Ok(false) => {
                if set(&leader, false) {
                    tracing::info!(lease = %config.name, "no longer leading");
                }
            }
            Err(e) => {
                tracing::warn!(lease = %config.name, error = %crate::errors::Api(&e), "lease not renewed");
                // Step down before the Lease can expire for the others.
                let deadline = config.duration.saturating_sub(config.renew_every);
                if last_renewed.is_none_or(|t| t.elapsed() >= deadline) && set(&leader, false) {
                    tracing::warn!(lease = %config.name, "stepped down: the lease could not be renewed in time");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.renew_every) => {}
            () = shutdown.cancelled() => break,
        }
    }
    if set(&leader, false)
        && let Err(e) = release(&api, &config).await
    {
        tracing::warn!(error = %crate::errors::Api(&e), "lease not released; another replica takes over when it expires");
    }
}

/// One round: create, renew or take over the Lease. Ok(true) when held.
async fn attempt(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let seconds = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let mine = spec.holder_identity.as_deref() == Some(config.identity.as_str());
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(renewed)), Some(d)) => *renewed + SignedDuration::from_secs(d.into()) < now,
        _ => true,
    };
    let vacant = spec.holder_identity.as_deref().is_none_or(str::is_empty);
    if !(mine || expired || vacant) {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(seconds);
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion read above makes this a compare-and-swap.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

/// Sets whether this replica leads; true (and the receivers notified) only
/// on a change, so renewing the lease does not look like gaining it.
fn set(leader: &watch::Sender<bool>, leading: bool) -> bool {
    leader.send_if_modified(|l| std::mem::replace(l, leading) != leading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewing_the_lease_notifies_nobody() {
        let (tx, mut rx) = watch::channel(false);
        assert!(set(&tx, true), "gaining it is news");
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        assert!(!set(&tx, true), "a renewal is not");
        assert!(!rx.has_changed().unwrap_or(true));
        assert!(set(&tx, false));
        assert!(!*rx.borrow_and_update());
    }
}

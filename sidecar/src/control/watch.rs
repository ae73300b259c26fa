//! The configuration stream: each snapshot the operator sends becomes the
//! gateway's Config (validated and compiled here; the sidecar trusts no one
//! to have done it), the last good one is kept while the stream is down
//! (optionally only for a bounded time, then every call is refused), and
//! each snapshot applied or refused is reported.

use std::sync::Arc;

use aip_proto::v1::{self, WatchRequest};
use aip_service::time::sleep_until;
use secrecy::SecretString;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::report::{EvidenceFn, report};
use super::snapshot::from_snapshot_in;
use super::{
    Always, Backoff, Link, OperatorApprovals, OperatorSource, Retry, authorize, read_token,
};
use crate::config::Config;

/// How often the connections' evidence is reported while nothing changes.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// What the source publishes.
pub struct Watched {
    pub config: watch::Receiver<Arc<Config>>,
    /// The snapshot version in force (0: none yet).
    pub version: watch::Receiver<u64>,
    /// Asks go to the operator, which makes ApprovalRequests of them.
    pub approvals: Arc<OperatorApprovals>,
}

/// Starts following the operator. Until the first snapshot arrives the
/// configuration is empty: every tool call is blocked.
pub fn watch(
    source: OperatorSource,
    evidence: watch::Receiver<Option<EvidenceFn>>,
    shutdown: CancellationToken,
) -> anyhow::Result<Watched> {
    let link = Arc::new(Link::new(source.clone())?);
    let (config_tx, config) = watch::channel(Arc::new(Config::empty()));
    let (version_tx, version) = watch::channel(0u64);
    let instance = format!("{:032x}", rand::random::<u128>());
    let approvals = Arc::new(OperatorApprovals {
        link: link.clone(),
        token_file: source.token_file.clone(),
        instance: instance.clone(),
        withdrawals: tokio_util::task::TaskTracker::new(),
    });
    let follower = Follower {
        source,
        instance,
        link,
        config: config_tx,
        version: version_tx,
        evidence,
        shutdown,
    };
    tokio::spawn(follower.run());
    Ok(Watched {
        config,
        version,
        approvals,
    })
}

struct Follower {
    source: OperatorSource,
    /// This process's instance id (see WatchRequest.sidecar_instance).
    instance: String,
    link: Arc<Link>,
    config: watch::Sender<Arc<Config>>,
    version: watch::Sender<u64>,
    evidence: watch::Receiver<Option<EvidenceFn>>,
    shutdown: CancellationToken,
}

impl Follower {
    async fn run(mut self) {
        let mut backoff = Backoff::new();
        // The moment the operator last sent a snapshot.
        let mut last_contact: Option<Instant> = None;
        // Since when the stream has been down (None: up, or never up).
        let mut lost: Option<Instant> = None;
        loop {
            let before = last_contact;
            let result = self.follow(&mut last_contact, &mut lost).await;
            if last_contact != before {
                // The stream worked for a while: start backing off afresh.
                backoff.reset();
            }
            let code = match result {
                Ok(()) => return,
                Err(e) => {
                    let wait = backoff.next_wait();
                    if lost.is_none() {
                        lost = Some(Instant::now());
                        tracing::warn!(error = %e.message(), retry_ms = wait.as_millis() as u64, "configuration stream from the operator lost; keeping the last configuration");
                    } else {
                        tracing::debug!(error = %e.message(), retry_ms = wait.as_millis() as u64, "configuration stream not back yet");
                    }
                    (e.code(), wait)
                }
            };
            if !Always.worth_retrying(code.0) {
                return;
            }
            if code.0 == tonic::Code::ResourceExhausted {
                // That replica serves its maximum: the next attempt goes
                // out on a new connection, which the Service may send to
                // another, after the jittered wait.
                if let Err(e) = self.link.renew() {
                    tracing::warn!(error = %e, "could not open a new connection to the operator");
                }
            }
            let wait = tokio::time::sleep(code.1);
            tokio::pin!(wait);
            loop {
                // Only a configuration that still allows something can go stale.
                let stale_at = match (self.source.max_staleness, last_contact) {
                    (Some(max), Some(at)) if self.config.borrow().policy.is_some() => {
                        Some(at + max)
                    }
                    _ => None,
                };
                tokio::select! {
                    () = &mut wait => break,
                    () = sleep_until(stale_at) => self.fail_closed(),
                    () = self.shutdown.cancelled() => return,
                }
            }
        }
    }

    /// Refuses everything once the last configuration is too old to trust.
    fn fail_closed(&mut self) {
        tracing::error!(
            "the operator has been away longer than --max-staleness; every tool call is refused until it is back"
        );
        self.config.send_replace(Arc::new(Config::empty()));
        self.version.send_replace(0);
    }

    /// One Watch stream, until it ends. Ok only on shutdown. `lost`: since
    /// when the stream has been down, cleared (and said) once it is back.
    async fn follow(
        &mut self,
        last_contact: &mut Option<Instant>,
        lost: &mut Option<Instant>,
    ) -> Result<(), tonic::Status> {
        let token = self.token()?;
        let mut request = tonic::Request::new(WatchRequest {
            sidecar_version: env!("CARGO_PKG_VERSION").to_owned(),
            applied_version: *self.version.borrow(),
            sidecar_instance: self.instance.clone(),
        });
        authorize(&mut request, &token)?;
        // The channel of the moment: trusting the newest bundle handed out.
        let mut client = self.link.client();
        let mut stream = tokio::select! {
            r = client.watch(request) => r?.into_inner(),
            () = self.shutdown.cancelled() => return Ok(()),
        };
        let mut report_tick = tokio::time::interval(REPORT_EVERY);
        report_tick.reset();
        loop {
            let message = tokio::select! {
                m = stream.message() => m?,
                _ = report_tick.tick() => { self.report(&token, String::new()).await; continue; }
                () = self.shutdown.cancelled() => return Ok(()),
            };
            let Some(snapshot) = message else {
                return Err(tonic::Status::unavailable("the operator ended the stream"));
            };
            *last_contact = Some(Instant::now());
            if let Some(since) = lost.take() {
                tracing::info!(
                    away_ms = since.elapsed().as_millis() as u64,
                    version = snapshot.version,
                    "configuration stream from the operator back"
                );
            }
            let refused = match self.apply(&snapshot) {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::error!(version = snapshot.version, error = %e, "configuration from the operator refused; keeping the previous one");
                    e
                }
            };
            self.report(&token, refused).await;
        }
    }

    fn token(&self) -> Result<SecretString, tonic::Status> {
        read_token(&self.source.token_file)
    }

    fn apply(&mut self, snapshot: &v1::Snapshot) -> Result<(), String> {
        // The CAs to trust do not depend on the policy being valid.
        if let Err(e) = self.link.trust(&snapshot.trust_bundle_pem) {
            tracing::error!(error = %e, "CA bundle from the operator refused; trusting the previous one");
        }
        let previous = self.config.borrow().clone();
        let token_dir = self
            .source
            .token_file
            .parent()
            .unwrap_or(std::path::Path::new("."));
        let config = from_snapshot_in(snapshot, &previous, token_dir)?;
        self.config.send_replace(Arc::new(config));
        self.version.send_replace(snapshot.version);
        Ok(())
    }

    async fn report(&mut self, token: &SecretString, refused_reason: String) {
        let connections = self
            .evidence
            .borrow()
            .as_ref()
            .map(|f| f())
            .unwrap_or_default();
        let applied = *self.version.borrow();
        report(
            &mut self.link.client(),
            token,
            applied,
            refused_reason,
            connections,
        )
        .await;
    }
}

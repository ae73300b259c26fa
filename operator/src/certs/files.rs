//! A serving certificate from mounted files (`--tls-cert`, `--tls-key`,
//! `--tls-ca`), as cert-manager or any other issuer writes them into a
//! Secret the kubelet keeps up to date. The files are read again every
//! `POLL`; a renewal signed by a CA the sidecars already trust is served at
//! once, while one signed by a CA they have never been handed waits an
//! overlap with both CAs in the bundle, so that a renewal into a new CA (a
//! self-signed issuer does exactly that) strands no sidecar.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Served, ServedRx, bundle_text, certificates, publish};
use crate::grpc::tls::ServerTls;

/// How often the files are read again (the kubelet itself refreshes a
/// mounted Secret about once a minute).
const POLL: Duration = Duration::from_secs(10);

/// Where the files are.
#[derive(Clone, Debug)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA bundle; without it the serving certificate is its own CA
    /// (self-signed).
    pub ca: Option<PathBuf>,
}

/// One reading of the files.
#[derive(Clone, PartialEq)]
struct Read {
    cert_pem: String,
    key_pem: String,
    cas: Vec<pem::Pem>,
}

impl Files {
    fn read(&self) -> anyhow::Result<Read> {
        let tls = ServerTls::from_files(&self.cert, &self.key)?;
        let bundle = match &self.ca {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("reading the CA bundle {}", path.display()))?,
            None => tls.cert_pem.clone(),
        };
        let cas = certificates(&bundle)
            .with_context(|| format!("the CA bundle of {}", self.cert.display()))?;
        anyhow::ensure!(!cas.is_empty(), "the CA bundle holds no certificate");
        Ok(Read {
            cert_pem: tls.cert_pem.clone(),
            key_pem: tls.key_pem().to_owned(),
            cas,
        })
    }
}

/// Reads the files, serves them, and follows them until `shutdown`.
pub fn start(
    files: Files,
    overlap: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<ServedRx> {
    let follow = Follow::new(files.read()?, overlap);
    let (tx, rx) = watch::channel(Arc::new(follow.served()?));
    tokio::spawn(async move {
        let mut follow = follow;
        loop {
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = shutdown.cancelled() => return,
            }
            match files.read() {
                Ok(read) => follow.read(read, Instant::now()),
                // Mid-update, the kubelet swaps the files at once; a read that
                // failed is tried again at the next poll.
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "could not read the serving certificate files; serving the last good ones"
                ),
            }
            follow.tick(Instant::now());
            match follow.served() {
                Ok(served) => {
                    if publish(&tx, served) {
                        tracing::info!(cert = %files.cert.display(), "serving certificate or CA bundle changed");
                    }
                }
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "the new serving certificate is unusable; serving the last good one"
                ),
            }
        }
    });
    Ok(rx)
}

/// What is served and trusted, across renewals.
struct Follow {
    serving: Read,
    /// Every CA handed out and not yet retired.
    trusted: Vec<pem::Pem>,
    /// A renewal into a new CA, served once its CA has been handed out for
    /// an overlap.
    pending: Option<(Read, Instant)>,
    /// After a switch, the CAs no longer in the files leave the bundle then.
    retire_at: Option<Instant>,
    overlap: Duration,
}

impl Follow {
    fn new(first: Read, overlap: Duration) -> Follow {
        Follow {
            trusted: first.cas.clone(),
            serving: first,
            pending: None,
            retire_at: None,
            overlap,
        }
    }

    fn read(&mut self, read: Read, now: Instant) {
        let pending = self.pending.as_ref().map(|(r, _)| r);
        if read == self.serving || Some(&read) == pending {
            return;
        }
        let new: Vec<pem::Pem> = read
            .cas
            .iter()
            .filter(|ca| !self.trusted.contains(ca))
            .cloned()
            .collect();
        if new.is_empty() {
            // Every CA of this renewal has been handed out before.
            self.serving = read;
            self.pending = None;
            return;
        }
        tracing::info!(overlap = %humantime::format_duration(self.overlap), "the serving certificate was renewed into a new CA: handing out both CAs before serving it");
        self.trusted.extend(new);
        self.pending = Some((read, now + self.overlap));
    }

    fn tick(&mut self, now: Instant) {
        if let Some((_, at)) = &self.pending
            && *at <= now
            && let Some((read, _)) = self.pending.take()
        {
            self.serving = read;
            self.retire_at = Some(now + self.overlap);
        }
        if self.retire_at.is_some_and(|at| at <= now) && self.pending.is_none() {
            self.trusted = self.serving.cas.clone();
            self.retire_at = None;
        }
    }

    fn served(&self) -> anyhow::Result<Served> {
        Served::new(
            ServerTls::from_pem(self.serving.cert_pem.clone(), self.serving.key_pem.clone()),
            bundle_text(&self.trusted),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn self_signed(name: &str) -> Read {
        let tls = ServerTls::self_signed(&[name.to_owned()]).unwrap();
        Read {
            cas: certificates(&tls.cert_pem).unwrap(),
            cert_pem: tls.cert_pem.clone(),
            key_pem: tls.key_pem().to_owned(),
        }
    }

    /// cert-manager's self-signed issuer renews into a new CA: both CAs are
    /// handed out for an overlap before the new certificate is served, and
    /// the old one leaves the bundle an overlap after that.
    #[test]
    fn a_renewal_into_a_new_ca_waits_an_overlap_with_both_trusted() {
        let overlap = Duration::from_secs(60);
        let t0 = Instant::now();
        let (old, new) = (self_signed("a"), self_signed("a"));
        let mut follow = Follow::new(old.clone(), overlap);
        follow.read(new.clone(), t0);
        follow.tick(t0);
        let served = follow.served().unwrap();
        assert_eq!(
            served.tls.cert_pem, old.cert_pem,
            "the old one is still served"
        );
        assert_eq!(
            certificates(&served.bundle_pem).unwrap(),
            [old.cas.clone(), new.cas.clone()].concat()
        );

        // Read again and again meanwhile: nothing moves early.
        follow.read(new.clone(), t0 + Duration::from_secs(30));
        follow.tick(t0 + Duration::from_secs(59));
        assert_eq!(follow.served().unwrap().tls.cert_pem, old.cert_pem);

        follow.tick(t0 + overlap);
        let served = follow.served().unwrap();
        assert_eq!(served.tls.cert_pem, new.cert_pem);
        assert_eq!(
            certificates(&served.bundle_pem).unwrap().len(),
            2,
            "both, for another overlap"
        );
        follow.tick(t0 + overlap * 2);
        assert_eq!(
            certificates(&follow.served().unwrap().bundle_pem).unwrap(),
            new.cas
        );
    }

    /// A renewal by the same CA (cert-manager's CA issuer, the chart's
    /// default) is served at once.
    #[test]
    fn a_renewal_by_a_trusted_ca_is_served_at_once() {
        let t0 = Instant::now();
        let first = self_signed("a");
        let mut follow = Follow::new(first.clone(), Duration::from_secs(60));
        let renewed = Read {
            cert_pem: self_signed("a").cert_pem,
            ..first.clone()
        };
        follow.read(renewed.clone(), t0);
        follow.tick(t0);
        let served = follow.served().unwrap();
        assert_eq!(served.tls.cert_pem, renewed.cert_pem);
        assert_eq!(certificates(&served.bundle_pem).unwrap(), first.cas);
    }
}

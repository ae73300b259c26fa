//! The sidecar's client of the operator (Kubernetes mode), shaped like
//! linkerd2-proxy's watch client: the configuration stream kept as a watch
//! channel that holds the last good value while it reconnects (`watch`),
//! reports of what was applied and what the connections showed (`report`),
//! and asks turned into ApprovalRequests (`approvals`). Every call carries
//! the pod's projected token, read afresh each time (the kubelet rotates
//! it); one backoff and one rule for which gRPC codes are worth retrying
//! serve them all. The CAs trusted for the operator are those it hands out
//! on the stream (`Link`): a rotation of its certificate strands no sidecar.

mod approvals;
mod link;
mod report;
mod snapshot;
mod watch;

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint as GrpcEndpoint};

pub use approvals::OperatorApprovals;
pub use link::Link;
pub use report::{EvidenceFn, evidence_of};
pub use snapshot::{connection, from_snapshot};
pub use watch::{Watched, watch};

/// Where the operator is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct OperatorSource {
    /// `https://HOST:PORT` of the operator's gRPC service.
    pub url: String,
    /// The CAs that signed the operator's certificate.
    pub ca: OperatorCa,
    /// Where the newest bundle the operator handed out is kept.
    pub ca_cache: Option<PathBuf>,
    /// Verify the operator's certificate for this name instead of the URL's
    /// host.
    pub server_name: Option<String>,
    /// The projected token; read again at every connection, since the
    /// kubelet rotates it.
    pub token_file: PathBuf,
    /// After this long without the operator, every tool call is refused.
    pub max_staleness: Option<Duration>,
}

/// Where the operator's CA bundle comes from.
#[derive(Debug, Clone)]
pub enum OperatorCa {
    /// A PEM file (a mounted ConfigMap or Secret).
    File(PathBuf),
    /// The PEM itself (the injector puts it in the environment, so the pod
    /// needs no extra object in its namespace).
    Pem(String),
}

impl OperatorCa {
    pub(crate) fn pem(&self) -> anyhow::Result<String> {
        match self {
            OperatorCa::File(path) => std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!(
                    "cannot read the operator CA {}: {}",
                    path.display(),
                    e.kind()
                )
            }),
            OperatorCa::Pem(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => Ok(pem.clone()),
            OperatorCa::Pem(_) => anyhow::bail!(
                "the operator CA given inline (--operator-ca-pem) holds no PEM certificate"
            ),
        }
    }
}

/// A channel to the operator that trusts `bundle` (PEM); it connects at its
/// first use.
fn channel(source: &OperatorSource, bundle: &str) -> anyhow::Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(bundle));
    if let Some(name) = &source.server_name {
        tls = tls.domain_name(name.clone());
    }
    if !source.url.starts_with("https://") {
        anyhow::bail!("--operator must be an https:// URL, found {:?}", source.url);
    }
    Ok(GrpcEndpoint::from_shared(source.url.clone())?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// Which failures of a call to the operator are worth trying again: the
/// operator may come back, a network may heal, a token may be rotated. A
/// request the operator understood and refused is not.
pub trait Retry {
    fn worth_retrying(&self, code: Code) -> bool;
}

/// The configuration stream never gives up: without it the pod has no
/// future configuration at all.
pub struct Always;

impl Retry for Always {
    fn worth_retrying(&self, _: Code) -> bool {
        true
    }
}

/// An approval request the operator refused outright (no such policy rule,
/// a malformed request, this pod may not ask, an operator without
/// approvals) fails its call; anything else is resumed.
pub struct UnlessRefused;

impl Retry for UnlessRefused {
    fn worth_retrying(&self, code: Code) -> bool {
        !matches!(
            code,
            Code::FailedPrecondition
                | Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unimplemented
        )
    }
}

/// Exponential backoff from 200 ms to 15 s, with up to a quarter of jitter
/// so that sidecars restarted together do not reconnect in lockstep.
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(15);

    pub fn new() -> Backoff {
        Backoff::up_to(Self::MAX)
    }

    /// The same, waiting at most `max` (plus jitter) between attempts.
    pub fn up_to(max: Duration) -> Backoff {
        Backoff {
            next: Self::FIRST,
            max: max.max(Self::FIRST),
        }
    }

    /// After a success: the next failure waits the least again.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// The wait before the next attempt (and doubles the one after).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next + self.next.mul_f64(rand::random::<f64>() / 4.0);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The wait the next attempt would take, before any jitter.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

fn authorize<T>(
    request: &mut tonic::Request<T>,
    token: &SecretString,
) -> Result<(), tonic::Status> {
    let value = format!("Bearer {}", token.expose_secret())
        .parse()
        .map_err(|_| {
            tonic::Status::unauthenticated("the token holds characters a header cannot")
        })?;
    request.metadata_mut().insert("authorization", value);
    Ok(())
}

/// The projected token, read afresh (the kubelet rotates it).
fn read_token(path: &Path) -> Result<SecretString, tonic::Status> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(SecretString::from(t.trim().to_owned())),
        Ok(_) => Err(tonic::Status::unauthenticated(format!(
            "the token file {} is empty",
            path.display()
        ))),
        Err(e) => Err(tonic::Status::unauthenticated(format!(
            "cannot read the token file {}: {}",
            path.display(),
            e.kind()
        ))),
    }
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn a_capped_backoff_never_waits_past_its_cap_and_its_jitter() {
        let mut backoff = Backoff::up_to(Duration::from_secs(2));
        let waits: Vec<Duration> = (0..10).map(|_| backoff.next_wait()).collect();
        assert!(waits[0] >= Duration::from_millis(200), "{waits:?}");
        assert!(
            waits.iter().all(|w| *w <= Duration::from_millis(2500)),
            "{waits:?}"
        );
        assert_eq!(backoff.peek(), Duration::from_secs(2));
        assert_eq!(Backoff::new().peek(), Duration::from_millis(200));
    }
}

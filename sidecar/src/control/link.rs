//! The connection to the operator and the CAs it trusts. The pod spec holds
//! the bundle of the pod's creation; the operator hands out a newer one on
//! the configuration stream ahead of serving a certificate of a new CA, so
//! the channel is remade with each bundle (calls under way finish on the old
//! one) and the bundle is kept in a file that outlives a restart of this
//! container. Who vouches for a new bundle is the operator, over a
//! connection the previous bundle verified.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use aip_proto::v1::config_client::ConfigClient;
use aip_service::sync::lock;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::Channel;

use super::{OperatorSource, channel};

/// The most CA text a bundle may hold.
const MAX_BUNDLE: usize = 256 * 1024;

pub struct Link {
    source: OperatorSource,
    /// The channel, and the bundle it trusts.
    current: Mutex<(Channel, String)>,
}

impl Link {
    /// Trusts the configured bundle and, if one was kept, the newest one the
    /// operator handed out before this process started.
    pub fn new(source: OperatorSource) -> anyhow::Result<Link> {
        let mut bundle = source.ca.pem()?;
        if let Some(kept) = source.ca_cache.as_deref().and_then(read_kept) {
            bundle.push('\n');
            bundle.push_str(&kept);
        }
        let channel = channel(&source, &bundle)?;
        Ok(Link {
            source,
            current: Mutex::new((channel, bundle)),
        })
    }

    /// A client on the channel of the moment.
    pub fn client(&self) -> ConfigClient<Channel> {
        ConfigClient::new(lock(&self.current).0.clone())
    }

    /// A new connection from the next call on, trusting the same CAs: an
    /// operator replica that serves its maximum refused this one, and the
    /// Service may send the next to a replica with room. Calls under way
    /// finish on the old one.
    pub fn renew(&self) -> anyhow::Result<()> {
        let mut current = lock(&self.current);
        current.0 = channel(&self.source, &current.1)?;
        Ok(())
    }

    /// Trusts `bundle` from the next connection on (a bundle that holds no
    /// certificate is refused, and the previous one kept); true if it is new.
    pub fn trust(&self, bundle: &str) -> Result<bool, String> {
        if bundle.is_empty() || lock(&self.current).1 == bundle {
            return Ok(false);
        }
        let count = certificates(bundle)?;
        let channel = channel(&self.source, bundle).map_err(|e| format!("{e:#}"))?;
        *lock(&self.current) = (channel, bundle.to_owned());
        // Kept first: once the line below is logged, a restart trusts it.
        if let Some(path) = &self.source.ca_cache
            && let Err(e) = keep(path, bundle)
        {
            tracing::warn!(file = %path.display(), error = %e, "could not keep the operator's CA bundle; a restart of this container would trust only the one it was started with");
        }
        tracing::info!(
            certificates = count,
            "trusting the CA bundle the operator handed out"
        );
        Ok(true)
    }
}

/// How many certificates `bundle` holds (at least one, all well formed).
fn certificates(bundle: &str) -> Result<usize, String> {
    if bundle.len() > MAX_BUNDLE {
        return Err(format!(
            "the operator's CA bundle is over {MAX_BUNDLE} bytes"
        ));
    }
    let certs = CertificateDer::pem_slice_iter(bundle.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the operator's CA bundle is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("the operator's CA bundle holds no certificate".to_owned());
    }
    Ok(certs.len())
}

/// The bundle kept by an earlier run of this container, if it is usable.
fn read_kept(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    match certificates(&text) {
        Ok(_) => Some(text),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring the kept CA bundle");
            None
        }
    }
}

/// Writes `bundle` to `path` whole or not at all.
fn keep(path: &PathBuf, bundle: &str) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bundle)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::control::OperatorCa;

    fn ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::new(vec!["a".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem()
    }

    fn source(dir: &Path, given: &str) -> OperatorSource {
        OperatorSource {
            url: "https://127.0.0.1:1".to_owned(),
            ca: OperatorCa::Pem(given.to_owned()),
            ca_cache: Some(dir.join("operator-ca.crt")),
            server_name: None,
            token_file: dir.join("token"),
            max_staleness: None,
        }
    }

    /// A bundle handed out is kept, and a restarted sidecar trusts it
    /// beside the one it was started with; nonsense is refused and changes
    /// nothing.
    #[tokio::test]
    async fn a_handed_out_bundle_is_kept_across_a_restart() {
        let tmp = tempfile::Builder::new()
            .prefix("aip-link-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let (given, rotated) = (ca(), format!("{}{}", ca(), ca()));
        let link = Link::new(source(dir, &given)).unwrap();
        assert_eq!(lock(&link.current).1, given);
        assert!(link.trust(&rotated).unwrap());
        assert!(!link.trust(&rotated).unwrap(), "the same bundle again");
        assert_eq!(
            std::fs::read_to_string(dir.join("operator-ca.crt")).unwrap(),
            rotated
        );
        let e = link.trust("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
        assert!(e.unwrap_err().contains("not PEM"));
        assert_eq!(
            link.trust("no certificate at all"),
            Err("the operator's CA bundle holds no certificate".to_owned())
        );
        assert_eq!(lock(&link.current).1, rotated);

        let restarted = Link::new(source(dir, &given)).unwrap();
        assert_eq!(lock(&restarted.current).1, format!("{given}\n{rotated}"));
    }
}

//! The operator's serving certificate and the CA bundle that everything
//! talking to it trusts. Three sources — a CA the operator makes and rotates
//! in a Secret (`made`), mounted files such as cert-manager's (`files`), a
//! fixed pair (dev mode, tests) — and one shape: a watch channel of what to
//! serve now. The TLS listeners read it at every handshake, the config
//! streams hand its bundle to the sidecars, and the webhook configurations'
//! caBundles follow it, so a rotation reaches all of them without a restart
//! and without recreating a pod.

pub mod files;
pub mod made;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use made::{Lifetimes, Material, ensure};

use crate::grpc::tls::ServerTls;

/// What the operator serves now.
pub struct Served {
    /// The certificate and key the listeners present.
    pub tls: ServerTls,
    key: Arc<CertifiedKey>,
    /// Every CA a client is to trust now (PEM, one or more certificates):
    /// across a rotation both the old CA and the new one.
    pub bundle_pem: String,
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Served")
            .field("certificate", &self.tls.cert_pem)
            .field("bundle", &self.bundle_pem)
            .finish_non_exhaustive()
    }
}

/// The current `Served`, as every listener and stream follows it.
pub type ServedRx = watch::Receiver<Arc<Served>>;

impl Served {
    pub fn new(tls: ServerTls, bundle_pem: String) -> anyhow::Result<Served> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .context("the serving certificate is not PEM")?;
        anyhow::ensure!(
            !certs.is_empty(),
            "the serving certificate file holds no certificate"
        );
        let key = PrivateKeyDer::from_pem_slice(tls.key_pem().as_bytes())
            .context("the serving key is not a PEM private key")?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .context("the serving key is of a kind rustls cannot sign with")?;
        anyhow::ensure!(
            bundle_pem.contains("-----BEGIN CERTIFICATE-----"),
            "the CA bundle holds no PEM certificate"
        );
        Ok(Served {
            key: Arc::new(CertifiedKey::new(certs, signer)),
            tls,
            bundle_pem,
        })
    }

    /// A channel that never changes (dev mode, tests).
    pub fn fixed(tls: ServerTls, bundle_pem: String) -> anyhow::Result<ServedRx> {
        let (tx, rx) = watch::channel(Arc::new(Served::new(tls, bundle_pem)?));
        // A receiver whose sender is gone still reads its last value.
        drop(tx);
        Ok(rx)
    }

    /// Same certificate and same bundle: nothing for anyone to do.
    fn same_as(&self, other: &Served) -> bool {
        self.tls.cert_pem == other.tls.cert_pem && self.bundle_pem == other.bundle_pem
    }
}

/// Publishes `next` unless it is what is served already.
fn publish(tx: &watch::Sender<Arc<Served>>, next: Served) -> bool {
    tx.send_if_modified(|current| {
        if current.same_as(&next) {
            return false;
        }
        *current = Arc::new(next);
        true
    })
}

/// Hands rustls the certificate served at the moment of each handshake.
struct Current(ServedRx);

impl fmt::Debug for Current {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the operator's current serving certificate")
    }
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.borrow().key.clone())
    }
}

/// A rustls server configuration that always presents what `served` holds,
/// offering the given ALPN protocols.
pub fn server_config(
    served: &ServedRx,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Current(served.clone())));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Keeps the bundle `served` holds in the named configurations' caBundles
/// until `shutdown`: at once when it changes, and every 30 s besides, since
/// the configurations may not exist yet when the operator starts and an
/// upgrade of the chart that installed them may empty the bundles again.
pub async fn keep_ca_bundles(
    client: kube::Client,
    mut served: ServedRx,
    mutating: Vec<String>,
    validating: Vec<String>,
    shutdown: CancellationToken,
) {
    if mutating.is_empty() && validating.is_empty() {
        return;
    }
    loop {
        let bundle = served.borrow_and_update().bundle_pem.clone();
        if let Err(e) = patch_ca_bundles(&client, &bundle, &mutating, &validating).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "caBundle not written yet; retrying"
            );
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(30)) => {}
            changed = served.changed() => if changed.is_err() {
                // A fixed certificate: only the periodic rewrite is left.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(30)) => {}
                    () = shutdown.cancelled() => return,
                }
            },
            () = shutdown.cancelled() => return,
        }
    }
}

/// Writes `ca_pem` into every webhook's caBundle in the named mutating and
/// validating configurations (only where it differs).
pub async fn patch_ca_bundles(
    client: &kube::Client,
    ca_pem: &str,
    mutating: &[String],
    validating: &[String],
) -> anyhow::Result<()> {
    // Both kinds hold `webhooks[].clientConfig.caBundle`: one code path, as
    // untyped objects.
    let kinds = [
        (
            ApiResource::erase::<MutatingWebhookConfiguration>(&()),
            mutating,
        ),
        (
            ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
            validating,
        ),
    ];
    let encoded = serde_json::to_value(ByteString(ca_pem.as_bytes().to_vec()))?;
    for (kind, names) in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind);
        for name in names {
            let current = api
                .get(name)
                .await
                .with_context(|| format!("reading {} {name}", kind.kind))?;
            let hooks = current.data["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ops: Vec<serde_json::Value> = hooks
                .iter()
                .enumerate()
                .filter(|(_, h)| h["clientConfig"]["caBundle"] != encoded)
                .map(|(i, _)| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}))
                .collect();
            if ops.is_empty() {
                continue;
            }
            let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))?;
            api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .with_context(|| format!("writing the caBundle of {} {name}", kind.kind))?;
            tracing::info!(configuration = %name, kind = %kind.kind, "caBundle written");
        }
    }
    Ok(())
}

/// The certificates of a PEM bundle, each as its own PEM text, in order and
/// without repeats.
fn certificates(bundle_pem: &str) -> anyhow::Result<Vec<pem::Pem>> {
    let mut out: Vec<pem::Pem> = Vec::new();
    for block in pem::parse_many(bundle_pem).context("the CA bundle is not PEM")? {
        if block.tag() == "CERTIFICATE" && !out.iter().any(|p| p.contents() == block.contents()) {
            out.push(block);
        }
    }
    Ok(out)
}

/// A bundle's PEM text.
fn bundle_text(certs: &[pem::Pem]) -> String {
    pem::encode_many_config(
        certs,
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// When a certificate (DER) starts and stops being valid.
fn validity(der: &[u8]) -> anyhow::Result<(SystemTime, SystemTime)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| anyhow::anyhow!("not an X.509 certificate: {e}"))?;
    let at = |t: x509_parser::time::ASN1Time| {
        u64::try_from(t.timestamp())
            .ok()
            .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s)))
            .context("a certificate time out of range")
    };
    Ok((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
}

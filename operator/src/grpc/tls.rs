//! A TLS identity as PEM text: a certificate and key from mounted files, made
//! by the operator (`certs`), or, in dev mode, a self-signed pair made at
//! start (written out so sidecars and tests can trust it).

use std::path::Path;

use anyhow::Context;

#[derive(Clone)]
pub struct ServerTls {
    pub cert_pem: String,
    key_pem: String,
}

impl ServerTls {
    pub fn from_files(cert: &Path, key: &Path) -> anyhow::Result<ServerTls> {
        let cert_pem = std::fs::read_to_string(cert)
            .with_context(|| format!("reading the gRPC certificate {}", cert.display()))?;
        let key_pem = std::fs::read_to_string(key)
            .with_context(|| format!("reading the gRPC key {}", key.display()))?;
        Ok(ServerTls { cert_pem, key_pem })
    }

    /// A certificate and key given as PEM text.
    pub fn from_pem(cert_pem: String, key_pem: String) -> ServerTls {
        ServerTls { cert_pem, key_pem }
    }

    /// The key as PEM (for storing it in the operator's own TLS Secret).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A self-signed certificate for `names` (DNS names or IP addresses).
    pub fn self_signed(names: &[String]) -> anyhow::Result<ServerTls> {
        let key = rcgen::KeyPair::generate().context("generating a TLS key")?;
        let mut params = rcgen::CertificateParams::new(names.to_vec())
            .context("the gRPC certificate's names")?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "aip-operator (self-signed)");
        let cert = params.self_signed(&key).context("self-signing")?;
        Ok(ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The same identity for the HTTPS webhook server.
    pub fn rustls(&self) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
        crate::webhooks::tls_config(&self.cert_pem, &self.key_pem)
    }
}

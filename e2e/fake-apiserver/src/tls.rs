//! HTTPS as clients expect it from a cluster: a self-signed CA written out
//! for kubeconfigs, and a serving certificate for localhost and 127.0.0.1.
//! (kubectl does not send bearer tokens over plain HTTP.)

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The CA clients trust, and the server's TLS configuration.
pub struct Pki {
    pub ca_pem: String,
    pub config: Arc<rustls::ServerConfig>,
}

pub fn pki() -> Result<Pki, String> {
    let failed = |e: rcgen::Error| format!("cannot make certificates: {e}");
    let ca_key = KeyPair::generate().map_err(failed)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "aip-fake-apiserver CA");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(failed)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(failed)?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let cert = CertificateParams::new(names)
        .map_err(failed)?
        .signed_by(&key, &issuer)
        .map_err(failed)?;
    let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .map_err(|e| format!("key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        config: Arc::new(config),
    })
}

//! The control plane's certificates and keys, made fresh for every start:
//! nothing is shared between test runs or checked in.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Names in the API server's serving certificate: loopback for tests, and
/// the in-cluster names (and the `kubernetes` Service's address in
/// 10.96.0.0/16) so that a client configured as in a pod verifies it too.
const SERVING_NAMES: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

pub(crate) struct Pki {
    /// The CA clients trust for the API server (`ca.crt`; also what the
    /// root CA publisher puts in every namespace's `kube-root-ca.crt`).
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    /// The CA the API server trusts for client certificates.
    pub client_ca_pem: String,
    /// The controller manager's client certificate (group
    /// `system:masters`).
    pub controller_manager_cert_pem: String,
    pub controller_manager_key_pem: String,
    /// ECDSA P-256 (ES256): the service-account token signing key, and
    /// its public half that verifies tokens.
    pub service_account_key_pem: String,
    pub service_account_public_pem: String,
}

pub(crate) fn generate() -> Result<Pki, rcgen::Error> {
    let (ca_pem, ca) = authority("aip-kube-test apiserver CA")?;
    let (client_ca_pem, client_ca) = authority("aip-kube-test client CA")?;

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(
        SERVING_NAMES
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<Vec<_>>(),
    )?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let manager_key = KeyPair::generate()?;
    let mut manager = CertificateParams::new(Vec::<String>::new())?;
    manager
        .distinguished_name
        .push(DnType::CommonName, "system:kube-controller-manager");
    manager
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    manager.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    manager.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let manager_cert = manager.signed_by(&manager_key, &client_ca)?;

    let service_account_key = KeyPair::generate()?;

    Ok(Pki {
        ca_pem,
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        client_ca_pem,
        controller_manager_cert_pem: manager_cert.pem(),
        controller_manager_key_pem: manager_key.serialize_pem(),
        service_account_public_pem: service_account_key.public_key_pem(),
        service_account_key_pem: service_account_key.serialize_pem(),
    })
}

/// A self-signed CA: its certificate (PEM) and what signs with it.
fn authority(name: &str) -> Result<(String, Issuer<'static, KeyPair>), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

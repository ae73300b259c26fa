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
    /// A node's certificates, when the control plane has one.
    pub node: Option<NodePki>,
}

/// What a node needs besides the control plane's own: the kubelet's
/// serving certificate (signed by the API server's CA, which the API server
/// is told to trust for kubelets), the kubelet's client certificate
/// (`system:node:NAME` in `system:nodes`, which the Node authorizer
/// knows), and the API server's client certificate for the kubelet (logs,
/// exec).
pub(crate) struct NodePki {
    pub kubelet_serving_cert_pem: String,
    pub kubelet_serving_key_pem: String,
    pub kubelet_client_cert_pem: String,
    pub kubelet_client_key_pem: String,
    pub apiserver_kubelet_client_cert_pem: String,
    pub apiserver_kubelet_client_key_pem: String,
}

/// The node a control plane is made for: its name and address.
#[derive(Clone, Copy)]
pub(crate) struct NodeIdentity<'a> {
    pub name: &'a str,
    pub address: &'a str,
}

pub(crate) fn generate(node: Option<NodeIdentity<'_>>) -> Result<Pki, rcgen::Error> {
    let (ca_pem, ca) = authority("aip-kube-test apiserver CA")?;
    let (client_ca_pem, client_ca) = authority("aip-kube-test client CA")?;

    let serving_key = KeyPair::generate()?;
    let mut names: Vec<String> = SERVING_NAMES.iter().map(|n| (*n).to_owned()).collect();
    if let Some(node) = &node {
        names.push(node.address.to_owned());
    }
    let mut serving = CertificateParams::new(names)?;
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

    let node = match node {
        Some(node) => {
            let serving = leaf(
                &ca,
                vec![node.address.to_owned(), node.name.to_owned()],
                node.name,
                None,
                ExtendedKeyUsagePurpose::ServerAuth,
            )?;
            let client = leaf(
                &client_ca,
                Vec::new(),
                &format!("system:node:{}", node.name),
                Some("system:nodes"),
                ExtendedKeyUsagePurpose::ClientAuth,
            )?;
            let apiserver = leaf(
                &client_ca,
                Vec::new(),
                "kube-apiserver-kubelet-client",
                Some("system:masters"),
                ExtendedKeyUsagePurpose::ClientAuth,
            )?;
            Some(NodePki {
                kubelet_serving_cert_pem: serving.0,
                kubelet_serving_key_pem: serving.1,
                kubelet_client_cert_pem: client.0,
                kubelet_client_key_pem: client.1,
                apiserver_kubelet_client_cert_pem: apiserver.0,
                apiserver_kubelet_client_key_pem: apiserver.1,
            })
        }
        None => None,
    };

    Ok(Pki {
        node,
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

/// A certificate signed by `issuer`, and its key (PEM both).
fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: Vec<String>,
    common_name: &str,
    organization: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
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

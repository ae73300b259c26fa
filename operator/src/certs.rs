//! Certificates the operator makes for itself when no cert-manager (or
//! other) certificate is mounted: a CA and a serving certificate for the
//! Service's DNS names, kept in a Secret of the operator's namespace so that
//! every replica and every restart serves the same one (injected sidecars
//! trust the CA for as long as they live). The CA's key is thrown away once
//! it has signed: nothing can sign with it later. The CA is then written into
//! the caBundle of the webhook configurations the chart installed.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::grpc::tls::ServerTls;

/// The Secret's keys (those of kubernetes.io/tls, plus the CA).
const CA: &str = "ca.crt";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
/// Ten years: a serving certificate that expires under running pods would
/// cut them off from their configuration.
const VALID_DAYS: i64 = 3650;

/// The serving identity and the CA that signed it.
pub struct Material {
    pub tls: ServerTls,
    pub ca_pem: String,
}

/// The certificate in Secret `name` of `namespace`, made (for `dns_names`)
/// if there is none yet; replicas racing to make it all end up with the one
/// that was created first.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    dns_names: &[String],
) -> anyhow::Result<Material> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(found) = api.get_opt(name).await.context("reading the TLS Secret")? {
        return material(&found).with_context(|| format!("Secret {namespace}/{name}"));
    }
    let made = generate(dns_names)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "aip-operator".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (CA.to_owned(), ByteString(made.ca_pem.clone().into_bytes())),
            (
                CERT.to_owned(),
                ByteString(made.tls.cert_pem.clone().into_bytes()),
            ),
            (
                KEY.to_owned(),
                ByteString(made.tls.key_pem().as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(namespace, secret = name, names = ?dns_names, "made the operator's CA and serving certificate");
            Ok(made)
        }
        // Another replica made it first: serve that one.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let found = api.get(name).await.context("reading the TLS Secret")?;
            material(&found)
        }
        Err(e) => Err(e).context("creating the TLS Secret"),
    }
}

fn material(secret: &Secret) -> anyhow::Result<Material> {
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| -> anyhow::Result<String> {
        let bytes = data.get(key).with_context(|| {
            format!("has no {key}: delete it and restart the operator to make a new one")
        })?;
        String::from_utf8(bytes.0.clone()).with_context(|| format!("{key} is not PEM text"))
    };
    Ok(Material {
        tls: ServerTls::from_pem(text(CERT)?, text(KEY)?),
        ca_pem: text(CA)?,
    })
}

/// A CA and a serving certificate it signed for `dns_names`.
fn generate(dns_names: &[String]) -> anyhow::Result<Material> {
    let now = time::OffsetDateTime::now_utc();
    let until = now + time::Duration::days(VALID_DAYS);
    let ca_key = rcgen::KeyPair::generate().context("generating the CA key")?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "aip-operator CA");
    (ca.not_before, ca.not_after) = (now, until);
    let ca_cert = ca.self_signed(&ca_key).context("self-signing the CA")?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().context("generating the serving key")?;
    let mut serving = rcgen::CertificateParams::new(dns_names.to_vec())
        .context("the serving certificate's names")?;
    serving
        .distinguished_name
        .push(rcgen::DnType::CommonName, "aip-operator");
    serving.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    (serving.not_before, serving.not_after) = (now, until);
    let cert = serving
        .signed_by(&key, &issuer)
        .context("signing the serving certificate")?;
    Ok(Material {
        tls: ServerTls::from_pem(cert.pem(), key.serialize_pem()),
        ca_pem: ca_cert.pem(),
    })
}

/// Keeps `ca_pem` in the named configurations' caBundles until `shutdown`:
/// they may not exist yet when the operator starts, and an upgrade of the
/// chart that installed them may empty the bundles again.
pub async fn keep_ca_bundles(
    client: kube::Client,
    ca_pem: String,
    mutating: Vec<String>,
    validating: Vec<String>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    if mutating.is_empty() && validating.is_empty() {
        return;
    }
    loop {
        if let Err(e) = patch_ca_bundles(&client, &ca_pem, &mutating, &validating).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "caBundle not written yet; retrying"
            );
        }
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(30)) => {}
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_serving_certificate_verifies_against_the_ca_for_its_names() {
        let made = generate(&["aip-operator.aip-system.svc".to_owned()]).unwrap();
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for ca in rustls_pki_types::CertificateDer::pem_slice_iter(made.ca_pem.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let chain: Vec<_> =
            rustls_pki_types::CertificateDer::pem_slice_iter(made.tls.cert_pem.as_bytes())
                .map(Result::unwrap)
                .collect();
        let name = rustls_pki_types::ServerName::try_from("aip-operator.aip-system.svc").unwrap();
        let now = rustls_pki_types::UnixTime::now();
        verifier
            .verify_server_cert(&chain[0], &[], &name, &[], now)
            .unwrap();
        let other = rustls_pki_types::ServerName::try_from("evil.example").unwrap();
        assert!(
            verifier
                .verify_server_cert(&chain[0], &[], &other, &[], now)
                .is_err()
        );
    }
}

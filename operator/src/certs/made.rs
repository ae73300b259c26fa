//! A CA the operator makes for itself when no certificate is mounted, kept
//! in a Secret of its namespace so that every replica and every restart
//! serves the same one, and rotated before it expires without stranding a
//! sidecar. A CA's key is thrown away once it has signed: nothing can sign
//! with it later, so each rotation makes a new CA as well as a new serving
//! certificate, in three steps written to the Secret:
//!
//! 1. *stage* (two thirds into the serving certificate's life): a new CA and
//!    a serving certificate it signed go in beside the current ones, the
//!    bundle (`ca.crt`) holds both CAs, and `aip.io/promote-at` says when
//!    the new certificate will be served. Sidecars and webhooks are handed
//!    the two-CA bundle at once, while the old certificate is still served.
//! 2. *promote* (an overlap later): the new certificate is served.
//! 3. *retire* (when the old CA expires): it leaves the bundle.
//!
//! Every step is a write conditioned on the Secret's resourceVersion, so
//! replicas racing to make one agree on the first write; each replica serves
//! what the Secret says, so a restart mid-rotation changes nothing.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Served, ServedRx, bundle_text, certificates, publish, validity};
use crate::grpc::tls::ServerTls;

/// The Secret's keys (those of kubernetes.io/tls, the CA bundle, and the
/// staged certificate of a rotation under way).
const CA: &str = "ca.crt";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const NEXT_CERT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
/// When the staged certificate is to be served (RFC 3339).
const PROMOTE_AT: &str = "aip.io/promote-at";
/// The longest a replica goes without re-reading the Secret, so that it
/// follows the steps another replica wrote.
const RECHECK: Duration = Duration::from_secs(30);

/// How long a made certificate lives, and how long before a new CA is
/// served it is handed out beside the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    pub validity: Duration,
    pub overlap: Duration,
}

impl Lifetimes {
    pub const DEFAULT: Lifetimes = Lifetimes {
        validity: Duration::from_secs(365 * 24 * 3600),
        overlap: Duration::from_secs(24 * 3600),
    };

    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.validity >= Duration::from_secs(6),
            "--tls-validity must be at least 6s"
        );
        // Staged at two thirds, the new certificate must be served before
        // the old one expires, with room to spare.
        anyhow::ensure!(
            self.overlap * 6 <= self.validity,
            "--tls-overlap ({}) must be at most a sixth of --tls-validity ({})",
            humantime::format_duration(self.overlap),
            humantime::format_duration(self.validity)
        );
        Ok(())
    }
}

/// The serving identity and the CA bundle to trust (as the Secret holds it
/// now).
pub struct Material {
    pub tls: ServerTls,
    pub ca_pem: String,
}

/// The certificate in Secret `name` of `namespace`, made (for `dns_names`,
/// with the default lifetimes) if there is none yet; replicas racing to make
/// it all end up with the one that was created first.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    dns_names: &[String],
) -> anyhow::Result<Material> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let stored = ensure_stored(&api, namespace, name, dns_names, Lifetimes::DEFAULT).await?;
    Ok(Material {
        ca_pem: bundle_text(&stored.bundle),
        tls: stored.tls,
    })
}

/// Ensures the Secret, publishes what it holds, and follows it (rotating
/// when the time comes) until `shutdown`.
pub async fn start(
    client: kube::Client,
    namespace: String,
    name: String,
    dns_names: Vec<String>,
    lifetimes: Lifetimes,
    shutdown: CancellationToken,
) -> anyhow::Result<ServedRx> {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let stored = ensure_stored(&api, &namespace, &name, &dns_names, lifetimes).await?;
    let (tx, rx) = watch::channel(std::sync::Arc::new(stored.served()?));
    let keeper = Keeper {
        api,
        name,
        dns_names,
        lifetimes,
        tx,
    };
    tokio::spawn(keeper.run(shutdown));
    Ok(rx)
}

async fn ensure_stored(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    dns_names: &[String],
    lifetimes: Lifetimes,
) -> anyhow::Result<Stored> {
    let read =
        |found: &Secret| Stored::read(found).with_context(|| format!("Secret {namespace}/{name}"));
    if let Some(found) = api.get_opt(name).await.context("reading the TLS Secret")? {
        return read(&found);
    }
    let (tls, ca) = generate(dns_names, lifetimes.validity, SystemTime::now())?;
    let stored = Stored {
        bundle: vec![ca],
        tls,
        next: None,
    };
    let mut secret = Secret {
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
        ..Secret::default()
    };
    stored.write(&mut secret);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(namespace, secret = name, names = %dns_names.join(","), "made the operator's CA and serving certificate");
            Ok(stored)
        }
        // Another replica made it first: serve that one.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            read(&api.get(name).await.context("reading the TLS Secret")?)
        }
        Err(e) => Err(e).context("creating the TLS Secret"),
    }
}

/// What the Secret holds.
#[derive(Clone)]
struct Stored {
    /// The CAs clients are to trust, oldest first.
    bundle: Vec<pem::Pem>,
    /// Served now.
    tls: ServerTls,
    /// Staged by a rotation, and when it is to be served.
    next: Option<(ServerTls, SystemTime)>,
}

impl Stored {
    fn read(secret: &Secret) -> anyhow::Result<Stored> {
        let data = secret.data.clone().unwrap_or_default();
        let text = |key: &str| -> anyhow::Result<Option<String>> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.0.clone())
                        .with_context(|| format!("{key} is not PEM text"))
                })
                .transpose()
        };
        let needed = |key: &str| -> anyhow::Result<String> {
            text(key)?.with_context(|| {
                format!("has no {key}: delete it and restart the operator to make a new one")
            })
        };
        let next = match (text(NEXT_CERT)?, text(NEXT_KEY)?) {
            (Some(cert), Some(key)) => {
                let at = secret
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(PROMOTE_AT))
                    .with_context(|| format!("holds {NEXT_CERT} but no {PROMOTE_AT} annotation"))?;
                let at = humantime::parse_rfc3339(at)
                    .with_context(|| format!("annotation {PROMOTE_AT} is not an RFC 3339 time"))?;
                Some((ServerTls::from_pem(cert, key), at))
            }
            _ => None,
        };
        Ok(Stored {
            bundle: certificates(&needed(CA)?)?,
            tls: ServerTls::from_pem(needed(CERT)?, needed(KEY)?),
            next,
        })
    }

    fn write(&self, secret: &mut Secret) {
        let pem = |s: &str| ByteString(s.as_bytes().to_vec());
        let mut data = BTreeMap::from([
            (CA.to_owned(), pem(&bundle_text(&self.bundle))),
            (CERT.to_owned(), pem(&self.tls.cert_pem)),
            (KEY.to_owned(), pem(self.tls.key_pem())),
        ]);
        let annotations = secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        annotations.remove(PROMOTE_AT);
        if let Some((next, at)) = &self.next {
            data.insert(NEXT_CERT.to_owned(), pem(&next.cert_pem));
            data.insert(NEXT_KEY.to_owned(), pem(next.key_pem()));
            annotations.insert(
                PROMOTE_AT.to_owned(),
                humantime::format_rfc3339_seconds(*at).to_string(),
            );
        }
        secret.data = Some(data);
    }

    fn served(&self) -> anyhow::Result<Served> {
        Served::new(self.tls.clone(), bundle_text(&self.bundle))
    }
}

/// The next thing a rotation has to do.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Stage,
    Promote,
    Retire,
    /// Nothing before this time.
    Wait(SystemTime),
}

/// When a certificate (first of a PEM chain) starts and stops being valid.
fn life(cert_pem: &str) -> anyhow::Result<(SystemTime, SystemTime)> {
    let block = pem::parse(cert_pem).context("the serving certificate is not PEM")?;
    validity(block.contents())
}

fn plan(stored: &Stored, now: SystemTime) -> anyhow::Result<Step> {
    let (from, until) = life(&stored.tls.cert_pem)?;
    if let Some((_, at)) = &stored.next
        && (*at <= now || until <= now)
    {
        return Ok(Step::Promote);
    }
    let renew = from + until.duration_since(from).unwrap_or_default() * 2 / 3;
    if stored.next.is_none() && renew <= now {
        return Ok(Step::Stage);
    }
    let expiries = stored
        .bundle
        .iter()
        .map(|ca| validity(ca.contents()).map(|(_, until)| until))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if expiries.iter().any(|t| *t <= now) && expiries.iter().any(|t| *t > now) {
        return Ok(Step::Retire);
    }
    let mut wake = expiries
        .into_iter()
        .filter(|t| *t > now)
        .collect::<Vec<_>>();
    match &stored.next {
        Some((_, at)) => wake.push(*at),
        None => wake.push(renew),
    }
    Ok(Step::Wait(wake.into_iter().min().unwrap_or(renew)))
}

/// `stored` after `step`.
fn apply(
    step: &Step,
    mut stored: Stored,
    dns_names: &[String],
    lifetimes: Lifetimes,
    now: SystemTime,
) -> anyhow::Result<Stored> {
    match step {
        Step::Stage => {
            let (tls, ca) = generate(dns_names, lifetimes.validity, now)?;
            let (_, until) = life(&stored.tls.cert_pem)?;
            // Nothing is gained by waiting to replace a certificate that no
            // longer verifies.
            let at = if until <= now {
                now
            } else {
                now + lifetimes.overlap
            };
            stored.bundle.push(ca);
            stored.next = Some((tls, at));
        }
        Step::Promote => {
            if let Some((next, _)) = stored.next.take() {
                stored.tls = next;
            }
        }
        Step::Retire => {
            stored
                .bundle
                .retain(|ca| validity(ca.contents()).is_ok_and(|(_, until)| until > now));
        }
        Step::Wait(_) => {}
    }
    Ok(stored)
}

struct Keeper {
    api: Api<Secret>,
    name: String,
    dns_names: Vec<String>,
    lifetimes: Lifetimes,
    tx: watch::Sender<std::sync::Arc<Served>>,
}

impl Keeper {
    async fn run(self, shutdown: CancellationToken) {
        loop {
            let wake = match self.step().await {
                Ok(wake) => wake,
                Err(e) => {
                    tracing::warn!(secret = %self.name, error = format!("{e:#}"), "could not follow the operator's TLS Secret; retrying");
                    SystemTime::now() + Duration::from_secs(10)
                }
            };
            let recheck = RECHECK
                .min(self.lifetimes.overlap / 2)
                .max(Duration::from_secs(1));
            let wait = wake
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .min(recheck);
            if wait.is_zero() {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Reads the Secret, serves what it holds, and makes the step that is
    /// due, if any; says when to look again.
    async fn step(&self) -> anyhow::Result<SystemTime> {
        let mut secret = self
            .api
            .get(&self.name)
            .await
            .context("reading the TLS Secret")?;
        let stored = Stored::read(&secret)?;
        self.serve(&stored)?;
        let now = SystemTime::now();
        let step = plan(&stored, now)?;
        if let Step::Wait(at) = step {
            return Ok(at);
        }
        let changed = apply(&step, stored, &self.dns_names, self.lifetimes, now)?;
        changed.write(&mut secret);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => {
                match step {
                    Step::Stage => {
                        tracing::info!(secret = %self.name, promote_at = %humantime::format_rfc3339_seconds(changed.next.as_ref().map_or(now, |n| n.1)), "staged a new operator CA: sidecars and webhooks trust the old and the new one")
                    }
                    Step::Promote => {
                        tracing::info!(secret = %self.name, "serving the certificate of the new operator CA")
                    }
                    _ => {
                        tracing::info!(secret = %self.name, "an expired operator CA left the bundle")
                    }
                }
                self.serve(&changed)?;
            }
            // Another replica wrote first: read what it wrote.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e).context("writing the TLS Secret"),
        }
        Ok(now)
    }

    fn serve(&self, stored: &Stored) -> anyhow::Result<()> {
        publish(&self.tx, stored.served()?);
        Ok(())
    }
}

/// A CA and a serving certificate it signed for `dns_names`, both valid
/// from `now` for `validity`; the CA's key goes out of scope here.
fn generate(
    dns_names: &[String],
    validity: Duration,
    now: SystemTime,
) -> anyhow::Result<(ServerTls, pem::Pem)> {
    let from = time::OffsetDateTime::from(now);
    let until = time::OffsetDateTime::from(now + validity);
    let ca_key = rcgen::KeyPair::generate().context("generating the CA key")?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    // Each CA its own name: clients and tools can tell them apart.
    ca.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("aip-operator CA {}", humantime::format_rfc3339_seconds(now)),
    );
    (ca.not_before, ca.not_after) = (from, until);
    let ca_cert = ca.self_signed(&ca_key).context("self-signing the CA")?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().context("generating the serving key")?;
    let mut serving = rcgen::CertificateParams::new(dns_names.to_vec())
        .context("the serving certificate's names")?;
    serving
        .distinguished_name
        .push(rcgen::DnType::CommonName, "aip-operator");
    serving.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    (serving.not_before, serving.not_after) = (from, until);
    let cert = serving
        .signed_by(&key, &issuer)
        .context("signing the serving certificate")?;
    Ok((
        ServerTls::from_pem(cert.pem(), key.serialize_pem()),
        pem::Pem::new("CERTIFICATE", ca_cert.der().to_vec()),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    use super::*;

    const NAME: &str = "aip-operator.aip-system.svc";

    /// Whether `tls` verifies for NAME against `bundle` at `at`.
    fn verifies(bundle: &[pem::Pem], tls: &ServerTls, name: &str, at: SystemTime) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for ca in bundle {
            roots
                .add(CertificateDer::from(ca.contents().to_vec()))
                .unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let chain: Vec<_> = CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
            .map(Result::unwrap)
            .collect();
        let at = UnixTime::since_unix_epoch(at.duration_since(SystemTime::UNIX_EPOCH).unwrap());
        verifier
            .verify_server_cert(
                &chain[0],
                &[],
                &ServerName::try_from(name.to_owned()).unwrap(),
                &[],
                at,
            )
            .is_ok()
    }

    fn made(now: SystemTime, lifetimes: Lifetimes) -> Stored {
        let (tls, ca) = generate(&[NAME.to_owned()], lifetimes.validity, now).unwrap();
        Stored {
            bundle: vec![ca],
            tls,
            next: None,
        }
    }

    #[test]
    fn the_serving_certificate_verifies_against_the_ca_for_its_names() {
        let now = SystemTime::now();
        let stored = made(now, Lifetimes::DEFAULT);
        assert!(verifies(&stored.bundle, &stored.tls, NAME, now));
        assert!(!verifies(&stored.bundle, &stored.tls, "evil.example", now));
    }

    /// A whole rotation, step by step on a made-up clock: at every moment
    /// the certificate served verifies against the bundle handed out an
    /// overlap earlier, so no client that got that bundle is stranded.
    #[test]
    fn a_rotation_stages_promotes_and_retires_and_never_strands_a_client() {
        let lifetimes = Lifetimes {
            validity: Duration::from_secs(600),
            overlap: Duration::from_secs(60),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let names = [NAME.to_owned()];
        let mut stored = made(t0, lifetimes);
        let first_bundle = stored.bundle.clone();

        assert_eq!(
            plan(&stored, s(10)).unwrap(),
            Step::Wait(s(400)),
            "renews two thirds in"
        );
        assert_eq!(plan(&stored, s(400)).unwrap(), Step::Stage);
        stored = apply(&Step::Stage, stored, &names, lifetimes, s(400)).unwrap();
        assert_eq!(stored.bundle.len(), 2, "old and new CA trusted");
        assert_eq!(stored.bundle[0], first_bundle[0]);
        assert!(
            verifies(&first_bundle, &stored.tls, NAME, s(400)),
            "the old certificate is still served"
        );
        let (next, at) = stored.next.clone().unwrap();
        assert_eq!(at, s(460));
        assert!(verifies(&stored.bundle, &next, NAME, s(460)));
        assert!(
            !verifies(&first_bundle, &next, NAME, s(460)),
            "a new CA, not only a new key"
        );

        assert_eq!(plan(&stored, s(401)).unwrap(), Step::Wait(s(460)));
        assert_eq!(plan(&stored, s(460)).unwrap(), Step::Promote);
        let bundle_at_stage = stored.bundle.clone();
        stored = apply(&Step::Promote, stored, &names, lifetimes, s(460)).unwrap();
        assert_eq!(stored.tls.cert_pem, next.cert_pem);
        assert!(stored.next.is_none());
        assert!(verifies(&bundle_at_stage, &stored.tls, NAME, s(460)));

        assert_eq!(
            plan(&stored, s(461)).unwrap(),
            Step::Wait(s(600)),
            "the old CA expires"
        );
        assert_eq!(plan(&stored, s(600)).unwrap(), Step::Retire);
        stored = apply(&Step::Retire, stored, &names, lifetimes, s(600)).unwrap();
        assert_eq!(stored.bundle.len(), 1);
        assert!(verifies(&stored.bundle, &stored.tls, NAME, s(601)));
        // The next rotation, two thirds into the new certificate's life.
        assert_eq!(plan(&stored, s(601)).unwrap(), Step::Wait(s(800)));
    }

    /// An operator that was down past its certificate's expiry replaces it
    /// at once: waiting an overlap would only prolong the outage.
    #[test]
    fn an_expired_certificate_is_replaced_without_waiting() {
        let lifetimes = Lifetimes {
            validity: Duration::from_secs(600),
            overlap: Duration::from_secs(60),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let late = t0 + Duration::from_secs(5000);
        let names = [NAME.to_owned()];
        let stored = made(t0, lifetimes);
        assert_eq!(plan(&stored, late).unwrap(), Step::Stage);
        let stored = apply(&Step::Stage, stored, &names, lifetimes, late).unwrap();
        assert_eq!(plan(&stored, late).unwrap(), Step::Promote);
        let stored = apply(&Step::Promote, stored, &names, lifetimes, late).unwrap();
        assert_eq!(plan(&stored, late).unwrap(), Step::Retire);
        let stored = apply(&Step::Retire, stored, &names, lifetimes, late).unwrap();
        assert_eq!(stored.bundle.len(), 1);
        assert!(verifies(&stored.bundle, &stored.tls, NAME, late));
    }

    /// What one replica writes, another reads back the same.
    #[test]
    fn a_staged_rotation_survives_the_secret() {
        let lifetimes = Lifetimes::DEFAULT;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let stored = made(now, lifetimes);
        let stored = apply(&Step::Stage, stored, &[NAME.to_owned()], lifetimes, now).unwrap();
        let mut secret = Secret::default();
        stored.write(&mut secret);
        let back = Stored::read(&secret).unwrap();
        assert_eq!(back.bundle, stored.bundle);
        assert_eq!(back.tls.cert_pem, stored.tls.cert_pem);
        let ((next, at), (want, want_at)) = (back.next.unwrap(), stored.next.unwrap());
        assert_eq!(
            (next.key_pem(), &next.cert_pem, at),
            (want.key_pem(), &want.cert_pem, want_at)
        );
        // Promoted, the staged keys and the annotation go.
        let promoted = apply(
            &Step::Promote,
            Stored::read(&secret).unwrap(),
            &[],
            lifetimes,
            now,
        )
        .unwrap();
        promoted.write(&mut secret);
        let data = secret.data.as_ref().unwrap();
        assert!(!data.contains_key(NEXT_CERT) && !data.contains_key(NEXT_KEY));
        assert!(
            !secret
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(PROMOTE_AT)
        );
    }

    #[test]
    fn lifetimes_need_room_for_the_overlap() {
        assert!(Lifetimes::DEFAULT.check().is_ok());
        let tight = Lifetimes {
            validity: Duration::from_secs(60),
            overlap: Duration::from_secs(11),
        };
        let e = tight.check().unwrap_err().to_string();
        assert!(
            e.contains("--tls-overlap (11s) must be at most a sixth of --tls-validity (1m)"),
            "{e}"
        );
    }
}

//! The Secrets connections read, and why the operator has not got others.
//! Only Secrets some connection references are fed in; a change re-resolves
//! the connections that read it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use aip_api::tool_connection::SecretKeyRef;
use secrecy::{ExposeSecret, SecretString};

use super::{Index, ObjectKey};

/// A Secret's data. Debug never shows the values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData(pub BTreeMap<String, Vec<u8>>);

impl fmt::Debug for SecretData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The Secrets of a namespace that connections read, and why the operator
/// has not got others.
#[derive(Default)]
pub(super) struct Secrets {
    pub(super) data: HashMap<String, Arc<SecretData>>,
    /// Secret name -> why it cannot be used yet.
    pub(super) unreadable: HashMap<String, Unreadable>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unreadable {
    /// Referenced, and its watch has not reported yet.
    NotReadYet,
    /// The operator may not read it; the text says how to grant it.
    Forbidden(String),
}

/// Why one Secret key cannot be used. Names the Secret and key, never the
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretKeyError {
    #[error("Secret {secret} has not been read yet")]
    NotReadYet { secret: String },
    /// The operator may not read the Secret; the text says how to grant it.
    #[error("{grant}")]
    Forbidden { grant: String },
    #[error("Secret {secret} not found")]
    NotFound { secret: String },
    #[error("Secret {secret} has no key {key}")]
    NoKey { secret: String, key: String },
    #[error("Secret {secret} key {key} is not UTF-8")]
    NotUtf8 { secret: String, key: String },
    #[error("Secret {secret} key {key} is empty")]
    Empty { secret: String, key: String },
    /// A line break inside a Secret would otherwise end the header early.
    #[error("Secret {secret} key {key} holds a control character, which no header value may")]
    ControlCharacter { secret: String, key: String },
    #[error("Secret {secret} key {key} holds no PEM certificate")]
    NoCertificate { secret: String, key: String },
    #[error("Secret {secret} key {key} holds no PEM private key")]
    NoPrivateKey { secret: String, key: String },
}

impl Secrets {
    /// One Secret key's value, its trailing line break removed.
    fn value(&self, r: &SecretKeyRef) -> Result<SecretString, SecretKeyError> {
        let secret = || r.name.clone();
        let key = || r.key.clone();
        let data = self
            .data
            .get(&r.name)
            .ok_or_else(|| match self.unreadable.get(&r.name) {
                Some(Unreadable::NotReadYet) => SecretKeyError::NotReadYet { secret: secret() },
                Some(Unreadable::Forbidden(why)) => {
                    SecretKeyError::Forbidden { grant: why.clone() }
                }
                None => SecretKeyError::NotFound { secret: secret() },
            })?;
        let bytes = data.0.get(&r.key).ok_or_else(|| SecretKeyError::NoKey {
            secret: secret(),
            key: key(),
        })?;
        let text = std::str::from_utf8(bytes).map_err(|_| SecretKeyError::NotUtf8 {
            secret: secret(),
            key: key(),
        })?;
        let text = text.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            return Err(SecretKeyError::Empty {
                secret: secret(),
                key: key(),
            });
        }
        Ok(SecretString::from(text.to_owned()))
    }

    /// A Secret key's value as a header value, which may not hold control
    /// characters.
    pub(super) fn header_value(&self, r: &SecretKeyRef) -> Result<SecretString, SecretKeyError> {
        let value = self.value(r)?;
        let bad = |b: u8| (b < 0x20 && b != b'\t') || b == 0x7f;
        if value.expose_secret().bytes().any(bad) {
            return Err(SecretKeyError::ControlCharacter {
                secret: r.name.clone(),
                key: r.key.clone(),
            });
        }
        Ok(value)
    }

    /// A Secret key holding a PEM private key (RSA or EC).
    pub(super) fn private_key(&self, r: &SecretKeyRef) -> Result<SecretString, SecretKeyError> {
        let pem = self.value(r)?;
        if !pem.expose_secret().contains("PRIVATE KEY-----") {
            return Err(SecretKeyError::NoPrivateKey {
                secret: r.name.clone(),
                key: r.key.clone(),
            });
        }
        Ok(pem)
    }

    /// A Secret key holding a PEM CA bundle.
    pub(super) fn certificates(&self, r: &SecretKeyRef) -> Result<String, SecretKeyError> {
        let pem = self.value(r)?;
        if !pem.expose_secret().contains("-----BEGIN CERTIFICATE-----") {
            return Err(SecretKeyError::NoCertificate {
                secret: r.name.clone(),
                key: r.key.clone(),
            });
        }
        Ok(pem.expose_secret().to_owned())
    }
}

impl Index {
    /// Adds or replaces a Secret's data; connections reading it re-resolve.
    pub fn apply_secret(
        &mut self,
        namespace: &str,
        name: &str,
        data: SecretData,
    ) -> BTreeSet<ObjectKey> {
        let ns = self.namespace(namespace);
        let was_unreadable = ns.secrets.unreadable.remove(name).is_some();
        if !was_unreadable && ns.secrets.data.get(name).is_some_and(|d| **d == data) {
            return BTreeSet::new();
        }
        ns.secrets.data.insert(name.to_owned(), Arc::new(data));
        self.reresolve_readers(namespace, name)
    }

    pub fn delete_secret(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return BTreeSet::new();
        };
        let had_data = ns.secrets.data.remove(name).is_some();
        let was_unreadable = ns.secrets.unreadable.remove(name).is_some();
        if !had_data && !was_unreadable {
            return BTreeSet::new();
        }
        self.reresolve_readers(namespace, name)
    }

    /// The operator may not read Secret `name` (`reason` says how to grant
    /// it); connections reading it say so instead of "not found".
    pub fn secret_unreadable(
        &mut self,
        namespace: &str,
        name: &str,
        reason: String,
    ) -> BTreeSet<ObjectKey> {
        let ns = self.namespace(namespace);
        let had_data = ns.secrets.data.remove(name).is_some();
        let reason = Unreadable::Forbidden(reason);
        if !had_data && ns.secrets.unreadable.get(name) == Some(&reason) {
            return BTreeSet::new();
        }
        ns.secrets.unreadable.insert(name.to_owned(), reason);
        self.reresolve_readers(namespace, name)
    }

    /// A Secret a connection is about to reference that no one has read:
    /// its readers wait for its watch instead of calling it missing.
    pub fn expect_secret(&mut self, namespace: &str, name: &str) -> BTreeSet<ObjectKey> {
        let ns = self.namespace(namespace);
        if ns.secrets.data.contains_key(name) || ns.secrets.unreadable.contains_key(name) {
            return BTreeSet::new();
        }
        ns.secrets
            .unreadable
            .insert(name.to_owned(), Unreadable::NotReadYet);
        self.reresolve_readers(namespace, name)
    }

    /// Every Secret some connection reads.
    pub fn referenced_secrets(&self) -> BTreeSet<ObjectKey> {
        self.namespaces
            .iter()
            .flat_map(|(ns, n)| {
                n.connections.values().flat_map(move |c| {
                    c.spec
                        .secret_refs()
                        .into_iter()
                        .map(move |(_, r)| ObjectKey::new(ns, &r.name))
                })
            })
            .collect()
    }

    /// The connections of `namespace` that read Secret `secret`.
    pub fn connections_reading(&self, namespace: &str, secret: &str) -> Vec<String> {
        self.namespaces.get(namespace).map_or_else(Vec::new, |ns| {
            ns.connections
                .iter()
                .filter(|(_, c)| c.reads(secret))
                .map(|(name, _)| name.clone())
                .collect()
        })
    }
}

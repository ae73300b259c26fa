//! The pure model of the control plane: policies, connections, Secrets and
//! pods in; one versioned configuration per pod out, on a watch channel per
//! pod. No API calls and no clocks: controllers feed it, the gRPC server
//! reads it, and its tests need no Kubernetes.
//!
//! Work is proportional to what changed: a pod is matched against its own
//! namespace's policies; a policy change touches the pods it selects or
//! selected; a Secret change touches the connections that read it and the
//! pods granted those.
//!
//! One file per kind fed in (`policies`, `connections`, `secrets`, `pods`,
//! the last with the sidecars' acks), `peers` for the acks other replicas
//! reported, and `config` for what comes out. Every
//! update returns the policies whose status may have changed.

mod config;
mod connections;
pub(crate) mod egress;
mod peers;
mod pods;
mod policies;
mod secrets;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

pub use config::PodConfig;
pub use connections::{Credentials, CredentialsError, ResolvedConnection};
pub use egress::EgressView;
pub use peers::{DIGEST_LEN, digest};
pub use pods::PodMeta;
pub use policies::PolicyView;
pub use secrets::{SecretData, SecretKeyError};

use connections::ConnectionEntry;
use peers::PeerAcks;
use pods::PodEntry;
use policies::PolicyEntry;
use secrets::Secrets;

/// A policy, connection, Secret or pod, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

pub struct Index {
    namespaces: HashMap<String, Namespace>,
    /// The last version published to any pod: versions only grow.
    version: u64,
    /// Whether the cluster's state has been listed once. Before that, a
    /// pod's config could be wrong (a policy not yet seen), so none is
    /// served.
    synced: bool,
    /// Where each known pod uid lives (namespace, name).
    uids: HashMap<String, (String, String)>,
    /// What the other replicas' sidecars acknowledged.
    peers: PeerAcks,
}

impl Default for Index {
    fn default() -> Index {
        Index {
            namespaces: HashMap::new(),
            version: 0,
            synced: true,
            uids: HashMap::new(),
            peers: PeerAcks::default(),
        }
    }
}

/// Everything the index knows of one namespace: nothing crosses namespaces.
#[derive(Default)]
struct Namespace {
    name: String,
    policies: BTreeMap<String, PolicyEntry>,
    connections: BTreeMap<String, ConnectionEntry>,
    secrets: Secrets,
    pods: BTreeMap<String, PodEntry>,
    egress_locks: BTreeMap<String, aip_api::EgressLockSpec>,
}

impl Namespace {
    fn named(name: &str) -> Namespace {
        Namespace {
            name: name.to_owned(),
            ..Namespace::default()
        }
    }
}

impl Index {
    /// An index that is complete as it is fed (tests, benchmarks).
    pub fn new() -> Index {
        Index::default()
    }

    /// An index that serves nothing until `mark_synced`: the operator's,
    /// while its watches make their first lists.
    pub fn loading() -> Index {
        Index {
            synced: false,
            ..Index::default()
        }
    }

    pub fn mark_synced(&mut self) {
        self.synced = true;
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Namespace `name`, made empty if the index has not seen it.
    fn namespace(&mut self, name: &str) -> &mut Namespace {
        self.namespaces
            .entry(name.to_owned())
            .or_insert_with(|| Namespace::named(name))
    }
}

//! Each replica's sync report: which pods' sidecars acknowledged which
//! policy hash to this replica. Every replica serves sidecars but only the
//! lease holder writes status, so every replica publishes its report as
//! ConfigMaps in its own namespace and the others read them
//! (`feed::peers`) into their index.
//!
//! A report is one or more ConfigMaps `aip-sync-<replica>-<n>`, each holding
//! at most `SHARD` entries (pod uid → the first hex digits of the policy
//! hash) as JSON under `acks.json`, labelled `aip.io/sync-report=true`,
//! annotated with the replica, and owned by the replica's pod (from
//! `POD_UID`), so that the garbage collector removes it with the pod.
//! Without an owner (a replica run outside a pod), the replica deletes its
//! report when it stops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::FIELD_MANAGER;
use crate::index::Index;

/// The label every report carries (value "true").
pub const LABEL: &str = "aip.io/sync-report";
/// The annotation naming the replica a report is from.
pub const REPLICA: &str = "aip.io/replica";
/// The data key of a report's entries.
pub const KEY: &str = "acks.json";
/// Entries per ConfigMap: about 60 bytes each, well under the API
/// server's 1 MiB per object.
pub const SHARD: usize = 10_000;
/// Acks arriving together (a policy change reaches every sidecar at once)
/// make one write.
const COALESCE: Duration = Duration::from_millis(100);
/// After a failed write.
const RETRY: Duration = Duration::from_secs(2);

/// A report's entries, or why they cannot be read.
pub fn parse(map: &ConfigMap) -> Result<HashMap<String, String>, String> {
    let Some(text) = map.data.as_ref().and_then(|d| d.get(KEY)) else {
        return Err(format!("no {KEY}"));
    };
    serde_json::from_str(text).map_err(|e| format!("{KEY}: {e}"))
}

/// The replica that wrote `map`.
pub fn replica(map: &ConfigMap) -> Option<&str> {
    map.annotations().get(REPLICA).map(String::as_str)
}

/// Writes this replica's report.
pub struct Publisher {
    api: Api<ConfigMap>,
    replica: String,
    owner: Option<OwnerReference>,
    /// Shards that may exist (written by this run or a previous one).
    shards: usize,
    written: Option<BTreeMap<String, String>>,
}

impl Publisher {
    /// `owner`: the replica's pod (name, uid), when it runs in one.
    pub fn new(
        client: Client,
        namespace: &str,
        replica: &str,
        owner: Option<(&str, &str)>,
    ) -> Publisher {
        Publisher {
            api: Api::namespaced(client, namespace),
            replica: replica.to_owned(),
            owner: owner.map(|(name, uid)| OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
                ..OwnerReference::default()
            }),
            shards: 0,
            written: None,
        }
    }

    fn name(&self, shard: usize) -> String {
        format!("aip-sync-{}-{shard}", self.replica)
    }

    /// Counts the shards a previous run of this replica left, so that the
    /// first write removes those it no longer needs.
    async fn find_leftovers(&mut self) -> Result<(), kube::Error> {
        let listed = self
            .api
            .list_metadata(&ListParams::default().labels(&format!("{LABEL}=true")))
            .await?;
        let prefix = format!("aip-sync-{}-", self.replica);
        for m in listed.items {
            let name = m.name_any();
            if m.annotations().get(REPLICA) != Some(&self.replica) {
                continue;
            }
            if let Some(n) = name
                .strip_prefix(&prefix)
                .and_then(|n| n.parse::<usize>().ok())
            {
                self.shards = self.shards.max(n + 1);
            }
        }
        Ok(())
    }

    /// Writes `acks` if they differ from what was last written.
    pub async fn publish(&mut self, acks: BTreeMap<String, String>) -> Result<(), kube::Error> {
        if self.written.as_ref() == Some(&acks)
            || (self.written.is_none() && acks.is_empty() && self.shards == 0)
        {
            return Ok(());
        }
        let entries: Vec<(&String, &String)> = acks.iter().collect();
        let chunks: Vec<&[(&String, &String)]> = if entries.is_empty() {
            vec![&[]]
        } else {
            entries.chunks(SHARD).collect()
        };
        for (i, chunk) in chunks.iter().enumerate() {
            let body: BTreeMap<&String, &String> = chunk.iter().copied().collect();
            let map = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name(i),
                    "labels": {LABEL: "true", "app.kubernetes.io/managed-by": "aip-operator"},
                    "annotations": {REPLICA: self.replica},
                    "ownerReferences": self.owner.iter().collect::<Vec<_>>(),
                },
                "data": {KEY: serde_json::to_string(&body).unwrap_or_default()},
            });
            self.api
                .patch(
                    &self.name(i),
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(map),
                )
                .await?;
        }
        for i in chunks.len()..self.shards {
            self.delete(i).await?;
        }
        self.shards = chunks.len();
        self.written = Some(acks);
        Ok(())
    }

    async fn delete(&self, shard: usize) -> Result<(), kube::Error> {
        match self
            .api
            .delete(&self.name(shard), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes the whole report.
    async fn withdraw(&mut self) -> Result<(), kube::Error> {
        for i in 0..self.shards {
            self.delete(i).await?;
        }
        self.shards = 0;
        Ok(())
    }
}

/// Publishes this replica's acks whenever `acked` is notified, until
/// `shutdown`. A report without an owner is withdrawn at shutdown.
pub async fn run(
    mut publisher: Publisher,
    index: Arc<Mutex<Index>>,
    acked: Arc<Notify>,
    shutdown: CancellationToken,
) {
    if let Err(e) = publisher.find_leftovers().await {
        tracing::warn!(error = %crate::errors::Api(&e), "sync reports of an earlier run not listed; they stay until their pod is gone");
    }
    loop {
        tokio::select! {
            () = acked.notified() => {}
            () = shutdown.cancelled() => break,
        }
        tokio::select! {
            () = tokio::time::sleep(COALESCE) => {}
            () = shutdown.cancelled() => break,
        }
        let acks = index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .local_acks();
        if let Err(e) = publisher.publish(acks).await {
            tracing::warn!(error = %crate::errors::Api(&e), retry_in_ms = RETRY.as_millis() as u64, "sync report not written; the lease holder counts this replica's sidecars once it is");
            acked.notify_one();
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                () = shutdown.cancelled() => break,
            }
        }
    }
    if publisher.owner.is_none()
        && let Err(e) = publisher.withdraw().await
    {
        tracing::warn!(error = %crate::errors::Api(&e), "sync report not withdrawn");
    }
}

//! The server's state: the store, the kinds it serves (built-in, and those
//! installed CRDs add), who may call it, and discovery documents.

use std::sync::{Arc, RwLock};

use hyper::HeaderMap;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::{Tokens, User};
use crate::kinds::{self, Kind};
use crate::status::ApiError;
use crate::store::{Part, Store};

/// The Kubernetes version this server claims to be.
pub const MINOR: &str = "36";

pub struct Server {
    pub store: Store,
    kinds: RwLock<Vec<Kind>>,
    tokens: Tokens,
    pub shutdown: CancellationToken,
    /// Bumped to expire every open watch (410, as after etcd compaction).
    expiries: tokio::sync::watch::Sender<u64>,
    /// Signs and checks service-account tokens.
    pub signer: crate::tokens::Signer,
    pub metrics: crate::metrics::Metrics,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    pub fn new(tokens: Tokens, shutdown: CancellationToken) -> Arc<Server> {
        let server = Arc::new(Server {
            store: Store::default(),
            kinds: RwLock::new(kinds::builtins()),
            tokens,
            shutdown,
            expiries: tokio::sync::watch::Sender::new(0),
            signer: crate::tokens::Signer::default(),
            metrics: crate::metrics::Metrics::default(),
        });
        let namespace = server
            .kind("", "v1", "namespaces")
            .unwrap_or_else(|| kinds::builtins()[0].clone());
        // The bootstrap role every cluster has, bound as on a real one.
        if let (Some(role), Some(binding)) = (
            server.kind("rbac.authorization.k8s.io", "v1", "clusterroles"),
            server.kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
        ) {
            let admin = json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]});
            let _ = server.store.create(&role, "", admin);
            let bound = json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "subjects": [{"kind": "Group", "name": "system:masters", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "cluster-admin", "apiGroup": "rbac.authorization.k8s.io"}});
            let _ = server.store.create(&binding, "", bound);
        }
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let object = json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            let _ = server.store.create(&namespace, "", object);
        }
        server
    }

    /// Ends every open watch with a 410 ERROR event and forgets the change
    /// history, so clients must list again (what a real server does when
    /// the resourceVersion they watch from is compacted away).
    pub fn expire_watches(&self) {
        self.store.compact();
        self.expiries.send_modify(|n| *n += 1);
    }

    /// Changes when watches are expired.
    pub fn expiries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.expiries.subscribe()
    }

    /// A static token's user, or a service account's from a token this
    /// server minted for its own audience.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
        self.tokens
            .authenticate(authorization)
            .or_else(|unauthorized| {
                let token = authorization
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .ok_or(unauthorized.clone())?;
                let audiences = [crate::tokens::ISSUER.to_owned()];
                self.signer
                    .authenticate(&self.store, token.trim(), &audiences)
                    .map(|(user, _, _)| user)
                    .map_err(|_| unauthorized)
            })
    }

    /// The kind served at group/version/plural.
    pub fn kind(&self, group: &str, version: &str, plural: &str) -> Option<Kind> {
        read(&self.kinds)
            .iter()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
            .cloned()
    }

    /// Every kind served now.
    pub fn kinds(&self) -> Vec<Kind> {
        read(&self.kinds).clone()
    }

    pub fn version(&self) -> Value {
        json!({
            "major": "1", "minor": MINOR,
            "gitVersion": format!("v1.{MINOR}.0-aip-fake"),
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64",
        })
    }

    pub fn core_versions(&self) -> Value {
        json!({"kind": "APIVersions", "versions": ["v1"],
               "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
    }

    /// Each group with its versions, in the order first served.
    fn group_versions(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for k in read(&self.kinds).iter().filter(|k| !k.group.is_empty()) {
            match groups.iter_mut().find(|(g, _)| *g == k.group) {
                Some((_, versions)) if !versions.contains(&k.version) => {
                    versions.push(k.version.clone())
                }
                Some(_) => {}
                None => groups.push((k.group.clone(), vec![k.version.clone()])),
            }
        }
        groups
    }

    fn group_document((name, versions): &(String, Vec<String>)) -> Value {
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
            .collect();
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": name,
               "versions": versions, "preferredVersion": versions[0]})
    }

    pub fn groups(&self) -> Value {
        let groups: Vec<Value> = self
            .group_versions()
            .iter()
            .map(Server::group_document)
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    pub fn group(&self, name: &str) -> Result<Value, ApiError> {
        self.group_versions()
            .iter()
            .find(|(g, _)| g == name)
            .map(Server::group_document)
            .ok_or_else(|| ApiError::not_found("", "groups", name))
    }

    pub fn resources(&self, group: &str, version: &str) -> Result<Value, ApiError> {
        let kinds = read(&self.kinds);
        let served: Vec<&Kind> = kinds
            .iter()
            .filter(|k| k.group == group && k.version == version)
            .collect();
        if served.is_empty() {
            return Err(ApiError::not_found(group, "", version));
        }
        let resources: Vec<Value> = served.iter().flat_map(|k| k.discovery()).collect();
        let group_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Ok(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
        )
    }

    /// What a write implies beyond the object: an installed CRD serves its
    /// kinds, and is marked Established once it does.
    pub fn after_write(&self, kind: &Kind, object: &Value) {
        if kind.group != "apiextensions.k8s.io" || kind.plural != "customresourcedefinitions" {
            return;
        }
        let Ok(defined) = kinds::from_crd(object) else {
            return;
        };
        {
            let mut kinds = self.kinds.write().unwrap_or_else(|e| e.into_inner());
            for new in defined {
                kinds.retain(|k| {
                    !(k.group == new.group && k.version == new.version && k.plural == new.plural)
                });
                kinds.push(new);
            }
        }
        let established = object
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
        if established {
            return;
        }
        let mut marked = object.clone();
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        marked["status"] = json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "acceptedNames": object.pointer("/spec/names").cloned().unwrap_or(json!({})),
            "storedVersions": object.pointer("/spec/versions").and_then(Value::as_array)
                .map(|v| v.iter().filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>())
                .unwrap_or_default(),
        });
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let _ = self.store.update(kind, "", name, marked, Part::Status);
    }

    /// A CRD removed for good stops serving its kinds.
    pub fn after_delete(&self, kind: &Kind, object: &Value) {
        if kind.group != "apiextensions.k8s.io" || kind.plural != "customresourcedefinitions" {
            return;
        }
        if object.pointer("/metadata/deletionTimestamp").is_some()
            && !crate::store::finalizers(object).is_empty()
        {
            return;
        }
        if let Ok(defined) = kinds::from_crd(object) {
            let mut kinds = self.kinds.write().unwrap_or_else(|e| e.into_inner());
            kinds.retain(|k| {
                !defined
                    .iter()
                    .any(|d| d.group == k.group && d.plural == k.plural)
            });
        }
    }
}

//! The objects, with the real server's bookkeeping: one global monotonic
//! resourceVersion, uid and creationTimestamp at create, generation bumped
//! on spec changes only, optimistic concurrency on resourceVersion,
//! finalizers holding deletion, and a bounded history of changes that
//! watches resume from (older than the history: 410 Gone).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::kinds::{Kind, Resource};
use crate::status::ApiError;

/// How many changes are kept for watches to resume from.
pub const HISTORY: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub resource: Resource,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification (for watches with a selector: an
    /// object that stops matching is DELETED for them, one that starts,
    /// ADDED).
    pub previous: Option<Value>,
}

type Key = (Resource, String, String);

/// The changes to come, for a watch.
pub type Changes = broadcast::Receiver<Arc<Event>>;

pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Arc<Event>>,
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Event>>,
    /// Watches may resume from any resourceVersion at or after this one.
    oldest: u64,
}

/// How a write treats `status` (the status subresource splits an object
/// in two halves written separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The whole object (kinds without a status subresource).
    Whole,
    /// Everything but status (status is kept as stored).
    Main,
    /// Only status (everything else is kept as stored).
    Status,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                oldest: 1,
            }),
            changes: broadcast::channel(4096).0,
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn name_of(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

impl Store {
    /// The current resourceVersion (what a list at this moment reports).
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner).rv
    }

    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Option<Value> {
        let key = (resource.clone(), namespace.to_owned(), name.to_owned());
        lock(&self.inner).objects.get(&key).cloned()
    }

    /// Every object of `resource` (in `namespace`, or all), and the
    /// resourceVersion the list is consistent with.
    pub fn list(&self, resource: &Resource, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let inner = lock(&self.inner);
        let items = inner
            .objects
            .iter()
            .filter(|((r, ns, _), _)| r == resource && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Creates `object` (name or generateName set, defaults applied).
    pub fn create(
        &self,
        kind: &Kind,
        namespace: &str,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = lock(&self.inner);
        let meta = metadata(&mut object)?;
        if !meta.contains_key("name") || meta["name"] == "" {
            let Some(prefix) = meta.get("generateName").and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    &kind.kind,
                    "",
                    vec![(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            };
            let suffix: String = (0..5)
                .map(|_| {
                    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                    ALPHABET[rand::random_range(0..ALPHABET.len())] as char
                })
                .collect();
            meta.insert("name".into(), json!(format!("{prefix}{suffix}")));
        }
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        let key = (kind.resource(), namespace.to_owned(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&kind.group, &kind.plural, &name));
        }
        if kind.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uuid()));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        meta.remove("resourceVersion");
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        if kind.status
            && let Some(o) = object.as_object_mut()
        {
            // With a status subresource, status is written only there;
            // built-in kinds start where their real strategies start them.
            o.remove("status");
            match (kind.group.as_str(), kind.plural.as_str()) {
                ("", "namespaces") => {
                    o.insert("status".into(), json!({"phase": "Active"}));
                }
                ("", "pods") => {
                    o.insert("status".into(), json!({"phase": "Pending"}));
                }
                _ => {}
            }
        }
        Ok(inner.commit(&self.changes, key, EventType::Added, object))
    }

    /// Replaces the stored object (or one half of it, `part`). A
    /// resourceVersion in `object` must be the stored one.
    pub fn update(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        mut object: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let mut inner = lock(&self.inner);
        let key = (kind.resource(), namespace.to_owned(), name.to_owned());
        let Some(stored) = inner.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(&kind.group, &kind.plural, name));
        };
        let stored_rv = stored.pointer("/metadata/resourceVersion").cloned();
        match object.pointer("/metadata/resourceVersion") {
            Some(rv) if Some(rv) != stored_rv.as_ref() && rv != "" => {
                return Err(ApiError::conflict(&kind.group, &kind.plural, name));
            }
            _ => {}
        }
        if name_of(&object) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&object)
            )));
        }
        match part {
            Part::Whole => {}
            Part::Main => match stored.get("status") {
                Some(status) => object["status"] = status.clone(),
                None => {
                    if let Some(o) = object.as_object_mut() {
                        o.remove("status");
                    }
                }
            },
            Part::Status => {
                let status = object.get("status").cloned();
                let managed = object.pointer("/metadata/managedFields").cloned();
                object = stored.clone();
                // Who owns which status fields is recorded with the write.
                match managed {
                    Some(m) => object["metadata"]["managedFields"] = m,
                    None => {
                        if let Some(meta) = object["metadata"].as_object_mut() {
                            meta.remove("managedFields");
                        }
                    }
                }
                match status {
                    Some(s) => object["status"] = s,
                    None => {
                        if let Some(o) = object.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
        }
        let spec_changed = part != Part::Status && object.get("spec") != stored.get("spec");
        // Fields the server owns are kept as stored.
        let meta = metadata(&mut object)?;
        for owned in ["uid", "creationTimestamp", "deletionTimestamp", "namespace"] {
            match stored["metadata"].get(owned) {
                Some(v) => meta.insert(owned.into(), v.clone()),
                None => meta.remove(owned),
            };
        }
        let generation = stored
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        meta.insert(
            "generation".into(),
            json!(if spec_changed {
                generation + 1
            } else {
                generation
            }),
        );
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        // The last finalizer gone from an object being deleted: it goes.
        let deleting = stored.pointer("/metadata/deletionTimestamp").is_some();
        if deleting && finalizers(&object).is_empty() {
            let gone = inner.remove(&self.changes, &key, object);
            return Ok(gone);
        }
        if object == stored {
            return Ok(stored); // no change, no new resourceVersion
        }
        Ok(inner.commit(&self.changes, key, EventType::Modified, object))
    }

    /// Deletes: at once, or — while finalizers remain — by marking it with
    /// a deletionTimestamp for whoever holds them.
    pub fn delete(&self, kind: &Kind, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let mut inner = lock(&self.inner);
        let key = (kind.resource(), namespace.to_owned(), name.to_owned());
        let Some(mut object) = inner.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(&kind.group, &kind.plural, name));
        };
        if finalizers(&object).is_empty() {
            return Ok(inner.remove(&self.changes, &key, object));
        }
        if object.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(object);
        }
        object["metadata"]["deletionTimestamp"] = json!(now());
        object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        Ok(inner.commit(&self.changes, key, EventType::Modified, object))
    }

    /// The changes after `from` for a watch, and a receiver for what comes
    /// next, taken together so that nothing falls between them. Gone when
    /// `from` is older than the history kept.
    pub fn watch(&self, from: u64) -> Result<(Vec<Arc<Event>>, Changes), ApiError> {
        let inner = lock(&self.inner);
        if from < inner.oldest {
            return Err(ApiError::gone(format!(
                "too old resource version: {from} ({})",
                inner.oldest
            )));
        }
        let backlog = inner
            .history
            .iter()
            .filter(|e| e.rv > from)
            .cloned()
            .collect();
        Ok((backlog, self.changes.subscribe()))
    }

    /// Forgets the history, so that every watch resuming from an older
    /// resourceVersion gets 410 Gone (as after etcd compaction).
    pub fn compact(&self) {
        let mut inner = lock(&self.inner);
        inner.history.clear();
        inner.oldest = inner.rv;
    }
}

impl Inner {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn commit(
        &mut self,
        changes: &broadcast::Sender<Arc<Event>>,
        key: Key,
        kind: EventType,
        mut object: Value,
    ) -> Value {
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let previous = self.objects.insert(key.clone(), object.clone());
        self.record(changes, rv, key, kind, object.clone(), previous);
        object
    }

    fn remove(
        &mut self,
        changes: &broadcast::Sender<Arc<Event>>,
        key: &Key,
        mut object: Value,
    ) -> Value {
        self.objects.remove(key);
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(
            changes,
            rv,
            key.clone(),
            EventType::Deleted,
            object.clone(),
            None,
        );
        object
    }

    fn record(
        &mut self,
        changes: &broadcast::Sender<Arc<Event>>,
        rv: u64,
        (resource, namespace, _): Key,
        kind: EventType,
        object: Value,
        previous: Option<Value>,
    ) {
        let event = Arc::new(Event {
            rv,
            resource,
            namespace,
            kind,
            object,
            previous,
        });
        if self.history.len() == HISTORY {
            self.history.pop_front();
            self.oldest = self.history.front().map_or(rv, |e| e.rv - 1);
        }
        self.history.push_back(event.clone());
        let _ = changes.send(event);
    }
}

fn metadata(object: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request("the object is not a JSON object"));
    }
    if object.get("metadata").is_none() {
        object["metadata"] = json!({});
    }
    object["metadata"]
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata: must be an object"))
}

pub fn finalizers(object: &Value) -> Vec<String> {
    crate::values::strings(object.pointer("/metadata/finalizers"))
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

//! The resources agents watch (`resourceSubscriptions` of a modern
//! agent's `subscriptions/listen`, `resources/subscribe` of a legacy
//! agent's session) and the servers' tasks they follow (`taskIds`),
//! counted per connection and URI or task id: a server is subscribed to a
//! resource or task while at least one agent watches it, and unsubscribed
//! when the last one stops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aip_service::sync::lock;

use crate::upstream::health::ConnectionState;

/// (connection, whether tasks) -> watched key -> how many watch it.
type Counts = Arc<Mutex<HashMap<(String, bool), BTreeMap<String, usize>>>>;

#[derive(Default)]
pub(super) struct Watches(Counts);

/// The most resources one legacy session watches.
pub(super) const MAX_SESSION_WATCHES: usize = 64;

/// What each legacy session watches (`resources/subscribe`), until it
/// unsubscribes or ends.
#[derive(Default)]
pub(super) struct SessionWatches(pub(super) Mutex<HashMap<String, Vec<Watch>>>);

impl SessionWatches {
    /// Whether `session` watches `uri` on `connection`.
    pub(super) fn watches(&self, session: &str, connection: &str, uri: &str) -> bool {
        lock(&self.0).get(session).is_some_and(|w| {
            w.iter()
                .any(|w| w.uri == uri && w.connection() == connection)
        })
    }
}

/// One agent's watch of one resource (or one server task), given up when
/// dropped.
pub(super) struct Watch {
    counts: Counts,
    connection: Arc<ConnectionState>,
    /// The resource's URI, or the server's id for the task.
    pub(super) uri: String,
    task: bool,
}

impl Watch {
    /// The connection whose server holds the resource.
    pub(super) fn connection(&self) -> &str {
        &self.connection.connection().name
    }
}

impl Watches {
    pub(super) fn watch(&self, connection: &Arc<ConnectionState>, uri: &str) -> Watch {
        self.add(connection, uri, false)
    }

    /// Follows a server's task (its own id) for `notifications/tasks`.
    pub(super) fn watch_task(&self, connection: &Arc<ConnectionState>, id: &str) -> Watch {
        self.add(connection, id, true)
    }

    fn add(&self, connection: &Arc<ConnectionState>, key: &str, task: bool) -> Watch {
        let watch = Watch {
            counts: self.0.clone(),
            connection: connection.clone(),
            uri: key.to_owned(),
            task,
        };
        let mut all = lock(&self.0);
        let counts = all.entry(watch.slot()).or_default();
        *counts.entry(key.to_owned()).or_default() += 1;
        watch.tell(counts);
        watch
    }
}

impl Watch {
    fn slot(&self) -> (String, bool) {
        (self.connection().to_owned(), self.task)
    }

    /// Gives the server's client the keys now watched.
    fn tell(&self, counts: &BTreeMap<String, usize>) {
        let keys = counts.keys().cloned().collect();
        match self.task {
            true => self.connection.upstream.watch_tasks(keys),
            false => self.connection.upstream.watch_resources(keys),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut all = lock(&self.counts);
        let Some(counts) = all.get_mut(&self.slot()) else {
            return;
        };
        if let Some(n) = counts.get_mut(&self.uri) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.uri);
            }
        }
        self.tell(counts);
    }
}

//! The resources agents watch (`resourceSubscriptions` of a modern
//! agent's `subscriptions/listen`, `resources/subscribe` of a legacy
//! agent's session), counted per connection and URI: a server is
//! subscribed to a resource while at least one agent watches it, and
//! unsubscribed when the last one stops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aip_service::sync::lock;

use crate::upstream::health::ConnectionState;

type Counts = Arc<Mutex<HashMap<String, BTreeMap<String, usize>>>>;

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

/// One agent's watch of one resource, given up when dropped.
pub(super) struct Watch {
    counts: Counts,
    connection: Arc<ConnectionState>,
    pub(super) uri: String,
}

impl Watch {
    /// The connection whose server holds the resource.
    pub(super) fn connection(&self) -> &str {
        &self.connection.connection().name
    }
}

impl Watches {
    pub(super) fn watch(&self, connection: &Arc<ConnectionState>, uri: &str) -> Watch {
        let mut all = lock(&self.0);
        let counts = all.entry(connection.connection().name.clone()).or_default();
        *counts.entry(uri.to_owned()).or_default() += 1;
        connection
            .upstream
            .watch_resources(counts.keys().cloned().collect());
        Watch {
            counts: self.0.clone(),
            connection: connection.clone(),
            uri: uri.to_owned(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut all = lock(&self.counts);
        let Some(counts) = all.get_mut(self.connection()) else {
            return;
        };
        if let Some(n) = counts.get_mut(&self.uri) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.uri);
            }
        }
        self.connection
            .upstream
            .watch_resources(counts.keys().cloned().collect());
    }
}

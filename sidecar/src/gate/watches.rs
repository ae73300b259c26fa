//! The resources agents watch (`resourceSubscriptions` of their
//! `subscriptions/listen`), counted per connection and URI: a server is
//! subscribed to a resource while at least one agent watches it, and
//! unsubscribed when the last one hangs up.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aip_service::sync::lock;

use crate::upstream::health::ConnectionState;

type Counts = Arc<Mutex<HashMap<String, BTreeMap<String, usize>>>>;

#[derive(Default)]
pub(super) struct Watches(Counts);

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

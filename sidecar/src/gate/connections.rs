//! The gateway's live connections: one state per configured connection,
//! kept across reloads while its configuration is unchanged (session,
//! catalog, stdio process), started afresh when it changes, and closed once
//! nothing uses it when a reload removes it.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use aip_service::sync::{lock, read, write};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::upstream::health::{ConnectionState, HealthState};

pub(super) struct Connections {
    /// The current states, in configuration order (what calls route to).
    live: RwLock<Vec<Arc<ConnectionState>>>,
    /// Each state with the token that stops its health checker and listener.
    running: Mutex<Vec<(Arc<ConnectionState>, CancellationToken)>>,
    /// Bumped by the connections (and by every rebuild) when what agents'
    /// tool lists depend on changes.
    pub listing: Arc<watch::Sender<u64>>,
    /// Counts the configurations applied, for whatever must wait for a
    /// reload to take effect.
    pub applied: watch::Sender<u64>,
    /// Bumped each time a connection a reload removed has been closed.
    pub retired: Arc<watch::Sender<u64>>,
    /// What every connection's server says outside any call that agents
    /// may hear, with the connection's name.
    pub notes: broadcast::Sender<(String, Value)>,
}

impl Connections {
    pub(super) fn new() -> Connections {
        Connections {
            live: RwLock::new(Vec::new()),
            running: Mutex::new(Vec::new()),
            listing: Arc::new(watch::Sender::new(0)),
            applied: watch::Sender::new(0),
            retired: Arc::new(watch::Sender::new(0)),
            notes: broadcast::Sender::new(64),
        }
    }

    pub(super) fn all(&self) -> Vec<Arc<ConnectionState>> {
        read(&self.live).clone()
    }

    /// Every connection's capabilities merged: a capability is offered when
    /// some server offers it, a flag when some server sets it.
    pub(super) fn capabilities(&self) -> Value {
        let mut merged = serde_json::Map::new();
        for connection in self.all() {
            let Value::Object(caps) = connection.upstream.server_capabilities() else {
                continue;
            };
            for (name, value) in caps {
                let slot = merged
                    .entry(name)
                    .or_insert_with(|| Value::Object(Default::default()));
                if let (Value::Object(slot), Value::Object(flags)) = (slot, value) {
                    for (flag, on) in flags {
                        if on == Value::Bool(true) || !slot.contains_key(&flag) {
                            slot.insert(flag, on);
                        }
                    }
                }
            }
        }
        Value::Object(merged)
    }

    /// The only connection, when there is exactly one.
    pub(super) fn sole(&self) -> Option<Arc<ConnectionState>> {
        let mut all = self.all();
        (all.len() == 1).then(|| all.remove(0))
    }

    /// For a tool name no catalog holds: the connection whose tools it
    /// could be (its prefix starts the name, or it is the only one) while
    /// that connection is not usable, and why, for the agent's error.
    pub(super) fn unavailable_for(&self, name: &str) -> Option<String> {
        let all = self.all();
        let sole = all.len() == 1;
        all.into_iter().find_map(|c| {
            let health = c.health();
            let prefix = &c.connection().tool_prefix;
            let could_be = if prefix.is_empty() {
                sole
            } else {
                name.starts_with(prefix.as_str())
            };
            (could_be && !health.state.listable()).then(|| {
                format!(
                    "connection {} is {:?}{}",
                    c.connection().name,
                    health.state,
                    health.reason.map(|r| format!(": {r}")).unwrap_or_default()
                )
            })
        })
    }

    /// Connections whose health lets their lists be read.
    pub(super) fn usable(&self) -> Vec<Arc<ConnectionState>> {
        self.all()
            .into_iter()
            .filter(|c| c.health().state.listable())
            .collect()
    }

    /// Makes the live set match `config`; returns the states it let go of
    /// (for the caller to forget their routes, then [`Connections::retire`]).
    pub(super) fn rebuild(
        &self,
        config: &Config,
        shutdown: &CancellationToken,
    ) -> Vec<Arc<ConnectionState>> {
        let mut running = lock(&self.running);
        let mut old = std::mem::take(&mut *running);
        for connection in &config.connections {
            if let Some(i) = old
                .iter()
                .position(|(s, _)| s.connection().same_as(connection))
            {
                let kept = old.swap_remove(i);
                kept.0.set_tool_rules(config.tool_rules(&connection.name));
                running.push(kept);
                continue;
            }
            let rules = config.tool_rules(&connection.name);
            match ConnectionState::new(connection.clone(), rules, self.listing.clone()) {
                Ok(state) => {
                    let state = Arc::new(state);
                    let stop = shutdown.child_token();
                    tokio::spawn(state.clone().run_checks(stop.clone()));
                    tokio::spawn(state.clone().listen(stop.clone()));
                    if let Some(heard) = state.upstream.notes() {
                        let name = connection.name.clone();
                        tokio::spawn(pass_notes(heard, self.notes.clone(), name, stop.clone()));
                    }
                    running.push((state, stop));
                }
                Err(e) => {
                    tracing::error!(connection = %connection.name, error = %e, "connection not started")
                }
            }
        }
        *write(&self.live) = running.iter().map(|(state, _)| state.clone()).collect();
        drop(running);
        self.listing.send_modify(|n| *n += 1);
        old.into_iter()
            .map(|(state, stop)| {
                stop.cancel();
                state
            })
            .collect()
    }

    /// Closes a connection a reload removed once its requests in flight are
    /// done (an HTTP session ended with DELETE, a stdio server stopped).
    pub(super) fn retire(&self, state: Arc<ConnectionState>) {
        let retired = self.retired.clone();
        tokio::spawn(async move {
            state.idle().await;
            state.upstream.close().await;
            retired.send_modify(|n| *n += 1);
        });
    }

    /// Stops every health checker and closes every upstream (stdio servers
    /// are asked to exit and waited for), all at once.
    pub(super) async fn close_all(&self) {
        let closing = std::mem::take(&mut *lock(&self.running));
        write(&self.live).clear();
        let mut tasks = tokio::task::JoinSet::new();
        for (state, stop) in closing {
            stop.cancel();
            tasks.spawn(async move { state.upstream.close().await });
        }
        tasks.join_all().await;
    }

    /// Waits (at most each connection's health deadline) until every
    /// connection has finished its first health check, so that an agent
    /// that asks at once is not told of an empty catalog.
    pub(super) async fn settled(&self) {
        let unchecked: Vec<_> = read(&self.live)
            .iter()
            .filter(|c| c.state() == HealthState::Unchecked)
            .cloned()
            .collect();
        if unchecked.is_empty() {
            return;
        }
        let longest = unchecked
            .iter()
            .map(|c| c.connection().health_deadline)
            .max()
            .unwrap_or_default();
        let deadline = tokio::time::Instant::now() + longest + Duration::from_millis(100);
        for state in unchecked {
            let mut watch = state.subscribe();
            let first = watch.wait_for(|s| *s != HealthState::Unchecked);
            let _ = tokio::time::timeout_at(deadline, first).await;
        }
    }
}

/// Passes one connection's notes on to the gateway's, until it stops.
async fn pass_notes(
    mut heard: broadcast::Receiver<Value>,
    notes: broadcast::Sender<(String, Value)>,
    connection: String,
    stop: CancellationToken,
) {
    loop {
        let note = tokio::select! {
            note = heard.recv() => note,
            () = stop.cancelled() => return,
        };
        match note {
            Ok(note) => {
                let _ = notes.send((connection.clone(), note));
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

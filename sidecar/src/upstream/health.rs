//! One connection's live state: health (docs/sidecar.md, "Upstreams and connection health"),
//! the tool catalog its health checks discover, and the tools gated by a 403.
//! Only credential evidence changes the whole connection; a failed call
//! otherwise belongs to the call that saw it.

use aip_service::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::credentials::Credentials;
use super::tools::{Listed, Tools};
use crate::config::{Connection, ToolRules};
use aip_mcp::Upstream;
use aip_mcp::http::StreamState;
use aip_mcp::{ConnectionEffect, Failure};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HealthState {
    Unchecked,
    Healthy,
    Degraded,
    Unreachable,
    NeedsCredentials,
}

impl HealthState {
    /// Whether the connection's tools are listed to agents.
    pub fn listable(self) -> bool {
        matches!(self, HealthState::Healthy | HealthState::Degraded)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub state: HealthState,
    pub reason: Option<String>,
    pub http_status: Option<u16>,
    pub last_check: Option<String>,
    pub last_transition: Option<String>,
    /// The failure that set the state, if one did: a call refused while
    /// the connection needs credentials is refused as that (a token the
    /// authorization server would not give says so).
    #[serde(skip)]
    pub failure: Option<Failure>,
}

/// A tool hidden and refused after a 403, until the credential changes.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub required_scope: Option<String>,
    pub since: String,
}

pub struct ConnectionState {
    pub upstream: Upstream,
    /// The connection's credential values, kept out of what its server
    /// says (with the access tokens it was given: [`Self::redact_echoes`]).
    credentials: Credentials,
    health: Mutex<Health>,
    /// Publishes the state on every change, for anything that must wait
    /// for one (tests, readiness).
    state: watch::Sender<HealthState>,
    /// The tools of the last successful check, judged against the
    /// connection's pins.
    tools: Mutex<Tools>,
    gates: Mutex<BTreeMap<String, Gate>>,
    /// Successful calls since the last health check: a failing probe with
    /// calls still succeeding means Degraded, not Unreachable.
    calls_ok: AtomicU64,
    /// Successes and network-class failures not yet reported to the
    /// operator (Kubernetes mode).
    evidence_ok: AtomicU64,
    evidence_network: AtomicU64,
    /// Bumped when anything an agent's tool list depends on changes: the
    /// state, the catalog's content, a gate. Shared by the gateway's
    /// connections.
    changes: Arc<watch::Sender<u64>>,
    /// Requests in flight on this connection, so that a connection a reload
    /// removed is closed only once nothing uses it; `idle` is told when the
    /// count drops to zero.
    busy: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// The least time between two checks prompted by list-changed notices.
const MIN_REFRESH_GAP: Duration = Duration::from_secs(1);

/// Counts one request in flight on a connection while it lives.
pub struct Busy<'a>(&'a ConnectionState);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl ConnectionState {
    /// `changes` is bumped whenever what this connection lists changes.
    pub fn new(
        connection: Arc<Connection>,
        rules: ToolRules,
        changes: Arc<watch::Sender<u64>>,
    ) -> Result<ConnectionState, String> {
        let initial = match &connection.credentials {
            Ok(_) => (HealthState::Unchecked, None),
            Err(e) => (
                HealthState::NeedsCredentials,
                Some(format!("credentials_unresolved: {e}")),
            ),
        };
        let credentials = match &connection.credentials {
            Ok(headers) => Credentials::new(headers),
            Err(_) => Credentials::new(&[]),
        };
        let tools = Mutex::new(Tools::new(&connection.name, rules));
        Ok(ConnectionState {
            credentials,
            state: watch::Sender::new(initial.0),
            upstream: Upstream::new(connection)?,
            health: Mutex::new(Health {
                state: initial.0,
                reason: initial.1,
                http_status: None,
                last_check: None,
                last_transition: None,
                failure: None,
            }),
            tools,
            gates: Mutex::new(BTreeMap::new()),
            calls_ok: AtomicU64::new(0),
            evidence_ok: AtomicU64::new(0),
            evidence_network: AtomicU64::new(0),
            changes,
            busy: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
        })
    }

    pub fn connection(&self) -> &Connection {
        self.upstream.connection()
    }

    /// The one entry of an agent's request into the connection's health:
    /// refused without being sent when the connection is not usable or,
    /// for a call of the upstream `tool`, when an earlier 403 gated the
    /// tool; otherwise `send` runs with the connection marked busy, and
    /// what its outcome proves is recorded (None: cancelled, proves
    /// nothing).
    pub async fn admit<T>(
        &self,
        tool: Option<&str>,
        send: impl Future<Output = Option<Result<T, Failure>>>,
    ) -> Result<Option<Result<T, Failure>>, Failure> {
        if let Some(tool) = tool {
            if let Some(gate) = self.gate(tool) {
                return Err(Failure::Forbidden {
                    scope: gate.required_scope,
                });
            }
            match self.state() {
                HealthState::Healthy | HealthState::Degraded => {}
                HealthState::NeedsCredentials => {
                    let failure = lock(&self.health).failure.clone();
                    return Err(match failure {
                        Some(f @ Failure::TokenUnavailable(_)) => f,
                        _ => Failure::AuthFailed,
                    });
                }
                HealthState::Unchecked | HealthState::Unreachable => {
                    return Err(Failure::Network("the connection is not reachable".into()));
                }
            }
        }
        let busy = self.busy();
        let outcome = send.await;
        drop(busy);
        match &outcome {
            Some(Ok(_)) => self.record_success(),
            Some(Err(failure)) => self.record_failure(tool.unwrap_or_default(), failure),
            None => {}
        }
        Ok(outcome)
    }

    /// Marks a request in flight until the guard drops.
    pub fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    /// Waits until no request is in flight.
    pub async fn idle(&self) {
        loop {
            // Registered before the count is read, so a drop to zero in
            // between is not missed.
            let idle = self.idle.notified();
            if self.busy.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Redacts from what the server sent every credential of this
    /// connection, in every spelling: its configured ones and the access
    /// tokens it was given. How many were found.
    pub fn redact_echoes(&self, value: &mut Value) -> usize {
        self.credentials.redact(value) + self.upstream.redact_tokens(value)
    }

    pub fn health(&self) -> Health {
        lock(&self.health).clone()
    }

    /// The health state, without copying the rest of the health.
    pub fn state(&self) -> HealthState {
        *self.state.borrow()
    }

    /// Watches the health state.
    pub fn subscribe(&self) -> watch::Receiver<HealthState> {
        self.state.subscribe()
    }

    /// The upstream's tools from the last successful check, each with its
    /// standing against the connection's pins.
    pub fn catalog(&self) -> Arc<Vec<Listed>> {
        lock(&self.tools).judged()
    }

    /// What a poisoning-scan finding does on this connection.
    pub fn scan_action(&self) -> crate::config::ScanAction {
        lock(&self.tools).scan()
    }

    /// New pins or scan rules for the running connection (a person
    /// accepted a tool): its tools are judged again at once.
    pub fn set_tool_rules(&self, rules: ToolRules) {
        if lock(&self.tools).set_rules(rules) {
            self.changed();
        }
    }

    pub fn gates(&self) -> BTreeMap<String, Gate> {
        lock(&self.gates).clone()
    }

    pub fn gate(&self, tool: &str) -> Option<Gate> {
        lock(&self.gates).get(tool).cloned()
    }

    /// Runs one health check and applies its result.
    pub async fn check(&self) {
        let result = self.upstream.health_check().await;
        let mut health = lock(&self.health);
        health.last_check = Some(now());
        let calls_ok = self.calls_ok.swap(0, Ordering::Relaxed);
        let before = health.state;
        match result {
            Ok(tools) => {
                // An unchanged catalog keeps its version.
                if lock(&self.tools).listed(tools) {
                    self.changed();
                }
                // Leaving NeedsCredentials takes a changed credential, which
                // arrives as a new connection, not a passing check; but an
                // OAuth connection's credential is the token it asks for, and
                // a check that was given one the server accepts has it.
                if health.state != HealthState::NeedsCredentials
                    || self.connection().oauth.is_some()
                {
                    set(&self.state, &mut health, HealthState::Healthy, None, None);
                }
            }
            Err(failure) if failure.connection_effect() == ConnectionEffect::NeedsCredentials => {
                set_failed(
                    &self.state,
                    &mut health,
                    HealthState::NeedsCredentials,
                    &failure,
                );
            }
            Err(failure) => {
                let state = if calls_ok > 0 {
                    HealthState::Degraded
                } else {
                    HealthState::Unreachable
                };
                set_failed(&self.state, &mut health, state, &failure);
            }
        }
        if health.state != before {
            self.transitioned(&health);
        }
    }

    /// Logs a change of state (with its reason) and tells the gateway.
    fn transitioned(&self, health: &Health) {
        tracing::info!(
            connection = %self.connection().name,
            state = ?health.state,
            reason = health.reason.as_deref().unwrap_or(""),
            "connection state changed"
        );
        self.changed();
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Health checks until `shutdown`: the first at once, then every
    /// interval while healthy; after a failed check, sooner (1 s, doubling up
    /// to the interval), so that an upstream that was still starting is
    /// listed within moments rather than after a whole interval.
    ///
    /// A server saying its tool list changed gets a check at once (at most
    /// one per `MIN_REFRESH_GAP`), so agents see new tools in moments.
    pub async fn run_checks(self: Arc<Self>, shutdown: CancellationToken) {
        let interval = self.connection().health_interval;
        let mut retry = Duration::from_secs(1);
        loop {
            let started = tokio::time::Instant::now();
            self.check().await;
            let wait = if self.health().state.listable() {
                retry = Duration::from_secs(1);
                interval
            } else {
                let wait = retry.min(interval);
                retry = (retry * 2).min(interval);
                wait
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.upstream.list_changed().notified() => {
                    tokio::select! {
                        () = tokio::time::sleep_until(started + MIN_REFRESH_GAP) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// The HTTP server's standalone stream; `None` for a stdio server.
    pub fn stream_state(&self) -> Option<watch::Receiver<StreamState>> {
        match &self.upstream {
            Upstream::Http(http) => Some(http.stream_state()),
            Upstream::Stdio(_) => None,
        }
    }

    /// Follows what an HTTP server says outside any call (its standalone
    /// stream), until `stop`; a stdio server's lines are read anyway.
    pub async fn listen(self: Arc<Self>, stop: CancellationToken) {
        if let Upstream::Http(http) = &self.upstream {
            http.listen(stop).await;
        }
    }

    pub fn record_success(&self) {
        self.calls_ok.fetch_add(1, Ordering::Relaxed);
        self.evidence_ok.fetch_add(1, Ordering::Relaxed);
    }

    /// Successful calls and network-class failures since the previous
    /// take, for the operator's reports.
    pub fn take_evidence(&self) -> (u64, u64) {
        (
            self.evidence_ok.swap(0, Ordering::Relaxed),
            self.evidence_network.swap(0, Ordering::Relaxed),
        )
    }

    /// Applies what a failed call proves, and nothing more.
    pub fn record_failure(&self, tool: &str, failure: &Failure) {
        if matches!(failure.class(), "network" | "timeout") {
            self.evidence_network.fetch_add(1, Ordering::Relaxed);
        }
        match failure.connection_effect() {
            ConnectionEffect::None => {}
            ConnectionEffect::NeedsCredentials => {
                let mut health = lock(&self.health);
                let before = health.state;
                set_failed(
                    &self.state,
                    &mut health,
                    HealthState::NeedsCredentials,
                    failure,
                );
                if health.state != before {
                    self.transitioned(&health);
                }
            }
            ConnectionEffect::GateTool { scope } => {
                let gate = Gate {
                    required_scope: scope,
                    since: now(),
                };
                if lock(&self.gates).insert(tool.to_owned(), gate).is_none() {
                    self.changed();
                }
            }
        }
    }
}

fn set(
    publish: &watch::Sender<HealthState>,
    health: &mut Health,
    state: HealthState,
    reason: Option<&str>,
    http_status: Option<u16>,
) {
    if health.state != state {
        health.last_transition = Some(now());
        publish.send_replace(state);
    }
    health.state = state;
    health.reason = reason.map(str::to_owned);
    health.http_status = http_status;
    health.failure = None;
}

/// `state`, explained by the failure that caused it.
fn set_failed(
    publish: &watch::Sender<HealthState>,
    health: &mut Health,
    state: HealthState,
    failure: &Failure,
) {
    let reason = failure.explained();
    set(publish, health, state, Some(&reason), failure.http_status());
    health.failure = Some(failure.clone());
}

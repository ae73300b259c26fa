//! ToolConnection health and status, as docs/operator.md describes them:
//! the lease holder probes each connection (initialize, initialized,
//! tools/list, with the connection's deadline, no redirects) on its interval,
//! right after its spec or Secrets change, and soon after sidecars report
//! repeated network failures. Credential evidence from any sidecar moves it
//! to NeedsCredentials at once; a failing probe while sidecars report
//! successful calls gives Degraded, not Unreachable. Status is written only
//! when it changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aip_api::ToolConnection;
use aip_api::tool_connection::{Health, HealthState, ToolConnectionStatus};
use aip_mcp::Upstream;
use aip_mcp::credentials::Credentials;
use aip_mcp::failure::{ConnectionEffect, Failure};
use aip_policy::tools::Trust;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::publish;
use crate::grpc::Evidence;
use crate::index::{ObjectKey, ResolvedConnection};

use super::conditions::{Conditions, is_reason, ours};
use super::{Context, FIELD_MANAGER};
use super::{tool_ledger, upstream_auth};

/// The condition types this writer owns.
const CONDITIONS: &[&str] = &[
    "CredentialsResolved",
    "Healthy",
    "ToolsDrifted",
    upstream_auth::TYPE,
];

/// Network failures reported since the last probe that bring the next one
/// forward.
const NETWORK_FAILURES_FOR_PROBE: u64 = 3;
/// How soon a probe follows such evidence.
const EVIDENCE_PROBE_DELAY: Duration = Duration::from_secs(1);
/// lastCheckTime alone is refreshed at most this often (status writes are
/// for changes, not heartbeats).
const CHECK_TIME_REFRESH: Duration = Duration::from_secs(300);

/// What the prober knows of one connection.
struct Tracked {
    resolved: Arc<ResolvedConnection>,
    upstream: Option<Arc<Upstream>>,
    due: Instant,
    probing: bool,
    successes: u64,
    network_failures: u64,
    /// Set by sidecar credential evidence until a probe says otherwise.
    evidence_needs_credentials: Option<String>,
}

impl Tracked {
    /// Whether a probe may start: none running, and the credentials are not
    /// waiting for their Secret's first read (once read, the connection
    /// changes and is probed at once; it is not reported missing).
    fn probe_wanted(&self) -> bool {
        !self.probing && !self.resolved.credentials_pending && !self.resolved.as_pods()
    }
}

type ProbeResult = (
    ObjectKey,
    Arc<ResolvedConnection>,
    Result<Vec<Value>, Failure>,
);

pub async fn run(
    ctx: Arc<Context>,
    mut touched: mpsc::UnboundedReceiver<ObjectKey>,
    mut evidence: mpsc::UnboundedReceiver<Evidence>,
    shutdown: CancellationToken,
) {
    let mut tracked: HashMap<ObjectKey, Tracked> = HashMap::new();
    let (done_tx, mut done) = mpsc::unbounded_channel::<ProbeResult>();
    let mut leader = ctx.leader.clone();
    loop {
        let leading = *leader.borrow();
        let next = tracked
            .values()
            .filter(|t| t.probe_wanted())
            .map(|t| t.due)
            .min()
            .filter(|_| leading);
        tokio::select! {
            Some(key) = touched.recv() => refresh(&ctx, &mut tracked, key),
            Some(e) = evidence.recv() => {
                if let Some(t) = tracked.get_mut(&e.connection) {
                    if t.resolved.as_pods() {
                        // No probe can check it: the sidecar's own judgement
                        // (its health rules, its token requests) is the status,
                        // written by whichever replica the sidecar reports to
                        // (a report reaches only one; the write is conditional
                        // and changes nothing when the status already says it).
                        if let Some(outcome) = reported(&e) {
                            write(&ctx, &e.connection, &t.resolved, outcome).await;
                        }
                        continue;
                    }
                    take_evidence(t, &e);
                    if let (Some(why), true) = (t.evidence_needs_credentials.clone(), leading) {
                        write(&ctx, &e.connection, &t.resolved, Outcome::Evidence(why)).await;
                    }
                }
            }
            Some((key, resolved, result)) = done.recv() => {
                let Some(t) = tracked.get_mut(&key) else { continue };
                t.probing = false;
                if !Arc::ptr_eq(&t.resolved, &resolved) {
                    continue; // the connection changed while it was probed; a new probe is due
                }
                t.due = Instant::now() + resolved.health_interval;
                let successes = std::mem::take(&mut t.successes);
                t.network_failures = 0;
                if result.is_ok() {
                    t.evidence_needs_credentials = None;
                }
                let outcome = match (&result, t.evidence_needs_credentials.clone()) {
                    // The probe failed and a sidecar says the credential is bad.
                    (Err(_), Some(why)) => Outcome::Evidence(why),
                    _ => Outcome::Probe(result, successes, t.upstream.clone()),
                };
                if leading {
                    write(&ctx, &key, &resolved, outcome).await;
                }
            }
            () = sleep_until(next) => {
                let now = Instant::now();
                for (key, t) in tracked.iter_mut().filter(|(_, t)| t.probe_wanted() && t.due <= now) {
                    t.probing = true;
                    spawn_probe(key.clone(), t, done_tx.clone());
                }
            }
            changed = leader.changed() => {
                if changed.is_err() { return; }
                // A new leader checks everything at once.
                let now = Instant::now();
                for t in tracked.values_mut() { t.due = now; }
            }
            () = shutdown.cancelled() => return,
        }
    }
}

/// Picks up a connection's current form from the index; a changed one is
/// probed at once with a fresh client.
fn refresh(ctx: &Context, tracked: &mut HashMap<ObjectKey, Tracked>, key: ObjectKey) {
    let resolved = ctx
        .index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .connection(&key.namespace, &key.name);
    let Some(resolved) = resolved else {
        tracked.remove(&key);
        return;
    };
    if tracked
        .get(&key)
        .is_some_and(|t| Arc::ptr_eq(&t.resolved, &resolved) || *t.resolved == *resolved)
    {
        return;
    }
    let upstream = client_for(&resolved);
    tracked.insert(
        key,
        Tracked {
            resolved,
            upstream,
            due: Instant::now(),
            probing: false,
            successes: 0,
            network_failures: 0,
            evidence_needs_credentials: None,
        },
    );
}

/// The gateway's own MCP client, so the probe speaks exactly as the
/// gateway does (no redirects, the same deadlines and failure classes).
fn client_for(resolved: &ResolvedConnection) -> Option<Arc<Upstream>> {
    let endpoint = aip_mcp::Endpoint::Http {
        url: resolved.url.clone(),
    };
    let mut connection = aip_mcp::Connection::new(resolved.name.clone(), endpoint);
    connection.credentials = match &resolved.credentials {
        Ok(credentials) => Ok(credentials.headers.clone()),
        Err(e) => Err(e.to_string()),
    };
    connection.tls = aip_mcp::Tls {
        ca_pem: resolved
            .credentials
            .as_ref()
            .ok()
            .and_then(|c| c.ca_pem.clone()),
        server_name: resolved.server_name.clone(),
    };
    connection.oauth = resolved
        .credentials
        .as_ref()
        .ok()
        .and_then(|c| c.oauth.clone());
    connection.timeout = resolved.timeout;
    connection.max_response_bytes =
        usize::try_from(resolved.max_response_bytes).unwrap_or(usize::MAX);
    connection.health_interval = resolved.health_interval;
    connection.health_deadline = resolved.health_deadline;
    connection.tool_prefix = resolved.tool_prefix.clone();
    connection.capabilities = aip_mcp::ClientCapabilities {
        sampling: resolved.capabilities.sampling,
        elicitation: resolved.capabilities.elicitation,
        roots: resolved.capabilities.roots,
    };
    Upstream::new(Arc::new(connection)).ok().map(Arc::new)
}

fn spawn_probe(key: ObjectKey, t: &Tracked, done: mpsc::UnboundedSender<ProbeResult>) {
    let resolved = t.resolved.clone();
    let upstream = t.upstream.clone();
    tokio::spawn(async move {
        let result = match (&resolved.credentials, upstream) {
            (Err(e), _) => Err(Failure::CredentialsMissing(e.to_string())),
            (Ok(_), None) => Err(Failure::InitFailed(Box::new(Failure::Malformed(
                "the connection cannot be built".to_owned(),
            )))),
            (Ok(_), Some(u)) => {
                // The health check has the connection's own deadline inside;
                // this bound only guards against a stuck implementation.
                let bound = resolved.health_deadline + Duration::from_secs(5);
                match tokio::time::timeout(bound, u.health_check()).await {
                    Ok(r) => r,
                    Err(_) => Err(Failure::Timeout),
                }
            }
        };
        let _ = done.send((key, resolved, result));
    });
}

fn take_evidence(t: &mut Tracked, e: &Evidence) {
    t.successes += e.successful_calls;
    t.network_failures += e.network_failures;
    if e.health == aip_proto::v1::HealthState::NeedsCredentials && e.credential_failures > 0 {
        let reason = format!(
            "pod {} saw the upstream refuse the credential ({})",
            e.pod,
            if e.http_status > 0 {
                format!("HTTP {}", e.http_status)
            } else {
                "unresolved".to_owned()
            }
        );
        t.evidence_needs_credentials = Some(reason);
        // Check at once whether the credential really is bad.
        t.due = Instant::now();
    } else if t.network_failures >= NETWORK_FAILURES_FOR_PROBE {
        let soon = Instant::now() + EVIDENCE_PROBE_DELAY;
        t.due = t.due.min(soon);
    }
}

/// A sidecar's report of a connection the operator cannot probe, as the
/// status to write; None when it says nothing yet (unchecked).
fn reported(e: &Evidence) -> Option<Outcome> {
    use aip_proto::v1::HealthState as Wire;
    let state = match e.health {
        Wire::Healthy => HealthState::Healthy,
        Wire::Degraded => HealthState::Degraded,
        Wire::Unreachable => HealthState::Unreachable,
        Wire::NeedsCredentials => HealthState::NeedsCredentials,
        Wire::Unchecked | Wire::Unspecified => return None,
    };
    let reason = (!e.reason.is_empty()).then(|| format!("pod {}: {}", e.pod, e.reason));
    Some(Outcome::Reported(Observed {
        state,
        reason: reason.filter(|_| state != HealthState::Healthy),
        http_status: u16::try_from(e.http_status).ok().filter(|s| *s > 0),
        required_scope: None,
        // A sidecar's word goes into a condition's reason only if it is
        // one: the API server would refuse the whole status otherwise.
        credential_reason: Some(e.credential_reason.clone())
            .filter(|r| state == HealthState::NeedsCredentials && is_reason(r)),
    }))
}

/// What a probe or a sidecar's report says of a connection's health.
#[derive(Clone)]
struct Observed {
    state: HealthState,
    reason: Option<String>,
    http_status: Option<u16>,
    required_scope: Option<String>,
    /// Why the credential is refused, as a condition reason, when more is
    /// known than "refused" ([`Failure::credential_reason`]).
    credential_reason: Option<String>,
}

/// The health a probe outcome means.
fn health_of(result: &Result<Vec<Value>, Failure>, successes: u64) -> Observed {
    let observed = |state, reason| Observed {
        state,
        reason,
        http_status: None,
        required_scope: None,
        credential_reason: None,
    };
    match result {
        Ok(_) => observed(HealthState::Healthy, None),
        Err(Failure::CredentialsMissing(why)) => {
            observed(HealthState::NeedsCredentials, Some(why.clone()))
        }
        Err(f) => {
            let scope = match f {
                Failure::Forbidden { scope } => scope.clone(),
                _ => None,
            };
            let state = if matches!(f.connection_effect(), ConnectionEffect::NeedsCredentials)
                || matches!(f, Failure::Forbidden { .. })
            {
                HealthState::NeedsCredentials
            } else if successes > 0 {
                HealthState::Degraded
            } else {
                HealthState::Unreachable
            };
            Observed {
                state,
                reason: Some(f.explained()),
                http_status: f.http_status(),
                required_scope: scope,
                credential_reason: f.credential_reason(),
            }
        }
    }
}

/// What a status write is about.
enum Outcome {
    /// A probe's result, and the successful calls sidecars reported since
    /// the previous probe.
    Probe(Result<Vec<Value>, Failure>, u64, Option<Arc<Upstream>>),
    /// A sidecar's word that the upstream refused the credential.
    Evidence(String),
    /// A connection the operator cannot probe (it authenticates as each
    /// pod): its health as a sidecar last reported it.
    Reported(Observed),
}

/// How often a status write that lost a race (someone else wrote the
/// status in between: a person accepting a tool) is tried again at once.
const WRITE_ATTEMPTS: usize = 3;

/// Writes the status an outcome calls for, if it differs from what is
/// there. The write names the resourceVersion it was computed from, so an
/// acceptance written in between is never overwritten: the write is
/// computed again from the new status.
async fn write(ctx: &Context, key: &ObjectKey, resolved: &ResolvedConnection, outcome: Outcome) {
    let api: Api<ToolConnection> = Api::namespaced(ctx.client.clone(), &key.namespace);
    for _ in 0..WRITE_ATTEMPTS {
        let current = match api.get_opt(&key.name).await {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(connection = %key.name, error = %crate::errors::Api(&e), "cannot read the ToolConnection");
                return;
            }
        };
        let Some(desired) = desired(ctx, &current, resolved, &outcome) else {
            return;
        };
        let patch = json!({
            "apiVersion": "aip.io/v1alpha1",
            "kind": "ToolConnection",
            "metadata": {"resourceVersion": current.resource_version()},
            "status": desired.status,
        });
        match api
            .patch_status(
                &key.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
        {
            Ok(_) => {
                ctx.metrics.reconciled("ToolConnection");
                announce(ctx, key, &current, &desired).await;
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                ctx.metrics.reconcile_failed("ToolConnection", "patch");
                tracing::warn!(connection = %key.name, error = %crate::errors::Api(&e), "ToolConnection status not written");
                return;
            }
        }
    }
    ctx.metrics.reconcile_failed("ToolConnection", "conflict");
    tracing::warn!(connection = %key.name, "ToolConnection status changed under every write; the next check writes it");
}

/// A status to write, and what it changes.
struct Desired {
    status: ToolConnectionStatus,
    before: ToolConnectionStatus,
    /// The ToolsDrifted message, when a tool is withheld by its pin or
    /// acceptance.
    withheld: Option<String>,
    /// The health state changed to one agents cannot list in.
    fell_to: Option<(HealthState, Option<String>)>,
}

/// The status `outcome` calls for; None when only a recent check time
/// would change.
fn desired(
    ctx: &Context,
    current: &ToolConnection,
    resolved: &ResolvedConnection,
    outcome: &Outcome,
) -> Option<Desired> {
    let before = current.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let spec = &current.spec;
    let rules = tool_ledger::Rules {
        trust: spec.tool_trust,
        pins: &spec.tool_pins,
        scan: spec.tool_scan,
    };
    let (observed, tools, listed) = match outcome {
        Outcome::Probe(result, successes, upstream) => {
            let observed = health_of(result, *successes);
            let (tools, listed) = match result {
                Ok(list) => {
                    let credentials = match &resolved.credentials {
                        Ok(c) => Credentials::new(&c.headers),
                        Err(_) => Credentials::new(&[]),
                    };
                    // What may be shown: the connection's credentials and
                    // the access tokens the probe was given, redacted.
                    let shown = |tool: &Value| {
                        let mut shown = credentials.redacted(tool);
                        if let Some(u) = &upstream {
                            u.redact_tokens(&mut shown);
                        }
                        shown
                    };
                    let recorder = tool_ledger::Recorder {
                        operator: &ctx.operator,
                        now: &now,
                    };
                    let judged = tool_ledger::judge(&rules, &before.tools, list, &shown, &recorder);
                    (judged.tools, judged.listed)
                }
                Err(_) => (
                    before.tools.clone(),
                    before.tool_count.unwrap_or(0) as usize,
                ),
            };
            (observed, tools, listed)
        }
        Outcome::Evidence(why) => (
            Observed {
                state: HealthState::NeedsCredentials,
                reason: Some(why.clone()),
                http_status: Some(401),
                required_scope: None,
                credential_reason: None,
            },
            before.tools.clone(),
            before.tool_count.unwrap_or(0) as usize,
        ),
        Outcome::Reported(observed) => (
            observed.clone(),
            before.tools.clone(),
            before.tool_count.unwrap_or(0) as usize,
        ),
    };
    let Observed {
        state,
        reason,
        http_status,
        required_scope: scope,
        credential_reason,
    } = observed;
    let previous = before.health.clone().unwrap_or_default();
    let changed_state = previous.state != state;
    let health = Health {
        state,
        reason: reason.clone(),
        http_status,
        required_scope: scope,
        last_check_time: Some(now.clone()),
        last_transition_time: if changed_state {
            Some(now.clone())
        } else {
            previous.last_transition_time.clone()
        },
    };
    let conditions = Conditions {
        before: &before.conditions,
        generation: current.metadata.generation,
        now: now.clone(),
    };
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        conditions.set(type_, ok, reason, message)
    };
    let credentials = match &resolved.credentials {
        Ok(_) => condition(
            "CredentialsResolved",
            true,
            "Resolved",
            "every referenced Secret key was found".to_owned(),
        ),
        Err(why) => condition("CredentialsResolved", false, "Unresolved", why.to_string()),
    };
    let listable = matches!(state, HealthState::Healthy | HealthState::Degraded);
    let healthy = condition(
        "Healthy",
        listable,
        &format!("{state:?}"),
        reason
            .clone()
            .unwrap_or_else(|| "the last health check succeeded".to_owned()),
    );
    let withheld = tool_ledger::withheld_message(spec.tool_trust, &tools);
    let tools_drifted = match (&withheld, rules.trust()) {
        (Some(why), _) => condition("ToolsDrifted", true, "Drifted", why.clone()),
        (None, Trust::FirstUse) => condition(
            "ToolsDrifted",
            false,
            "Accepted",
            "every listed tool matches what was accepted".to_owned(),
        ),
        (None, Trust::Pinned) => condition(
            "ToolsDrifted",
            false,
            "Pinned",
            "every listed tool matches its pin".to_owned(),
        ),
        (None, Trust::Listed) => condition(
            "ToolsDrifted",
            false,
            "NotPinned",
            "no tools are pinned: every tool is served as listed".to_owned(),
        ),
    };
    let judged = upstream_auth::judge(
        spec,
        &resolved.credentials,
        state,
        reason.as_deref(),
        credential_reason.as_deref(),
    );
    let authenticated = conditions.set_status(
        upstream_auth::TYPE,
        judged.status,
        &judged.reason,
        judged.message,
    );
    let status = ToolConnectionStatus {
        health: Some(health),
        tool_count: Some(u32::try_from(listed).unwrap_or(u32::MAX)),
        tools,
        conditions: vec![credentials, healthy, tools_drifted, authenticated],
        observed_generation: current.metadata.generation,
    };
    let ours_before = ToolConnectionStatus {
        conditions: ours(&before.conditions, CONDITIONS),
        ..before.clone()
    };
    if same_but_check_time(&ours_before, &status) {
        return None;
    }
    Some(Desired {
        status,
        before,
        withheld,
        fell_to: (changed_state && !listable && state != HealthState::Unchecked)
            .then_some((state, reason)),
    })
}

/// The Events, metric and audit records a written status calls for: a
/// changed set of withheld tools, each tool newly withheld or accepted, a
/// fall out of health.
async fn announce(ctx: &Context, key: &ObjectKey, current: &ToolConnection, desired: &Desired) {
    let reference = current.object_ref(&());
    let was_withheld = desired
        .before
        .conditions
        .iter()
        .find(|c| c.type_ == "ToolsDrifted")
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone());
    if desired.withheld.is_some() && was_withheld != desired.withheld {
        ctx.metrics.tools_drifted(&key.namespace, &key.name);
        publish(
            &ctx.recorder,
            EventType::Warning,
            "ToolsDrifted",
            "ToolCheck",
            desired.withheld.clone(),
            &reference,
        )
        .await;
    }
    let timestamp = crate::audit::now();
    for tool in &desired.status.tools {
        let before = desired.before.tools.iter().find(|t| t.name == tool.name);
        let record = |event, by, reason| crate::audit::ToolRecord {
            timestamp: timestamp.clone(),
            event,
            namespace: &key.namespace,
            connection: &key.name,
            tool: &tool.name,
            schema_hash: &tool.schema_hash,
            accepted_schema_hash: tool.accepted.as_ref().map(|a| a.schema_hash.as_str()),
            by,
            reason,
        };
        let newly_withheld = tool_ledger::drifted(tool.state)
            && before.is_none_or(|b| {
                !tool_ledger::drifted(b.state) || b.schema_hash != tool.schema_hash
            });
        if newly_withheld {
            crate::audit::record(&record(
                crate::audit::ToolEvent::ToolWithheld,
                None,
                tool.reason.as_deref(),
            ));
        }
        let accepted = tool.accepted.as_ref();
        let was_accepted = before.and_then(|b| b.accepted.as_ref());
        // A new acceptance: first use, or a person's (written into the
        // status this write was computed from, while the tool was still
        // withheld).
        let newly_accepted = accepted.is_some_and(|a| {
            was_accepted.map(|w| (&w.schema_hash, &w.metadata_hash))
                != Some((&a.schema_hash, &a.metadata_hash))
                || (before.is_some_and(|b| tool_ledger::drifted(b.state))
                    && tool.state == Some(aip_api::tool_connection::ToolState::Served))
        });
        if let (true, Some(a)) = (newly_accepted, accepted) {
            let by = a.by.as_deref();
            crate::audit::record(&record(crate::audit::ToolEvent::ToolAccepted, by, None));
            if by != Some(ctx.operator.as_str()) {
                let note = format!(
                    "{} accepted by {} (schema hash {})",
                    tool.name,
                    by.unwrap_or("an unknown user"),
                    a.schema_hash
                );
                publish(
                    &ctx.recorder,
                    EventType::Normal,
                    "ToolAccepted",
                    "ToolCheck",
                    Some(note),
                    &reference,
                )
                .await;
            }
        }
    }
    if let Some((state, reason)) = &desired.fell_to {
        publish(
            &ctx.recorder,
            EventType::Warning,
            &format!("{state:?}"),
            "HealthCheck",
            reason.clone(),
            &reference,
        )
        .await;
    }
}

/// Whether only lastCheckTime would change, and it is recent enough.
fn same_but_check_time(before: &ToolConnectionStatus, desired: &ToolConnectionStatus) -> bool {
    let strip = |s: &ToolConnectionStatus| {
        let mut s = s.clone();
        if let Some(h) = s.health.as_mut() {
            h.last_check_time = None;
        }
        s
    };
    if strip(before) != strip(desired) {
        return false;
    }
    let last = before
        .health
        .as_ref()
        .and_then(|h| h.last_check_time.as_ref());
    last.is_some_and(|Time(t)| {
        Timestamp::now().duration_since(*t).as_secs()
            < i64::try_from(CHECK_TIME_REFRESH.as_secs()).unwrap_or(i64::MAX)
    })
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aip_mcp::oauth::TokenError;

    #[test]
    fn a_failing_probe_is_degraded_only_while_calls_succeed() {
        let down = Err(Failure::Network("connection refused".to_owned()));
        assert_eq!(health_of(&down, 0).state, HealthState::Unreachable);
        assert_eq!(health_of(&down, 3).state, HealthState::Degraded);
        assert_eq!(
            health_of(&down, 3).reason.as_deref(),
            Some("upstream_unreachable")
        );
    }

    #[test]
    fn credential_evidence_in_a_probe_needs_credentials_whatever_the_calls() {
        let refused = health_of(&Err(Failure::InitAuthFailed(401)), 5);
        assert_eq!(
            (
                refused.state,
                refused.http_status,
                refused.credential_reason
            ),
            (HealthState::NeedsCredentials, Some(401), None)
        );
        let missing = health_of(
            &Err(Failure::CredentialsMissing(
                "spec.bearerToken: Secret t not found".to_owned(),
            )),
            0,
        );
        assert_eq!(missing.state, HealthState::NeedsCredentials);
        assert_eq!(
            missing.reason.as_deref(),
            Some("spec.bearerToken: Secret t not found")
        );
        // A token the authorization server refused is named by its code.
        let token = health_of(
            &Err(Failure::TokenUnavailable(TokenError::Refused {
                code: "invalid_grant".to_owned(),
                description: Some("Invalid token audience".to_owned()),
            })),
            0,
        );
        assert_eq!(token.state, HealthState::NeedsCredentials);
        assert_eq!(token.credential_reason.as_deref(), Some("InvalidGrant"));
    }

    fn report(state: aip_proto::v1::HealthState, credential_reason: &str) -> Evidence {
        Evidence {
            connection: ObjectKey::new("ns", "gh"),
            pod: "agent-0".to_owned(),
            health: state,
            reason: "upstream_token_unavailable: the token endpoint refused: invalid_grant"
                .to_owned(),
            http_status: 0,
            required_scope: String::new(),
            successful_calls: 0,
            network_failures: 0,
            credential_failures: 1,
            credential_reason: credential_reason.to_owned(),
        }
    }

    #[test]
    fn a_sidecars_credential_reason_is_taken_only_when_it_is_a_condition_reason() {
        use aip_proto::v1::HealthState as Wire;
        let taken = |e: &Evidence| match reported(e) {
            Some(Outcome::Reported(o)) => o.credential_reason,
            _ => panic!("not a report"),
        };
        let refused = report(Wire::NeedsCredentials, "InvalidGrant");
        assert_eq!(taken(&refused).as_deref(), Some("InvalidGrant"));
        // Not read from the text: an empty field is "no more known".
        assert_eq!(taken(&report(Wire::NeedsCredentials, "")), None);
        for bad in ["invalid grant", "Bad:", "9Lives", "x\ny", &"A".repeat(200)] {
            assert_eq!(taken(&report(Wire::NeedsCredentials, bad)), None, "{bad}");
        }
        // Nor from a state in which it means nothing.
        assert_eq!(taken(&report(Wire::Unreachable, "InvalidGrant")), None);
    }
}

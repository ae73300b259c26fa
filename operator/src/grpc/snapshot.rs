//! One Watch stream: the pod's current configuration, then every new one,
//! until the pod goes away, its token expires, the sidecar leaves, the
//! operator stops or starts serving another certificate. Every snapshot
//! carries the CA bundle the sidecar is to trust, and a new bundle is sent
//! at once with the configuration it goes with.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use aip_api::tool_connection::{ToolScan, ToolTrust};
use aip_proto::v1;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{EventType, Recorder};
use secrecy::ExposeSecret;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::{SentLog, lock};
use crate::certs::ServedRx;
use crate::events::{pod_reference, publish};
use crate::identity::PodIdentity;
use crate::index::{PodConfig, ResolvedConnection};
use crate::metrics::Metrics;

pub(super) struct Stream {
    pub id: PodIdentity,
    pub configs: watch::Receiver<Arc<PodConfig>>,
    pub tx: mpsc::Sender<Result<v1::Snapshot, Status>>,
    pub metrics: Arc<Metrics>,
    pub sent: SentLog,
    pub served: Option<ServedRx>,
    pub shutdown: CancellationToken,
    /// Where a pod that nothing governs is told why (a Warning Event on
    /// it): its gateway refuses every call and is never ready, so its
    /// agent containers do not start, and `kubectl describe pod` is where
    /// a person looks.
    pub recorder: Option<Recorder>,
}

impl Stream {
    pub async fn run(self) {
        let key = (self.id.namespace.clone(), self.id.pod.clone());
        let sent = self.sent.clone();
        let since = Instant::now();
        self.pump().await;
        lock(&sent).remove(&key);
        tracing::info!(
            namespace = %key.0,
            pod = %key.1,
            connected_s = since.elapsed().as_secs(),
            "sidecar's configuration stream ended"
        );
    }

    async fn pump(mut self) {
        let _connected = self.metrics.sidecar_connected();
        let expires = self.id.expires.map(|at| {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        let mut served = self.served.clone();
        let serving = served
            .as_mut()
            .map(|s| s.borrow_and_update().tls.cert_pem.clone());
        let mut told: Option<String> = None;
        loop {
            let config = self.configs.borrow_and_update().clone();
            self.tell_ungoverned(&config, &mut told);
            let version = config.version;
            let mut snapshot = to_proto(&config);
            if let Some(served) = &served {
                snapshot.trust_bundle_pem = served.borrow().bundle_pem.clone();
            }
            if self.tx.send(Ok(snapshot)).await.is_err() {
                return;
            }
            self.metrics.pushed();
            lock(&self.sent).insert(
                (self.id.namespace.clone(), self.id.pod.clone()),
                (version, Instant::now()),
            );
            let end = tokio::select! {
                changed = self.configs.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => Status::not_found(format!("pod {}/{} is gone", self.id.namespace, self.id.pod)),
                },
                () = sleep_until(expires) => Status::unauthenticated("the token has expired; reconnect with the refreshed one"),
                () = served_changed(&mut served) => {
                    let same = served.as_ref().map(|s| s.borrow().tls.cert_pem.clone()) == serving;
                    // A new bundle beside the same certificate is sent on;
                    // a new certificate is met at once by reconnecting,
                    // rather than whenever the connection happens to break.
                    if same {
                        continue;
                    }
                    Status::unavailable("the operator serves a new certificate; reconnect")
                }
                () = self.tx.closed() => return,
                () = self.shutdown.cancelled() => Status::unavailable("the operator is shutting down"),
            };
            let _ = self.tx.send(Err(end)).await;
            return;
        }
    }
}

impl Stream {
    /// A Warning Event `Ungoverned` on the pod when its configuration
    /// refuses everything (no policy selects it, several do, or the one
    /// that does was never accepted), once per reason and stream.
    fn tell_ungoverned(&self, config: &PodConfig, told: &mut Option<String>) {
        let (Some(recorder), None, Some(reason)) =
            (&self.recorder, &config.policy, &config.deny_reason)
        else {
            return;
        };
        // An unaccepted policy is the policy's own Event; a sidecar that
        // runs an earlier version keeps it.
        if told.as_ref() == Some(reason) || config.keep_previous {
            return;
        }
        *told = Some(reason.clone());
        let note = format!(
            "{reason}: its aip-sidecar gateway refuses every tool call and stays unready, so the pod's containers do not start until one AgentPolicy governs it"
        );
        let reference: ObjectReference =
            pod_reference(&self.id.namespace, &self.id.pod, Some(&self.id.uid));
        let recorder = recorder.clone();
        tokio::spawn(async move {
            publish(
                &recorder,
                EventType::Warning,
                "Ungoverned",
                "Govern",
                Some(note),
                &reference,
            )
            .await;
        });
    }
}

/// Until what `served` holds changes (never, for a fixed certificate).
async fn served_changed(served: &mut Option<ServedRx>) {
    match served {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The wire form of a pod's configuration. The only place credentials
/// leave `SecretString`.
pub fn to_proto(config: &PodConfig) -> v1::Snapshot {
    v1::Snapshot {
        version: config.version,
        policy: config.policy.as_ref().map(|p| v1::Policy {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            hash: p.hash.clone(),
            document_json: p.document_json.clone(),
        }),
        connections: config.connections.iter().map(|c| connection(c)).collect(),
        deny_reason: config.deny_reason.clone().unwrap_or_default(),
        keep_previous: config.keep_previous,
        approval: Some(v1::Approval {
            timeout_seconds: u32::try_from(config.approval_timeout().as_secs()).unwrap_or(u32::MAX),
        }),
        trust_bundle_pem: String::new(),
    }
}

/// One connection's wire form (also how the prober builds its client).
/// spec.auth as a sidecar receives it.
fn oauth(o: &aip_mcp::oauth::OAuth) -> v1::OAuth {
    use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant};
    use secrecy::ExposeSecret;
    let (issuer, token_endpoint) = match &o.server {
        AuthorizationServer::Issuer(i) => (i.clone(), String::new()),
        AuthorizationServer::TokenEndpoint(e) => (String::new(), e.clone()),
        AuthorizationServer::FromResource => (String::new(), String::new()),
    };
    let mut out = v1::OAuth {
        issuer,
        token_endpoint,
        client_id: o.client_id.clone(),
        scopes: o.scopes.clone(),
        resource: o.resource.clone(),
        omit_resource: !o.send_resource,
        ..v1::OAuth::default()
    };
    match &o.client_auth {
        ClientAuth::SecretBasic(s) => {
            out.client_secret = s.expose_secret().to_owned();
            out.client_auth_method = "client_secret_basic".to_owned();
        }
        ClientAuth::SecretPost(s) => {
            out.client_secret = s.expose_secret().to_owned();
            out.client_auth_method = "client_secret_post".to_owned();
        }
        ClientAuth::PrivateKeyJwt { key_pem, key_id } => {
            out.private_key_pem = key_pem.expose_secret().to_owned();
            out.key_id = key_id.clone().unwrap_or_default();
        }
        // The pod's projected token, relative to the sidecar's tokens.
        ClientAuth::AssertionFile(path) => {
            out.assertion_file = path.display().to_string();
        }
        ClientAuth::None => {}
    }
    match &o.grant {
        Grant::ClientCredentials => out.grant = v1::Grant::ClientCredentials.into(),
        Grant::JwtBearer { assertion } => {
            out.grant = v1::Grant::JwtBearer.into();
            out.grant_file = assertion.display().to_string();
        }
        Grant::TokenExchange {
            subject_token,
            audience,
            subject_issuer,
        } => {
            out.grant = v1::Grant::TokenExchange.into();
            out.grant_file = subject_token.display().to_string();
            out.audience = audience.clone().unwrap_or_default();
            out.subject_issuer = subject_issuer.clone().unwrap_or_default();
        }
    }
    out
}

pub fn connection(c: &ResolvedConnection) -> v1::Connection {
    let (headers, ca_pem, credentials_error) = match &c.credentials {
        Ok(cred) => (
            cred.headers
                .iter()
                .map(|(name, value)| v1::Header {
                    name: name.clone(),
                    value: value.expose_secret().to_owned(),
                })
                .collect(),
            cred.ca_pem.clone().unwrap_or_default(),
            String::new(),
        ),
        Err(e) => (Vec::new(), String::new(), e.to_string()),
    };
    v1::Connection {
        name: c.name.clone(),
        url: c.url.clone(),
        headers,
        credentials_error,
        timeout_ms: millis(c.timeout),
        max_response_bytes: c.max_response_bytes,
        health_interval_ms: millis(c.health_interval),
        health_deadline_ms: millis(c.health_deadline),
        tool_prefix: c.tool_prefix.clone(),
        capabilities: Some(v1::Capabilities {
            sampling: c.capabilities.sampling,
            elicitation: c.capabilities.elicitation,
            roots: c.capabilities.roots,
        }),
        tls: Some(v1::Tls {
            ca_pem,
            server_name: c.server_name.clone().unwrap_or_default(),
        }),
        tool_pins: c
            .tool_pins
            .iter()
            .map(|(name, pin)| {
                let pin = v1::ToolPin {
                    schema_hash: pin.schema_hash.clone(),
                    metadata_hash: pin.metadata_hash.clone().unwrap_or_default(),
                };
                (name.clone(), pin)
            })
            .collect(),
        tool_trust: match c.tool_trust {
            None => v1::ToolTrust::Unspecified,
            Some(ToolTrust::Listed) => v1::ToolTrust::Listed,
            Some(ToolTrust::Pinned) => v1::ToolTrust::Pinned,
            // Once the operator recorded the first listing, its acceptances
            // are the pins; before, each sidecar pins what it first sees.
            Some(ToolTrust::FirstUse) if c.tool_pins.is_empty() => v1::ToolTrust::FirstUse,
            Some(ToolTrust::FirstUse) => v1::ToolTrust::Pinned,
        }
        .into(),
        oauth: c
            .credentials
            .as_ref()
            .ok()
            .and_then(|cr| cr.oauth.as_ref())
            .map(oauth),
        tool_scan: match c.tool_scan {
            None => v1::ToolScan::Unspecified,
            Some(ToolScan::Warn) => v1::ToolScan::Warn,
            Some(ToolScan::Block) => v1::ToolScan::Block,
            Some(ToolScan::Off) => v1::ToolScan::Off,
        }
        .into(),
    }
}

fn millis(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

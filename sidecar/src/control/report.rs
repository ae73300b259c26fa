//! Reports to the operator: the snapshot version in force (or why one was
//! refused) and what the gateway saw of each connection since the last
//! report — its health state, successes and network failures — which the
//! operator weighs with its own probes for the ToolConnection's status.

use std::sync::Arc;

use aip_proto::v1::config_client::ConfigClient;
use aip_proto::v1::{self, ReportRequest};
use secrecy::SecretString;
use tonic::transport::Channel;

use super::authorize;
use crate::upstream::health::{ConnectionState, HealthState};

/// How the gateway's view of its connections is read for reports.
pub type EvidenceFn = Arc<dyn Fn() -> Vec<v1::ConnectionEvidence> + Send + Sync>;

/// What the gateway knows of its connections, as report evidence.
pub fn evidence_of(connections: &[Arc<ConnectionState>]) -> Vec<v1::ConnectionEvidence> {
    connections
        .iter()
        .map(|c| {
            let health = c.health();
            let (successful_calls, network_failures) = c.take_evidence();
            let required_scope = c
                .gates()
                .into_values()
                .find_map(|g| g.required_scope)
                .unwrap_or_default();
            v1::ConnectionEvidence {
                connection: c.connection().name.clone(),
                health: wire_state(health.state) as i32,
                reason: health.reason.unwrap_or_default(),
                http_status: health.http_status.map_or(0, u32::from),
                required_scope,
                successful_calls,
                network_failures,
                credential_failures: u64::from(health.state == HealthState::NeedsCredentials),
                credential_reason: health
                    .failure
                    .as_ref()
                    .and_then(aip_mcp::Failure::credential_reason)
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// Sends one report; a failure is logged (the next report says it all again).
pub(super) async fn report(
    client: &mut ConfigClient<Channel>,
    token: &SecretString,
    applied_version: u64,
    refused_reason: String,
    connections: Vec<v1::ConnectionEvidence>,
) {
    let mut request = tonic::Request::new(ReportRequest {
        applied_version,
        refused_reason,
        connections,
    });
    if authorize(&mut request, token).is_err() {
        return;
    }
    if let Err(e) = client.report(request).await {
        tracing::warn!(error = %e.message(), "report to the operator failed");
    }
}

fn wire_state(state: HealthState) -> v1::HealthState {
    match state {
        HealthState::Unchecked => v1::HealthState::Unchecked,
        HealthState::Healthy => v1::HealthState::Healthy,
        HealthState::Degraded => v1::HealthState::Degraded,
        HealthState::Unreachable => v1::HealthState::Unreachable,
        HealthState::NeedsCredentials => v1::HealthState::NeedsCredentials,
    }
}

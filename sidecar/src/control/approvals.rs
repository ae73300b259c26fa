//! Asks in Kubernetes mode.

use std::path::PathBuf;
use std::time::Duration;

use aip_proto::v1;
use tokio::time::Instant;

use super::{Backoff, Retry, UnlessRefused, authorize, read_token};

/// The longest wait between attempts to resume an ask's stream.
const APPROVAL_RETRY_MAX: Duration = Duration::from_secs(2);

/// Asks in Kubernetes mode: each becomes an ApprovalRequest the operator
/// creates; the decision comes back on the same stream. A broken stream is
/// resumed by the request's name, so an operator restart loses nothing;
/// dropping the wait ends the stream, and the operator withdraws the request.
pub struct OperatorApprovals {
    pub(super) link: std::sync::Arc<super::Link>,
    pub(super) token_file: PathBuf,
    pub(super) instance: String,
}

impl crate::approvals::Remote for OperatorApprovals {
    fn ask(
        &self,
        ask: crate::approvals::Ask,
        timeout: Duration,
    ) -> crate::approvals::BoxFuture<'_, aip_policy::Approval> {
        Box::pin(self.wait(ask, timeout))
    }
}

impl OperatorApprovals {
    async fn wait(&self, ask: crate::approvals::Ask, timeout: Duration) -> aip_policy::Approval {
        use aip_policy::Approval;
        use v1::approval_update::Decision;
        // The operator expires the request; this only bounds a wait for an
        // operator that never comes back.
        let give_up = Instant::now() + timeout + Duration::from_secs(30);
        let mut name = String::new();
        // A person may decide while the operator is away: once it is back,
        // the decision should reach the held call within moments, not
        // after the configuration stream's 15 s. A sidecar holds few asks,
        // so retrying every 2 s at most costs the operator little.
        let mut backoff = Backoff::up_to(APPROVAL_RETRY_MAX);
        loop {
            let mut client = self.link.client();
            let mut request = tonic::Request::new(v1::ApprovalRequest {
                connection: ask.connection.clone(),
                tool: ask.tool.clone(),
                arguments_json: ask.arguments.to_string(),
                arguments_hash: ask.arguments_hash.clone(),
                policy_version: 0,
                resume_name: name.clone(),
                sidecar_instance: self.instance.clone(),
            });
            let authorized = read_token(&self.token_file).and_then(|t| authorize(&mut request, &t));
            let stream = match authorized {
                Ok(()) => client.request_approval(request).await,
                Err(e) => Err(e),
            };
            match stream {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Ok(Some(update)) = stream.message().await {
                        if name.is_empty() {
                            name = update.name.clone();
                            tracing::info!(approval = %name, tool = %ask.tool, "waiting for a decision on ApprovalRequest");
                        }
                        match Decision::try_from(update.decision) {
                            Ok(Decision::Approved) => return Approval::Approved,
                            Ok(Decision::Denied | Decision::Withdrawn) => return Approval::Denied,
                            Ok(Decision::Expired) => return Approval::TimedOut,
                            _ => {}
                        }
                    }
                    backoff.reset();
                }
                // The operator cannot take this ask at all: refuse the call.
                Err(e) if !UnlessRefused.worth_retrying(e.code()) => {
                    tracing::warn!(error = %e.message(), tool = %ask.tool, "the operator refused the approval request; the call is refused");
                    return Approval::Denied;
                }
                Err(e) => tracing::warn!(error = %e.message(), "approval stream lost; resuming"),
            }
            let wait = backoff.next_wait();
            if Instant::now() + wait >= give_up {
                return Approval::TimedOut;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

//! Human approval for `ask` rules, standalone flavour: pending asks are held
//! in memory, listed at `GET /approvals` on the admin port and decided by
//! `POST /approvals/{id}` with the operator's token. (In Kubernetes the
//! decision comes through the API server instead, never through a loopback
//! route, because every container of a pod shares loopback.)
//!
//! A wait that is dropped — the agent cancelled the call or its session
//! ended — withdraws its ask: a later decision finds nothing to release.

use aip_service::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use aip_policy::{Approval, Withdrawal};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// What an approver sees of a pending ask.
#[derive(Debug, Clone, Serialize)]
pub struct Pending {
    pub id: String,
    pub tool: String,
    pub connection: String,
    /// DLP-redacted arguments.
    pub arguments: Value,
    pub created: String,
    pub expires: String,
}

struct Entry {
    view: Pending,
    decide: oneshot::Sender<bool>,
}

pub struct LocalApprovals {
    pending: Mutex<BTreeMap<String, Entry>>,
    /// Bumped whenever the pending set changes, so watchers need not poll.
    changes: watch::Sender<u64>,
    /// Where asks go instead, once set (Kubernetes mode).
    remote: OnceLock<Arc<dyn Remote>>,
}

/// One held call, as an approver will see it.
#[derive(Debug, Clone)]
pub struct Ask {
    pub tool: String,
    pub connection: String,
    /// DLP-redacted.
    pub arguments: Value,
    /// `aip_policy::hash::arguments_hash` of the arguments as sent.
    pub arguments_hash: String,
    /// Why the wait was given up, set by whoever drops it before dropping
    /// it (unset: the agent's connection closed under it).
    pub ended: Ended,
}

/// Why a held call's wait was dropped.
pub type Ended = Arc<OnceLock<Withdrawal>>;

/// How an ask ended, and the request that held it (Kubernetes mode: the
/// ApprovalRequest's name, once the operator named it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub approval: Approval,
    pub request: Option<String>,
}

impl Answer {
    pub fn of(approval: Approval) -> Answer {
        Answer {
            approval,
            request: None,
        }
    }
}

/// An approver elsewhere. Dropping the future withdraws the ask, for the
/// reason in `Ask::ended`.
pub trait Remote: Send + Sync {
    fn ask(&self, ask: Ask, timeout: Duration) -> BoxFuture<'_, Answer>;
}

pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("no pending approval {0} (decided, expired or withdrawn)")]
    NotFound(String),
}

impl LocalApprovals {
    pub fn new() -> Arc<LocalApprovals> {
        Arc::new(LocalApprovals {
            pending: Mutex::new(BTreeMap::new()),
            changes: watch::Sender::new(0),
            remote: OnceLock::new(),
        })
    }

    /// Changes whenever an ask is added, decided, expired or withdrawn.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Sends asks to `remote` from now on (Kubernetes mode: the operator).
    pub fn route_to(&self, remote: Arc<dyn Remote>) {
        let _ = self.remote.set(remote);
    }

    /// Waits for a person's answer, at most `timeout`. Dropping the returned
    /// future withdraws the ask.
    pub async fn ask(self: &Arc<Self>, ask: Ask, timeout: Duration) -> Answer {
        if let Some(remote) = self.remote.get() {
            return remote.ask(ask, timeout).await;
        }
        let Ask {
            tool,
            connection,
            arguments,
            ..
        } = ask;
        let (tool, connection) = (tool.as_str(), connection.as_str());
        let id = format!("ap-{:016x}", rand::random::<u64>());
        let view_id = id.clone();
        let (tx, rx) = oneshot::channel();
        let created = SystemTime::now();
        let view = Pending {
            id: id.clone(),
            tool: tool.to_owned(),
            connection: connection.to_owned(),
            arguments,
            created: humantime::format_rfc3339_millis(created).to_string(),
            expires: humantime::format_rfc3339_millis(created + timeout).to_string(),
        };
        lock(&self.pending).insert(id.clone(), Entry { view, decide: tx });
        self.changed();
        let _withdraw = Withdraw {
            approvals: self.clone(),
            id,
        };
        let approval = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(true)) => Approval::Approved,
            Ok(Ok(false)) => Approval::Denied,
            // Timed out, or the entry vanished: either way no approval.
            Ok(Err(_)) | Err(_) => Approval::TimedOut,
        };
        Answer {
            approval,
            request: Some(view_id),
        }
    }

    /// Pending asks, oldest first.
    pub fn list(&self) -> Vec<Pending> {
        let mut list: Vec<Pending> = lock(&self.pending)
            .values()
            .map(|e| e.view.clone())
            .collect();
        // RFC 3339 UTC timestamps of one format sort as text.
        list.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
        list
    }

    /// Releases (or refuses) exactly the one call waiting on `id`.
    pub fn decide(&self, id: &str, approve: bool) -> Result<Pending, DecideError> {
        let entry = lock(&self.pending)
            .remove(id)
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        self.changed();
        let view = entry.view.clone();
        entry
            .decide
            .send(approve)
            .map_err(|_| DecideError::NotFound(id.to_owned()))?;
        Ok(view)
    }
}

/// Removes the ask when its wait ends for any reason.
struct Withdraw {
    approvals: Arc<LocalApprovals>,
    id: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if lock(&self.approvals.pending).remove(&self.id).is_some() {
            self.approvals.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy() -> Ask {
        Ask {
            tool: "deploy".to_owned(),
            connection: "c".to_owned(),
            arguments: Value::Null,
            arguments_hash: aip_policy::hash::arguments_hash(&Value::Null),
            ended: Ended::default(),
        }
    }

    /// Waits (on change events) until some ask is pending; returns its id.
    async fn next_pending(approvals: &LocalApprovals) -> String {
        let mut changes = approvals.subscribe();
        loop {
            if let Some(p) = approvals.list().first() {
                return p.id.clone();
            }
            changes.changed().await.unwrap();
        }
    }

    #[tokio::test]
    async fn approve_deny_timeout_and_withdraw() {
        let approvals = LocalApprovals::new();
        let a = approvals.clone();
        let waiting = tokio::spawn(async move { a.ask(deploy(), Duration::from_secs(60)).await });
        let id = next_pending(&approvals).await;
        approvals.decide(&id, true).unwrap();
        assert_eq!(waiting.await.unwrap().approval, Approval::Approved);
        assert!(
            matches!(approvals.decide(&id, true), Err(DecideError::NotFound(_))),
            "one decision per ask"
        );

        let a = approvals.clone();
        let denied = tokio::spawn(async move { a.ask(deploy(), Duration::from_secs(60)).await });
        let id = next_pending(&approvals).await;
        approvals.decide(&id, false).unwrap();
        assert_eq!(denied.await.unwrap().approval, Approval::Denied);

        let timed_out = approvals.ask(deploy(), Duration::from_millis(1)).await;
        assert_eq!(timed_out.approval, Approval::TimedOut);
        assert!(approvals.list().is_empty());

        let a = approvals.clone();
        let withdrawn = tokio::spawn(async move { a.ask(deploy(), Duration::from_secs(60)).await });
        let id = next_pending(&approvals).await;
        withdrawn.abort();
        let _ = withdrawn.await;
        assert!(
            approvals.list().is_empty(),
            "a dropped wait withdraws its ask"
        );
        assert!(
            matches!(approvals.decide(&id, true), Err(DecideError::NotFound(_))),
            "a withdrawn ask releases nothing"
        );
    }
}

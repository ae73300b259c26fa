//! What the feeds tell the rest of the operator: which objects an index
//! update touched, so their status writers look again.

use tokio::sync::mpsc;

use crate::index::{Index, ObjectKey};

/// Where the feeds send the keys their updates touched.
#[derive(Clone)]
pub struct Touched {
    pub policies: mpsc::UnboundedSender<ObjectKey>,
    pub connections: mpsc::UnboundedSender<ObjectKey>,
    /// Pods deleted (after the index forgot them): their pending
    /// ApprovalRequests are withdrawn.
    pub pods_gone: mpsc::UnboundedSender<ObjectKey>,
}

impl Touched {
    pub(super) fn policies(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            let _ = self.policies.send(k);
        }
    }

    /// After a Secret change: the connections that read it.
    pub(super) fn readers(&self, index: &Index, namespace: &str, secret: &str) {
        for name in index.connections_reading(namespace, secret) {
            let _ = self.connections.send(ObjectKey::new(namespace, &name));
        }
    }
}

//! The values a request carries through the gate: what the transport knows
//! (`Caller`, `Input`), the request on its way (`Call`, built once by the
//! agent edge, with its era as `Era`), what goes back inside the gate
//! (`Reply`: a value, or a server's text passed on), and the gateway's own request ids
//! (`Ids`). No behaviour beyond the era's rules: every place where the two
//! eras differ asks the era, so the next revision is one more variant whose
//! rules the compiler asks for. Which era a message speaks is the agent
//! edge's decision (`edge.rs`), made once.

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aip_policy::Evaluator;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::upstream::health::ConnectionState;

/// The MCP revision a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-11-25 and before: sessions, `initialize`, requests from servers
    /// on the agent's stream.
    Legacy,
    /// 2026-07-28: stateless, capabilities in each request's `_meta`, a
    /// server's question answered by a retry.
    Modern,
}

impl Era {
    /// Results carry the era's `resultType` and `_meta` (server info,
    /// cache hints).
    pub fn shapes_results(self) -> bool {
        match self {
            Era::Legacy => false,
            Era::Modern => true,
        }
    }

    /// The tasks extension: an ask may become a task, a server's task may be
    /// relayed, and `tasks/*` are methods the agent may call.
    pub fn has_tasks(self) -> bool {
        match self {
            Era::Legacy => false,
            Era::Modern => true,
        }
    }

    /// A server's question during a call reaches the agent as
    /// `input_required`, answered by a retry carrying `requestState`
    /// (rather than as a request on the agent's stream).
    pub fn answers_by_retry(self) -> bool {
        match self {
            Era::Legacy => false,
            Era::Modern => true,
        }
    }

    /// Log notes of a call reach the agent without it asking for them in
    /// the request's `_meta`.
    pub fn logs_unasked(self) -> bool {
        match self {
            Era::Legacy => true,
            Era::Modern => false,
        }
    }

    /// Resource subscriptions belong to a session (`resources/subscribe`)
    /// rather than to a stream (`subscriptions/listen`).
    pub fn has_sessions(self) -> bool {
        match self {
            Era::Legacy => true,
            Era::Modern => false,
        }
    }
}

/// What a transport knows of a message before the gate reads it: how it
/// came, and the agent's stream for messages about it (progress, logging,
/// requests a server makes of it), if the transport has one. The gate
/// decides everything else (era, session, whether this request may stream).
#[derive(Debug)]
pub struct Caller {
    pub transport: Transport,
    pub events: Option<mpsc::Sender<Value>>,
}

/// The transport a message came over.
#[derive(Debug)]
pub enum Transport {
    /// Streamable HTTP, with the request's headers (the legacy era's
    /// session, the 2026-07-28 era's mirrored headers).
    Http(hyper::HeaderMap),
    /// stdio: one agent, one session, its stream always open.
    Stdio,
}

/// The bytes of one message, or the size of one too long to be held.
#[derive(Debug, Clone)]
pub enum Input {
    Bytes(Bytes),
    TooLong { size: usize },
}

/// One request on its way through the gate, built once by the agent edge:
/// who sent it (its session), its era, its stream (only where the request
/// may stream), the policy it arrived under, what cancels it, and for a
/// `tools/call` the tool's route, looked up once.
#[derive(Debug, Clone)]
pub struct Call {
    pub session: String,
    pub events: Option<mpsc::Sender<Value>>,
    pub era: Era,
    pub evaluator: Arc<Evaluator>,
    /// Fired by the agent's `notifications/cancelled` naming the request,
    /// or the end of its session.
    pub cancel: CancellationToken,
    /// A `tools/call`'s tool: where it leads (None for an unknown tool, or
    /// one only a connection still starting may hold).
    pub route: Option<Route>,
    /// Whether a `tools/call` names a tool of the catalog (its metric
    /// label is then the name, else "other").
    pub known: bool,
    /// Why a `tools/call`'s tool is withheld (its pin, the policy's
    /// `schema_hash`, or the poisoning scan): refused with -32013 whatever
    /// the policy says.
    pub withheld: Option<Arc<str>>,
    /// Whether the reply may be [`Reply::Text`]: HTTP writes a body as it
    /// is given; stdio's writer and a task's record take values.
    pub text_replies: bool,
}

impl Call {
    /// Queues a message for the agent on this request's stream; false when
    /// it cannot go (no stream, or the agent is not reading it).
    pub(super) fn send(&self, message: Value) -> bool {
        self.events
            .as_ref()
            .is_some_and(|events| events.try_send(message).is_ok())
    }
}

/// A tool as the agent sees it, and where it really lives.
#[derive(Clone)]
pub struct Route {
    pub connection: Arc<ConnectionState>,
    pub upstream_name: String,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("connection", &self.connection.connection().name)
            .field("upstream_name", &self.upstream_name)
            .finish()
    }
}

/// What to send back for one agent message.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A JSON-RPC response.
    Message(Value),
    /// A JSON-RPC response as the JSON text to send, final: a server's
    /// result that nothing had to change in, passed on as it came but for
    /// the agent's id (and a 2026-07-28 result's `resultType` and `_meta`),
    /// for a transport that writes text as it is ([`Call::text_replies`]).
    Text(bytes::Bytes),
    /// Nothing: a notification, an agent's reply, or a canceled call.
    Nothing,
}

impl Reply {
    /// The response as a value, for what takes values (stdio's writer, a
    /// task's record); None for nothing. A `Text` is read back, which its
    /// makers avoid by leaving `Call::text_replies` off for those.
    pub fn into_message(self) -> Option<Value> {
        match self {
            Reply::Message(message) => Some(message),
            Reply::Text(text) => serde_json::from_slice(&text).ok(),
            Reply::Nothing => None,
        }
    }
}

/// The gateway's own request ids (`aip-N`), one counter for every
/// component that sends requests: clones share it.
#[derive(Debug, Clone)]
pub struct Ids(Arc<AtomicU64>);

impl Default for Ids {
    fn default() -> Ids {
        Ids(Arc::new(AtomicU64::new(1)))
    }
}

impl Ids {
    /// An id no other request of this gateway has.
    pub fn fresh(&self) -> String {
        // Every call takes one: written without the formatter.
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n);
        let mut id = String::with_capacity(4 + digits.len());
        id.push_str("aip-");
        id.push_str(digits);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::Ids;
    use std::sync::atomic::Ordering;

    #[test]
    fn ids_count_up_in_decimal() {
        let ids = Ids::default();
        assert_eq!(ids.fresh(), "aip-1");
        ids.0.store(9, Ordering::Relaxed);
        assert_eq!(
            (ids.fresh(), ids.fresh()),
            ("aip-9".into(), "aip-10".into())
        );
        ids.0.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(ids.fresh(), format!("aip-{}", u64::MAX));
    }
}

//! The values a request carries through the gate: who sent it (`Caller`),
//! the protocol era it speaks (`Era`, decided once, at the agent edge), and
//! what goes back (`Reply`), and the gateway's own request ids (`Ids`). No behaviour beyond the era's rules: every
//! place where the two eras differ asks the era, so the next revision is
//! one more variant whose rules the compiler asks for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::mpsc;

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
    /// Of a message, by what its body claims.
    pub fn of(message: &Value) -> Era {
        if aip_mcp::modern::claims_modern(message) {
            Era::Modern
        } else {
            Era::Legacy
        }
    }

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

/// Who is talking: the agent's session at the gateway, the era of its
/// request, and the stream on which messages about the request reach it
/// (progress, logging, requests a server makes of it), if its transport
/// has one.
#[derive(Debug, Clone)]
pub struct Caller {
    pub session: String,
    pub events: Option<mpsc::Sender<Value>>,
    pub era: Era,
}

impl Caller {
    /// A legacy caller without a stream for messages about its request.
    pub fn new(session: impl Into<String>) -> Caller {
        Caller {
            session: session.into(),
            events: None,
            era: Era::Legacy,
        }
    }

    /// Queues a message for the agent on this request's stream; false when
    /// it cannot go (no stream, or the agent is not reading it).
    pub(super) fn send(&self, message: Value) -> bool {
        self.events
            .as_ref()
            .is_some_and(|events| events.try_send(message).is_ok())
    }
}

/// What to send back for one agent message.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A JSON-RPC response.
    Message(Value),
    /// Nothing: a notification, an agent's reply, or a canceled call.
    Nothing,
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
        format!("aip-{}", self.0.fetch_add(1, Ordering::Relaxed))
    }
}

//! One connection's client, whichever transport its server speaks.

use std::sync::Arc;

use serde_json::Value;

use crate::connection::{Connection, Endpoint};
use crate::failure::Failure;
use crate::http::HttpUpstream;
use crate::protocol::{Exchange, Outgoing, Related};
use crate::stdio::StdioUpstream;

/// One connection's client, whichever transport its server speaks.
#[allow(clippy::large_enum_variant)] // one per connection: boxing would buy nothing
pub enum Upstream {
    Http(HttpUpstream),
    Stdio(StdioUpstream),
}

impl Upstream {
    pub fn new(connection: Arc<Connection>) -> Result<Upstream, String> {
        Ok(match connection.endpoint {
            Endpoint::Http { .. } => Upstream::Http(HttpUpstream::new(connection)?),
            Endpoint::Stdio { .. } => Upstream::Stdio(StdioUpstream::new(connection)?),
        })
    }

    /// Redacts the access tokens an HTTP connection was given from
    /// `value` (what its server sent); how many were found.
    pub fn redact_tokens(&self, value: &mut Value) -> usize {
        match self {
            Upstream::Http(h) => h.redact_tokens(value),
            Upstream::Stdio(_) => 0,
        }
    }

    /// Whether requests go as HTTP bodies (so a caller's text is used).
    pub fn is_http(&self) -> bool {
        matches!(self, Upstream::Http(_))
    }

    pub fn connection(&self) -> &Connection {
        match self {
            Upstream::Http(u) => u.connection(),
            Upstream::Stdio(u) => u.connection(),
        }
    }

    /// Sends one request and returns its response; never re-sent. What the
    /// server says about it meanwhile is dropped.
    pub async fn request(&self, message: &Value) -> Result<Exchange, Failure> {
        self.request_related(message, None).await
    }

    /// Sends one request and returns its response; never re-sent. Server
    /// messages that belong to it and arrive before the response (its
    /// progress and logging notifications, requests the server makes of the
    /// client while working on it) go to `related`, in arrival order.
    pub async fn request_related(
        &self,
        message: impl Into<Outgoing<'_>>,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        let outgoing = message.into();
        let message = outgoing.message;
        // Boxed: the HTTP transport's future is several kilobytes, and a
        // caller's state would carry (and move) it on every message.
        let exchange = match self {
            Upstream::Http(u) => Box::pin(u.request(outgoing, related)).await,
            // A stdio server gets the message written as one line.
            Upstream::Stdio(u) => Box::pin(u.request(message, related)).await,
        }?;
        if message.get("method").and_then(Value::as_str) == Some("tools/call") {
            match exchange.response().get("result") {
                Some(result) if crate::protocol::is_task(result) && self.offers_tasks(message) => {
                    crate::protocol::check_task(result)?
                }
                _ => crate::protocol::check_call_result(exchange.response())?,
            }
        }
        Ok(exchange)
    }

    /// Whether the capabilities the server last declared have `path`
    /// (see `HttpUpstream::server_offers`); never for a stdio server, whose
    /// notes are not heard.
    pub fn server_offers(&self, path: &[&str]) -> bool {
        match self {
            Upstream::Http(u) => u.server_offers(path),
            Upstream::Stdio(_) => false,
        }
    }

    /// Whether `message` goes to the server with the tasks extension
    /// declared (so that it may answer with a task).
    pub fn offers_tasks(&self, message: &Value) -> bool {
        match self {
            Upstream::Http(u) => u.offers_tasks(message),
            Upstream::Stdio(_) => false,
        }
    }

    /// Sends a notification, or a reply to a request the server made.
    pub async fn notify(&self, message: &Value) -> Result<(), Failure> {
        match self {
            Upstream::Http(u) => u.notify(message).await,
            Upstream::Stdio(u) => u.notify(message).await,
        }
    }

    /// Lets go of the server at shutdown: a stdio server is stopped and
    /// waited for; an HTTP session is ended with DELETE.
    pub async fn close(&self) {
        match self {
            Upstream::Http(u) => u.close().await,
            Upstream::Stdio(u) => u.close().await,
        }
    }

    /// The capabilities the server last declared (`{}` before it has).
    pub fn server_capabilities(&self) -> Value {
        match self {
            Upstream::Http(u) => u.server_capabilities(),
            Upstream::Stdio(u) => u.server_capabilities(),
        }
    }

    /// The era the server was last found to speak: true for 2026-07-28
    /// (stdio servers are spoken to in the legacy era).
    pub fn modern(&self) -> bool {
        match self {
            Upstream::Http(u) => u.modern() == Some(true),
            Upstream::Stdio(_) => false,
        }
    }

    /// What the server says outside any call that agents may hear: its
    /// prompts or resources list changed, a resource was updated (HTTP
    /// servers; a stdio server's are not heard yet).
    pub fn notes(&self) -> Option<tokio::sync::broadcast::Receiver<Value>> {
        match self {
            Upstream::Http(u) => Some(u.notes()),
            Upstream::Stdio(_) => None,
        }
    }

    /// The resources agents want updates of (HTTP servers; a stdio
    /// server's updates are not heard).
    pub fn watch_resources(&self, uris: std::collections::BTreeSet<String>) {
        if let Upstream::Http(u) = self {
            u.watch_resources(uris);
        }
    }

    /// The server's tasks agents want notifications of (modern HTTP
    /// servers).
    pub fn watch_tasks(&self, ids: std::collections::BTreeSet<String>) {
        if let Upstream::Http(u) = self {
            u.watch_tasks(ids);
        }
    }

    /// The resources the server is to be subscribed to, as agents watch
    /// them now.
    pub fn watched_resources(&self) -> std::collections::BTreeSet<String> {
        match self {
            Upstream::Http(u) => u.watched.borrow().clone(),
            Upstream::Stdio(_) => Default::default(),
        }
    }

    /// Signalled when the server says its tool list changed.
    pub fn list_changed(&self) -> &tokio::sync::Notify {
        match self {
            Upstream::Http(u) => u.list_changed(),
            Upstream::Stdio(u) => u.list_changed(),
        }
    }

    /// Lists the server's tools (all pages) within the health deadline.
    pub async fn health_check(&self) -> Result<Vec<Value>, Failure> {
        match self {
            Upstream::Http(u) => u.health_check().await,
            Upstream::Stdio(u) => u.health_check().await,
        }
    }
}

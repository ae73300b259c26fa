//! MCP clients to the servers the gateway brokers.

pub mod failure;
pub mod health;
pub mod http;
pub mod listen;
pub mod sse;
pub mod stdio;

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

pub use failure::{ConnectionEffect, Failure, SessionEffect};

use crate::config::{Connection, Endpoint};
use http::{Exchange, HttpUpstream};
use stdio::StdioUpstream;

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
        message: &Value,
        related: Option<&Related>,
    ) -> Result<Exchange, Failure> {
        match self {
            Upstream::Http(u) => u.request(message, related).await,
            Upstream::Stdio(u) => u.request(message, related).await,
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

/// What a server sends when its tool list changed: the catalog is
/// refreshed at once rather than at the next interval.
pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";

/// Where the server messages related to one request go.
pub type Related = mpsc::UnboundedSender<Value>;

/// The client capabilities a connection offers its server: none unless it
/// opts in.
pub fn client_capabilities(connection: &Connection) -> Value {
    let c = connection.capabilities;
    let mut caps = serde_json::Map::new();
    if c.sampling {
        caps.insert("sampling".into(), json!({}));
    }
    if c.elicitation {
        caps.insert("elicitation".into(), json!({}));
    }
    if c.roots {
        caps.insert("roots".into(), json!({"listChanged": false}));
    }
    Value::Object(caps)
}

/// A server that never stops paging cannot stall a health check.
const MAX_LIST_PAGES: usize = 64;

/// Lists every page of a server's tools/list: `send` makes one exchange of
/// the request it is given (which still needs an id).
async fn list_all_tools<F, Fut>(mut send: F) -> Result<Vec<Value>, Failure>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = Result<Exchange, Failure>>,
{
    let mut tools = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_LIST_PAGES {
        let mut list = json!({"jsonrpc": "2.0", "method": "tools/list"});
        if let Some(c) = cursor.take() {
            list["params"] = json!({ "cursor": c });
        }
        let exchange = send(list).await?;
        tools.extend(http::tools_of(&exchange.response)?);
        match exchange.response.pointer("/result/nextCursor") {
            Some(Value::String(next)) if !next.is_empty() => cursor = Some(json!(next)),
            _ => return Ok(tools),
        }
    }
    Err(Failure::Malformed(format!(
        "tools/list did not end within {MAX_LIST_PAGES} pages"
    )))
}

//! `subscriptions/listen` (MCP 2026-07-28): an agent's stream of the
//! notifications it asked for, each tagged with its subscription. What it
//! hears is what the policy lets it see: the gateway's own tool list
//! changes (announced only when the filtered list really changed), and its
//! servers' prompts and resources list changes where the policy allows
//! listing them; and updates of the resources it asked about
//! (`resourceSubscriptions`) that the policy lets it read, whose server
//! offers subscriptions (watches.rs keeps the servers subscribed). Task
//! notifications are not offered yet, so the acknowledgement leaves them
//! out of the filter it echoes.

use aip_mcp::jsonrpc::Message;
use aip_mcp::modern::META_SUBSCRIPTION;
use aip_policy::{Decision, Evaluator, Request};
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::present::server_info;
use super::watches::Watch;

/// One agent's subscription, open until the gateway stops or the agent
/// hangs up.
pub struct Subscription {
    id: Value,
    honored: Value,
    prompts: bool,
    resources: bool,
    tools_changed: Option<watch::Receiver<u64>>,
    /// The resources it watches (the servers stay subscribed while it
    /// holds them).
    watching: Vec<Watch>,
    notes: broadcast::Receiver<(String, Value)>,
    shutdown: CancellationToken,
}

/// The most resources one subscription watches; the acknowledgement names
/// those it does.
const MAX_WATCHED: usize = 64;

impl Gateway {
    /// Opens a subscription for an allowed `subscriptions/listen`: the
    /// filter it asked for, less what the gateway cannot deliver or the
    /// policy hides.
    pub(super) async fn subscription(
        &self,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Subscription {
        let asked = message
            .params()
            .and_then(|p| p.get("notifications"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let wants = |key: &str| asked.get(key).and_then(Value::as_bool) == Some(true);
        let upstream = self.upstream_capabilities();
        let announces = |kind: &str| {
            upstream
                .get(kind)
                .and_then(|c| c.get("listChanged"))
                .and_then(Value::as_bool)
                == Some(true)
        };
        let tools = wants("toolsListChanged");
        let prompts = wants("promptsListChanged")
            && announces("prompts")
            && allowed(evaluator, "prompts/list");
        let resources = wants("resourcesListChanged")
            && announces("resources")
            && allowed(evaluator, "resources/list");
        let mut honored = serde_json::Map::new();
        for (key, on) in [
            ("toolsListChanged", tools),
            ("promptsListChanged", prompts),
            ("resourcesListChanged", resources),
        ] {
            if on {
                honored.insert(key.into(), json!(true));
            }
        }
        let watching = self.watch(&asked, evaluator).await;
        if !watching.is_empty() {
            let uris: Vec<&str> = watching.iter().map(|w| w.uri.as_str()).collect();
            honored.insert("resourceSubscriptions".into(), json!(uris));
        }
        Subscription {
            id: message.id().cloned().unwrap_or(Value::Null),
            honored: Value::Object(honored),
            prompts,
            resources,
            tools_changed: tools.then(|| self.tools_changed()),
            watching,
            notes: self.connections.notes.subscribe(),
            shutdown: self.shutdown.clone(),
        }
    }
}

impl Gateway {
    /// Watches the resources a listen asked about that the policy lets
    /// the agent read and whose server offers subscriptions (an HTTP one:
    /// a stdio server's updates are not heard).
    async fn watch(&self, asked: &Value, evaluator: &Evaluator) -> Vec<Watch> {
        let uris = asked.get("resourceSubscriptions").and_then(Value::as_array);
        let mut watching = Vec::new();
        for uri in uris.into_iter().flatten().filter_map(Value::as_str) {
            if watching.len() == MAX_WATCHED || watching.iter().any(|w: &Watch| w.uri == uri) {
                continue;
            }
            let params = json!({"uri": uri});
            let read = Request {
                id: None,
                method: "resources/read",
                params: Some(&params),
            };
            if evaluator.evaluate(&read).decision != Decision::Allow {
                continue;
            }
            let Some(connection) = Box::pin(self.resource_route(uri)).await else {
                continue;
            };
            let subscribable = connection
                .upstream
                .server_capabilities()
                .pointer("/resources/subscribe")
                == Some(&json!(true));
            if subscribable && connection.upstream.notes().is_some() {
                watching.push(self.watches.watch(&connection, uri));
            }
        }
        watching
    }
}

fn allowed(evaluator: &Evaluator, method: &str) -> bool {
    let request = Request {
        id: None,
        method,
        params: None,
    };
    evaluator.evaluate(&request).decision == Decision::Allow
}

const UPDATED: &str = "notifications/resources/updated";

impl Subscription {
    /// The resource an update from `connection` is about, when this
    /// subscription watches it there.
    fn watched(&self, connection: &str, note: &Value) -> Option<String> {
        let uri = note.pointer("/params/uri").and_then(Value::as_str)?;
        self.watching
            .iter()
            .any(|w| w.uri == uri && w.connection() == connection)
            .then(|| uri.to_owned())
    }

    /// The first message on the stream: what the subscription covers.
    pub fn acknowledgement(&self) -> Value {
        json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {META_SUBSCRIPTION: self.id}, "notifications": self.honored}})
    }

    /// The last: the subscription ended by the gateway.
    pub fn closing(&self) -> Value {
        json!({"jsonrpc": "2.0", "id": self.id, "result": {"resultType": "complete",
            "_meta": {META_SUBSCRIPTION: self.id, aip_mcp::modern::META_SERVER_INFO: server_info()}}})
    }

    /// The next notification for the agent, tagged; None once the gateway
    /// stops.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let tools = async {
                match self.tools_changed.as_mut() {
                    Some(changes) => changes.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let method = tokio::select! {
                changed = tools => match changed {
                    true => "notifications/tools/list_changed",
                    false => return None,
                },
                note = self.notes.recv() => match note {
                    Ok((connection, note)) => match note.get("method").and_then(Value::as_str) {
                        Some(UPDATED) => match self.watched(&connection, &note) {
                            Some(uri) => return Some(json!({"jsonrpc": "2.0", "method": UPDATED,
                                "params": {"_meta": {META_SUBSCRIPTION: self.id}, "uri": uri}})),
                            None => continue,
                        },
                        Some("notifications/prompts/list_changed") if self.prompts => {
                            "notifications/prompts/list_changed"
                        }
                        Some("notifications/resources/list_changed") if self.resources => {
                            "notifications/resources/list_changed"
                        }
                        _ => continue,
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                () = self.shutdown.cancelled() => return None,
            };
            return Some(json!({"jsonrpc": "2.0", "method": method,
                "params": {"_meta": {META_SUBSCRIPTION: self.id}}}));
        }
    }
}

//! Prompts and resources, fanned out over every usable connection. Lists
//! are paged: each agent-facing page is one upstream page, and its cursor is
//! the gateway's own (which connection, and that server's cursor), so an
//! agent never holds a cursor meant for another server. Prompt names get
//! their connection's prefix; `prompts/get` and `resources/read` go where a
//! listing found the name or URI.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aip_policy::Evaluator;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use aip_mcp::jsonrpc::Message;
use aip_policy::codes;
use aip_service::sync::lock;

use super::call::{Ids, Reply};
use super::connections::Connections;
use super::present::{Findings, error, redact_for_agent, result};
use crate::upstream::health::ConnectionState;

/// A server that never stops paging cannot stall a listing.
const MAX_PAGES: usize = 64;

/// Where a listing goes on: a connection, and its server's cursor.
#[derive(Debug, PartialEq)]
struct Position {
    connection: String,
    cursor: Option<String>,
}

impl Position {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(json!([self.connection, self.cursor]).to_string())
    }

    fn decode(cursor: &str) -> Option<Position> {
        let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
        match serde_json::from_slice::<Value>(&bytes).ok()? {
            Value::Array(parts) => match parts.as_slice() {
                [Value::String(connection), Value::Null] => Some(Position {
                    connection: connection.clone(),
                    cursor: None,
                }),
                [Value::String(connection), Value::String(cursor)] => Some(Position {
                    connection: connection.clone(),
                    cursor: Some(cursor.clone()),
                }),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The array of items each list method returns.
fn items_key(method: &str) -> &'static str {
    match method {
        "prompts/list" => "prompts",
        "resources/templates/list" => "resourceTemplates",
        _ => "resources",
    }
}

/// Prompt names and resource URIs as the last listings showed them, and
/// where each leads; the pipeline forwards what these route.
pub(super) struct Listings {
    /// Agent-facing prompt name -> (connection, upstream name).
    prompts: Mutex<HashMap<String, (Arc<ConnectionState>, String)>>,
    /// Resource URI -> connection.
    resources: Mutex<HashMap<String, Arc<ConnectionState>>>,
    ids: Ids,
}

/// Where a routed request goes: a connection and the request for it, or
/// nowhere, with the answer saying why.
pub(super) enum Routed {
    To(Arc<ConnectionState>, Value),
    Answer(Reply),
}

impl Listings {
    pub(super) fn new(ids: Ids) -> Listings {
        Listings {
            prompts: Mutex::default(),
            resources: Mutex::default(),
            ids,
        }
    }

    /// Forgets every route to `state` (a reload removed it).
    pub(super) fn forget(&self, state: &Arc<ConnectionState>) {
        lock(&self.prompts).retain(|_, (c, _)| !Arc::ptr_eq(c, state));
        lock(&self.resources).retain(|_, c| !Arc::ptr_eq(c, state));
    }

    /// One agent-facing page of a prompts or resources listing, from where
    /// the agent's cursor says (the first connection without one).
    /// Connections that are not usable or fail (logged) are skipped, and so
    /// are empty pages: a listing does not fail because one server is down.
    /// A cursor naming no connection of the gateway is refused.
    pub(super) async fn page(
        &self,
        connections: &Connections,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Reply {
        // A server still starting is not a server with nothing to list.
        connections.settled().await;
        let id = message.id().cloned().unwrap_or(Value::Null);
        let method = message.method().unwrap_or_default();
        let key = items_key(method);
        let all = connections.all();
        let start = match message.params().and_then(|p| p.get("cursor")) {
            None => all.first().map(|c| Position {
                connection: c.connection().name.clone(),
                cursor: None,
            }),
            Some(cursor) => {
                let found = cursor
                    .as_str()
                    .and_then(Position::decode)
                    .filter(|p| all.iter().any(|c| c.connection().name == p.connection));
                if found.is_none() {
                    return Reply::Message(error(
                        Some(&id),
                        codes::INVALID_PARAMS,
                        "Invalid cursor",
                        None,
                    ));
                }
                found
            }
        };
        let mut items = Vec::new();
        let mut next = start;
        for _ in 0..MAX_PAGES {
            let Some(at) = next.take() else { break };
            let Some(i) = all
                .iter()
                .position(|c| c.connection().name == at.connection)
            else {
                break;
            };
            let connection = &all[i];
            let on = |cursor: Option<String>| match cursor {
                Some(cursor) => Some(Position {
                    connection: at.connection.clone(),
                    cursor: Some(cursor),
                }),
                None => all.get(i + 1).map(|c| Position {
                    connection: c.connection().name.clone(),
                    cursor: None,
                }),
            };
            if !connection.health().state.listable() {
                next = on(None);
                continue;
            }
            match self
                .upstream_page(connection, method, at.cursor.as_deref())
                .await
            {
                Some((page, cursor)) => {
                    items.extend(
                        page.into_iter()
                            .map(|item| self.adopt(method, connection, item, evaluator)),
                    );
                    next = on(cursor);
                }
                None => next = on(None),
            }
            if !items.is_empty() {
                break;
            }
        }
        // Each item was redacted as it was adopted; the cursor is the
        // gateway's.
        let mut page = json!({ key: items });
        if let Some(next) = next {
            page["nextCursor"] = json!(next.encode());
        }
        Reply::Message(result(&id, page))
    }

    /// One page of `method` from one connection: its items and its next
    /// cursor. None (logged) when the server fails.
    async fn upstream_page(
        &self,
        connection: &ConnectionState,
        method: &str,
        cursor: Option<&str>,
    ) -> Option<(Vec<Value>, Option<String>)> {
        let mut request = json!({"jsonrpc": "2.0", "id": self.ids.fresh(), "method": method});
        if let Some(cursor) = cursor {
            request["params"] = json!({ "cursor": cursor });
        }
        match connection.upstream.request(&request).await {
            Ok(x) => {
                let page = x.response().get("result").cloned().unwrap_or(Value::Null);
                let items = match page.get(items_key(method)) {
                    Some(Value::Array(items)) => items.clone(),
                    _ => Vec::new(),
                };
                let next = match page.get("nextCursor") {
                    Some(Value::String(next)) if !next.is_empty() => Some(next.clone()),
                    _ => None,
                };
                Some((items, next))
            }
            Err(failure) => {
                let name = &connection.connection().name;
                tracing::warn!(connection = %name, method, reason = failure.reason(), "listing skipped this connection");
                None
            }
        }
    }

    /// An upstream item as the agent sees it, redacted, its route
    /// remembered (under the name or URI the agent is shown): a prompt gets
    /// its connection's prefix, a resource's URI its connection.
    fn adopt(
        &self,
        method: &str,
        connection: &Arc<ConnectionState>,
        mut item: Value,
        evaluator: &Evaluator,
    ) -> Value {
        redact_for_agent(&mut item, connection, evaluator, Findings::Unaudited);
        match method {
            "prompts/list" => {
                if let Some(name) = item.get("name").and_then(Value::as_str).map(str::to_owned) {
                    let agent_name = format!("{}{name}", connection.connection().tool_prefix);
                    item["name"] = json!(agent_name);
                    lock(&self.prompts).insert(agent_name, (connection.clone(), name));
                }
            }
            "resources/list" => {
                if let Some(uri) = item.get("uri").and_then(Value::as_str) {
                    lock(&self.resources).insert(uri.to_owned(), connection.clone());
                }
            }
            _ => {}
        }
        item
    }

    /// Lists `method` everywhere, every page, to learn routes.
    async fn learn_routes(&self, connections: &Connections, method: &str, evaluator: &Evaluator) {
        for connection in connections.usable() {
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let Some((items, next)) = self
                    .upstream_page(&connection, method, cursor.as_deref())
                    .await
                else {
                    break;
                };
                for item in items {
                    self.adopt(method, &connection, item, evaluator);
                }
                match next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
    }

    /// `prompts/get`: to the connection that listed the name, under the
    /// server's name for it.
    pub(super) async fn prompt(
        &self,
        connections: &Connections,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Routed {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let name = string_param(message, "name");
        let route = self
            .routed(
                connections,
                evaluator,
                &self.prompts,
                &name,
                |r| &r.0,
                "prompts/list",
            )
            .await;
        let Some((connection, upstream_name)) = route else {
            let unknown = format!("Unknown prompt: {name}");
            return Routed::Answer(Reply::Message(error(
                Some(&id),
                codes::INVALID_PARAMS,
                &unknown,
                None,
            )));
        };
        let mut params = message.params().cloned().unwrap_or_else(|| json!({}));
        params["name"] = json!(upstream_name);
        let request = json!({"jsonrpc": "2.0", "method": "prompts/get", "params": params});
        Routed::To(connection, request)
    }

    /// `resources/read`, and (legacy) `resources/subscribe` and
    /// `resources/unsubscribe`: to the connection whose resource the URI is.
    pub(super) async fn resource(
        &self,
        connections: &Connections,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Routed {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let uri = string_param(message, "uri");
        let Some(connection) = self.resource_route(connections, &uri, evaluator).await else {
            let unknown = format!("Unknown resource: {uri}");
            return Routed::Answer(Reply::Message(error(
                Some(&id),
                codes::INVALID_PARAMS,
                &unknown,
                None,
            )));
        };
        let params = message.params().cloned().unwrap_or_else(|| json!({}));
        let method = message.method().unwrap_or_default();
        let request = json!({"jsonrpc": "2.0", "method": method, "params": params});
        Routed::To(connection, request)
    }

    /// `completion/complete` goes where its reference leads: a prompt's
    /// connection (under the server's name for it), a resource's, or with
    /// one usable connection (a template's URI no listing names) that one.
    pub(super) async fn completion(
        &self,
        connections: &Connections,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Routed {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let reference = message.params().and_then(|p| p.get("ref"));
        let kind = reference
            .and_then(|r| r.get("type"))
            .and_then(Value::as_str);
        let mut params = message.params().cloned().unwrap_or_else(|| json!({}));
        let connection = match kind {
            Some("ref/prompt") => {
                let name = reference
                    .and_then(|r| r.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let route = self
                    .routed(
                        connections,
                        evaluator,
                        &self.prompts,
                        name,
                        |r| &r.0,
                        "prompts/list",
                    )
                    .await;
                route.map(|(connection, upstream_name)| {
                    params["ref"]["name"] = json!(upstream_name);
                    connection
                })
            }
            Some("ref/resource") => {
                let uri = reference
                    .and_then(|r| r.get("uri"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.resource_route(connections, uri, evaluator).await
            }
            _ => {
                let why = "params.ref.type must be \"ref/prompt\" or \"ref/resource\"";
                return Routed::Answer(Reply::Message(error(
                    Some(&id),
                    codes::INVALID_PARAMS,
                    why,
                    None,
                )));
            }
        };
        // A name or URI no listing knows: with one usable connection there
        // is only one place it can mean.
        let usable = connections.usable();
        let connection = connection.or_else(|| (usable.len() == 1).then(|| usable[0].clone()));
        let Some(connection) = connection else {
            let unknown = "the reference names no prompt or resource of any connection";
            return Routed::Answer(Reply::Message(error(
                Some(&id),
                codes::INVALID_PARAMS,
                unknown,
                None,
            )));
        };
        let request = json!({"jsonrpc": "2.0", "method": "completion/complete", "params": params});
        Routed::To(connection, request)
    }

    /// `logging/setLevel` (legacy) reaches every usable legacy connection
    /// whose server offers logging. Upstream sessions serve every agent of
    /// the pod, so the level is the pod's, as the last agent set it.
    pub(super) async fn set_level(
        &self,
        connections: &Connections,
        message: &Message,
        evaluator: &Evaluator,
    ) -> Reply {
        let id = message.id().cloned().unwrap_or(Value::Null);
        let targets: Vec<_> = connections
            .usable()
            .into_iter()
            .filter(|c| !c.upstream.modern())
            .filter(|c| c.upstream.server_capabilities().get("logging").is_some())
            .collect();
        if targets.is_empty() {
            return Reply::Message(super::present::method_not_found(&id, "logging/setLevel"));
        }
        // The last error, and the connection it came from.
        let mut last = None;
        for connection in targets {
            let mut request = message.value.clone();
            request["id"] = json!(self.ids.fresh());
            let failed = match connection.upstream.request(&request).await {
                Ok(x) => x.response().get("error").cloned(),
                Err(failure) => Some(failure.to_error(&connection.connection().name, None)),
            };
            if let Some(e) = failed {
                last = Some((e, connection));
            }
        }
        match last {
            None => Reply::Message(result(&id, json!({}))),
            Some((mut e, connection)) => {
                redact_for_agent(&mut e, &connection, evaluator, Findings::Unaudited);
                Reply::Message(json!({"jsonrpc": "2.0", "id": id, "error": e}))
            }
        }
    }

    /// Where a resource URI leads: as listed, or with one usable connection
    /// (a template's instance no listing names) that one.
    pub(super) async fn resource_route(
        &self,
        connections: &Connections,
        uri: &str,
        evaluator: &Evaluator,
    ) -> Option<Arc<ConnectionState>> {
        let route = self
            .routed(
                connections,
                evaluator,
                &self.resources,
                uri,
                |c| c,
                "resources/list",
            )
            .await;
        let usable = connections.usable();
        route.or_else(|| (usable.len() == 1).then(|| usable[0].clone()))
    }

    /// The route for `key`: as last listed, or after listing `method`
    /// everywhere again when it is unknown.
    async fn routed<T: Clone>(
        &self,
        connections: &Connections,
        evaluator: &Evaluator,
        routes: &Mutex<HashMap<String, T>>,
        key: &str,
        connection_of: impl Fn(&T) -> &Arc<ConnectionState>,
        method: &str,
    ) -> Option<T> {
        if let Some(route) = current(connections, routes, key, &connection_of) {
            return Some(route);
        }
        // A connection still starting may hold it.
        connections.settled().await;
        self.learn_routes(connections, method, evaluator).await;
        current(connections, routes, key, &connection_of)
    }
}

/// The route a listing recorded for `key`, if its connection is still one
/// of the gateway's (a reload may have removed it).
fn current<T: Clone>(
    connections: &Connections,
    routes: &Mutex<HashMap<String, T>>,
    key: &str,
    connection_of: impl Fn(&T) -> &Arc<ConnectionState>,
) -> Option<T> {
    let route = lock(routes).get(key).cloned()?;
    let live = connections
        .all()
        .iter()
        .any(|c| Arc::ptr_eq(c, connection_of(&route)));
    live.then_some(route)
}

/// A string parameter of `message`, empty when absent.
pub(super) fn string_param(message: &Message, field: &str) -> String {
    message
        .params()
        .and_then(|p| p.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::Position;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        for cursor in [None, Some("abc".to_owned()), Some("".to_owned())] {
            let p = Position {
                connection: "inv".into(),
                cursor,
            };
            assert_eq!(Position::decode(&p.encode()), Some(p));
        }
        for bad in ["", "!!", "bnVsbA", "WzEsMl0", "WyJhIl0"] {
            assert_eq!(Position::decode(bad), None, "{bad}");
        }
    }
}

//! What an HTTP upstream says outside any call: the standalone GET stream of
//! a legacy session, or a `subscriptions/listen` stream of a modern server
//! (to every list change, and to updates of the resources agents watch).
//! The server's resource subscriptions follow what agents watch: a modern
//! stream is opened again with the new set; a legacy session is sent
//! `resources/subscribe` and `resources/unsubscribe` for the difference.
//!
//! One upstream session serves every agent of the pod, so a message on this
//! stream cannot be attributed to an agent. `notifications/tools/list_changed`
//! is acted on (the catalog is refreshed at once); prompts and resources
//! list changes and resource updates go to `notes`, for agents listening; a
//! `ping` is answered; any other request is answered -32601 so that the
//! server need not wait; other notifications are dropped. Listening never
//! opens a session (calls and health checks do), and nothing here counts
//! for or against the connection's health: a server without the stream
//! (405) is simply not listened to until its next session.

use std::collections::BTreeSet;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::http::{HttpUpstream, Session, StreamState};
use crate::jsonrpc::{self, Limits};
use crate::protocol::TOOLS_LIST_CHANGED;
use crate::sse;

const NOTES_PROMPTS: &str = "notifications/prompts/list_changed";
const NOTES_RESOURCES: &str = "notifications/resources/list_changed";
const NOTES_UPDATED: &str = "notifications/resources/updated";
const NOTES_TASKS: &str = "notifications/tasks";

/// The longest wait between reconnects of a failing stream.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

enum Listened {
    /// Told to stop.
    Stopped,
    /// A new session replaced the one listened to.
    Replaced,
    /// The server refused the stream (405 and the like): not again for this
    /// session.
    Refused,
    /// The stream ended; `heard` says whether anything came on it.
    Ended {
        heard: bool,
        retry: Option<Duration>,
    },
}

impl HttpUpstream {
    /// Listens until `stop`, following the cached session as it changes.
    pub async fn listen(&self, stop: CancellationToken) {
        let mut sessions = self.sessions.subscribe();
        let mut backoff = Duration::from_secs(1);
        let mut refused = 0u64;
        let mut last_event: Option<(u64, String)> = None;
        // What agents watch changing is worth another attempt at a
        // session's stream the server refused.
        let mut resources = self.watched.subscribe();
        let mut tasks = self.watched_tasks.subscribe();
        loop {
            let session = self
                .cached_session()
                .await
                .filter(|s| s.generation() != refused);
            let Some(session) = session else {
                tokio::select! {
                    changed = sessions.changed() => if changed.is_err() { return },
                    _ = resources.changed() => refused = 0,
                    _ = tasks.changed() => refused = 0,
                    () = stop.cancelled() => return,
                }
                continue;
            };
            // Last-Event-ID only within the session that numbered the events.
            last_event.take_if(|(generation, _)| *generation != session.generation());
            let mut watched = self.watched.subscribe();
            watched.mark_unchanged();
            tasks.mark_unchanged();
            resources.mark_unchanged();
            let listened = tokio::select! {
                l = self.listen_once(&session, &mut last_event, &stop) => l,
                // A new session: this stream belongs to the old one.
                _ = sessions.wait_for(|g| *g != session.generation()) => Listened::Replaced,
                // A modern stream's filter changed: it is opened again.
                () = self.follow_watched(&session, &mut watched) => Listened::Replaced,
                _ = tasks.changed(), if session.modern => Listened::Replaced,
            };
            self.stream_state.send_replace(match listened {
                Listened::Refused => StreamState::Unsupported,
                _ => StreamState::Closed,
            });
            let wait = match listened {
                Listened::Stopped => return,
                Listened::Replaced => continue,
                Listened::Refused => {
                    refused = session.generation();
                    continue;
                }
                Listened::Ended { heard: true, retry } => {
                    backoff = Duration::from_secs(1);
                    retry.unwrap_or(backoff)
                }
                Listened::Ended {
                    heard: false,
                    retry,
                } => {
                    let wait = retry.unwrap_or(backoff).max(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    wait
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    async fn listen_once(
        &self,
        session: &Session,
        last_event: &mut Option<(u64, String)>,
        stop: &CancellationToken,
    ) -> Listened {
        let name = &self.connection().name;
        let last_id = last_event.as_ref().map(|(_, id)| id.as_str());
        // No deadline: servers may send the headers only with the first
        // event, which can be hours away.
        let open = async {
            if session.modern {
                let mut notifications = json!({"toolsListChanged": true,
                    "promptsListChanged": true, "resourcesListChanged": true});
                let watched = self.watched.borrow().clone();
                if !watched.is_empty() {
                    notifications["resourceSubscriptions"] = json!(watched);
                }
                let mut params = json!({});
                let tasks = self.watched_tasks.borrow().clone();
                if !tasks.is_empty() {
                    // Task notifications need the extension declared.
                    notifications["taskIds"] = json!(tasks);
                    params["_meta"] = json!({
                        (crate::modern::META_VERSION): crate::modern::VERSION,
                        (crate::modern::META_CAPABILITIES):
                            {"extensions": {(crate::modern::TASKS_EXTENSION): {}}},
                    });
                }
                params["notifications"] = notifications;
                let listen = json!({"jsonrpc": "2.0", "id": "aip-listen", "method": "subscriptions/listen",
                    "params": params});
                self.post(Some(session), &listen).await
            } else {
                self.get_stream(session.id.as_deref(), &session.protocol_version, last_id)
                    .await
            }
        };
        let response = tokio::select! {
            r = open => r,
            () = stop.cancelled() => return Listened::Stopped,
        };
        let mut response = match response {
            Ok(r) => r,
            Err(failure) => {
                tracing::debug!(connection = %name, class = failure.class(), "the standalone stream could not be opened");
                return Listened::Ended {
                    heard: false,
                    retry: None,
                };
            }
        };
        let is_stream = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if !response.status().is_success() || !is_stream {
            tracing::debug!(connection = %name, status = response.status().as_u16(), "the server offers no standalone stream");
            return Listened::Refused;
        }
        self.stream_state.send_replace(StreamState::Open);
        let limit = self.connection().max_response_bytes;
        let mut parser = sse::Parser::default();
        let (mut heard, mut retry) = (false, None);
        loop {
            let frame = tokio::select! {
                f = response.body_mut().frame() => f,
                () = stop.cancelled() => return Listened::Stopped,
            };
            let Some(Ok(frame)) = frame else {
                return Listened::Ended { heard, retry };
            };
            let Some(chunk) = frame.data_ref() else {
                continue;
            };
            for event in parser.push(chunk) {
                if let Some(ms) = event.retry_ms {
                    retry = Some(Duration::from_millis(ms));
                }
                if let Some(id) = &event.id {
                    *last_event = Some((session.generation(), id.clone()));
                }
                if event.data.trim().is_empty() {
                    continue; // a priming event
                }
                heard = true;
                let limits = Limits {
                    max_bytes: limit,
                    max_depth: 64,
                };
                match jsonrpc::parse_value(event.data.as_bytes(), limits) {
                    Ok(message) => self.heard(session, message).await,
                    Err(e) => {
                        tracing::warn!(connection = %name, error = %e, "the standalone stream carried an unacceptable message; dropped")
                    }
                }
            }
            if parser.pending_bytes() > limit {
                tracing::warn!(connection = %name, limit, "an event on the standalone stream exceeds maxResponseBytes; the stream is dropped");
                return Listened::Ended { heard, retry };
            }
        }
    }

    /// Keeps the server's resource subscriptions in step with what agents
    /// watch. For a modern session it returns at the first change (the
    /// stream is then opened with the new filter); for a legacy one it
    /// subscribes and unsubscribes the session for each difference, for
    /// as long as the stream lasts.
    async fn follow_watched(
        &self,
        session: &Session,
        watched: &mut watch::Receiver<BTreeSet<String>>,
    ) {
        if session.modern {
            if watched.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            return;
        }
        let mut subscribed = BTreeSet::new();
        loop {
            let wanted = watched.borrow_and_update().clone();
            for uri in wanted.difference(&subscribed) {
                self.subscription(session, "resources/subscribe", uri).await;
            }
            for uri in subscribed.difference(&wanted) {
                self.subscription(session, "resources/unsubscribe", uri)
                    .await;
            }
            subscribed = wanted;
            if watched.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// One `resources/subscribe` or `resources/unsubscribe` on a legacy
    /// session, within the connection's timeout; a failure is logged (the
    /// agent then hears no updates of it).
    async fn subscription(&self, session: &Session, method: &str, uri: &str) {
        let request = json!({"jsonrpc": "2.0", "id": self.fresh_id("subscribe"), "method": method,
            "params": {"uri": uri}});
        let sent = self.exchange(session, &request, None);
        let answer = tokio::time::timeout(self.connection().timeout, sent).await;
        let refused = match &answer {
            Ok(Ok(x)) => x.response().get("error").is_some(),
            _ => true,
        };
        if refused {
            tracing::warn!(connection = %self.connection().name, method, "the server did not take the resource subscription");
        }
    }

    async fn heard(&self, session: &Session, message: Value) {
        let name = &self.connection().name;
        let method = message.get("method").and_then(Value::as_str);
        let reply = match (method, message.get("id")) {
            (Some(TOOLS_LIST_CHANGED), None) => {
                tracing::debug!(connection = %name, "the server's tool list changed");
                self.list_changed().notify_one();
                return;
            }
            (Some(NOTES_PROMPTS | NOTES_RESOURCES | NOTES_UPDATED), None)
            | (Some(NOTES_TASKS), None)
                if session.modern || method != Some(NOTES_TASKS) =>
            {
                let _ = self.notes.send(message);
                return;
            }
            (Some(_), Some(_)) if session.modern => return, // none on a listen stream
            (Some("ping"), Some(id)) => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            (Some(method), Some(id)) => json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32601,
                "message": format!("{method} is not offered outside a call: the gateway cannot tell which agent it is for"),
            }}),
            (Some(method), None) => {
                tracing::debug!(connection = %name, method, "a notification outside any call; dropped");
                return;
            }
            (None, _) => return, // a response to nothing the listener sent
        };
        let sent =
            tokio::time::timeout(self.connection().timeout, self.post(Some(session), &reply));
        if !matches!(sent.await, Ok(Ok(_))) {
            tracing::debug!(connection = %name, "could not answer a request on the standalone stream");
        }
    }
}

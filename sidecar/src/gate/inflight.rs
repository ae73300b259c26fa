//! The agents' requests in flight, by session and request id, so that a
//! `notifications/cancelled` or the end of a session reaches them.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use aip_service::sync::lock;

/// (agent session, request id as JSON text) -> what cancels the request.
/// A pipelining agent can have many; the hasher is a fast one (seeded per
/// process, so ids an agent chooses cannot aim at one bucket).
type Requests = Mutex<HashMap<(String, String), CancellationToken, foldhash::fast::RandomState>>;

/// Requests in flight of one kind (calls being served, or asks being
/// held: apart, since an agent that stops sending withdraws its asks while
/// its calls may still be answered).
#[derive(Default)]
pub(super) struct InFlight {
    requests: Requests,
}

/// One request in flight; it is forgotten when this is dropped, however its
/// handling ends.
pub(super) struct Tracked<'a> {
    requests: &'a Requests,
    key: Option<(String, String)>,
    pub cancelled: CancellationToken,
}

impl InFlight {
    /// Tracks the request `id` of `session` (a notification, without an id,
    /// can still be cancelled by its session's end through the token).
    pub(super) fn track(&self, session: &str, id: Option<&Value>) -> Tracked<'_> {
        track(&self.requests, session, id)
    }

    /// Cancels the request `id` of `session`.
    pub(super) fn cancel(&self, session: &str, id: &Value) {
        let key = (session.to_owned(), id.to_string());
        if let Some(token) = lock(&self.requests).get(&key) {
            token.cancel();
        }
    }

    /// Cancels everything `session` has in flight.
    pub(super) fn end_session(&self, session: &str) {
        cancel_session(&self.requests, session);
    }
}

fn track<'a>(requests: &'a Requests, session: &str, id: Option<&Value>) -> Tracked<'a> {
    let cancelled = CancellationToken::new();
    let key = id.map(|id| (session.to_owned(), id.to_string()));
    if let Some(key) = &key {
        lock(requests).insert(key.clone(), cancelled.clone());
    }
    Tracked {
        requests,
        key,
        cancelled,
    }
}

fn cancel_session(requests: &Requests, session: &str) {
    for (key, token) in lock(requests).iter() {
        if key.0 == session {
            token.cancel();
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            lock(self.requests).remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_is_forgotten_when_its_handling_ends() {
        let in_flight = InFlight::default();
        let tracked = in_flight.track("s", Some(&json!(1)));
        in_flight.cancel("s", &json!(1));
        assert!(tracked.cancelled.is_cancelled());
        drop(tracked);
        assert!(lock(&in_flight.requests).is_empty());
    }

    #[test]
    fn the_end_of_a_session_cancels_only_its_requests() {
        let in_flight = InFlight::default();
        let (a, b) = (
            in_flight.track("a", Some(&json!(1))),
            in_flight.track("b", Some(&json!(1))),
        );
        in_flight.end_session("a");
        assert!(a.cancelled.is_cancelled() && !b.cancelled.is_cancelled());
    }
}

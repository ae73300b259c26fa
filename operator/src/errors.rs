//! How the operator words a Kubernetes API error in a log line, a gRPC
//! status or an Event: the API server's code, reason and message, never the
//! client's Debug dump of the whole response.

/// `kube::Error` as one readable line: `409 AlreadyExists: approvalrequests
/// "x" already exists` for the API server's refusals, the error's own words
/// otherwise.
pub fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let reason = if status.reason.is_empty() {
                "Error"
            } else {
                status.reason.as_str()
            };
            format!("{} {reason}: {}", status.code, status.message)
        }
        other => other.to_string(),
    }
}

/// A `kube::Error` for `tracing`'s `%` formatting, worded by [`api_reason`].
pub struct Api<'a>(pub &'a kube::Error);

impl std::fmt::Display for Api<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&api_reason(self.0))
    }
}

/// A watch's failure as one readable line, the API server's refusal worded
/// by [`api_reason`].
pub fn watch_reason(e: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(e) => format!("the initial list failed: {}", api_reason(e)),
        W::WatchStartFailed(e) => format!("the watch did not start: {}", api_reason(e)),
        W::WatchFailed(e) => format!("the watch failed: {}", api_reason(e)),
        W::WatchError(status) => format!(
            "the API server ended the watch: {} {}: {}",
            status.code, status.reason, status.message
        ),
        other => other.to_string(),
    }
}

/// Whether a watch ended because its resource version expired (410 Gone):
/// the API server compacted its history, and the watcher lists again by
/// design. It happens in every healthy cluster, so it is not a warning.
pub fn watch_expired(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as W;
    match e {
        W::WatchError(status) => status.code == 410,
        W::WatchFailed(kube::Error::Api(status))
        | W::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// Logs a watch's failure: an expired resource version at info (the watcher
/// lists again), anything else as a warning.
pub fn log_watch_error(what: &str, e: &kube::runtime::watcher::Error) {
    if watch_expired(e) {
        tracing::info!(watch = what, reason = %Watch(e), "watch expired; listing again");
    } else {
        tracing::warn!(watch = what, error = %Watch(e), "watch error; retrying with backoff");
    }
}

/// A watch failure for `tracing`'s `%` formatting.
pub struct Watch<'a>(pub &'a kube::runtime::watcher::Error);

impl std::fmt::Display for Watch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&watch_reason(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_refusal_reads_as_code_reason_and_message_not_a_debug_dump() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 409, "reason": "AlreadyExists",
            "message": "approvalrequests.aip.io \"x\" already exists"}))
        .unwrap();
        let e = kube::Error::Api(Box::new(status.clone()));
        let said = api_reason(&e);
        assert_eq!(
            said,
            "409 AlreadyExists: approvalrequests.aip.io \"x\" already exists"
        );
        let watched = watch_reason(&kube::runtime::watcher::Error::WatchFailed(e));
        assert!(!watched.contains("Status {"), "{watched}");
        assert!(
            watched.starts_with("the watch failed: 409 AlreadyExists"),
            "{watched}"
        );
        let e = kube::runtime::watcher::Error::WatchFailed(kube::Error::Api(Box::new(status)));
        assert!(!watch_expired(&e), "a 409 is not an expired watch");
    }

    #[test]
    fn an_expired_resource_version_is_an_expected_relist_not_a_failure() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 410, "reason": "Expired",
            "message": "too old resource version: 320 (322)"}))
        .unwrap();
        assert!(watch_expired(&kube::runtime::watcher::Error::WatchError(
            Box::new(status)
        )));
    }
}

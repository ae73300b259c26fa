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

//! `aip-sidecar check FILE`: what a configuration file configures, or every
//! error in it.

use std::path::Path;
use std::process::ExitCode;

use crate::config::file;

/// Prints what the file configures (never a credential value), or every
/// error with its document and field.
pub(super) fn check(path: &Path) -> ExitCode {
    let config = match file::load(path) {
        Ok(config) => config,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {e}", path.display());
            }
            return ExitCode::FAILURE;
        }
    };
    let policy = config
        .policy
        .as_ref()
        .map_or("none: every tool call is blocked", |p| {
            p.metadata.name.as_str()
        });
    println!(
        "{}: ok (policy {policy}, connections: {})",
        path.display(),
        config.connections.len()
    );
    for c in &config.connections {
        let endpoint = match &c.endpoint {
            crate::config::Endpoint::Http { url } => format!("url {url}"),
            crate::config::Endpoint::Stdio { command } => format!("command {command:?}"),
        };
        let credentials = match &c.credentials {
            Ok(headers) => format!("{} credential headers resolved", headers.len()),
            Err(e) => format!("credentials unresolved ({e}): its tools will be hidden"),
        };
        println!(
            "  {}: {endpoint}, tools as {}*, {credentials}",
            c.name, c.tool_prefix
        );
    }
    ExitCode::SUCCESS
}

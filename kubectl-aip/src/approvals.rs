//! Listing and deciding ApprovalRequests through the API server, as the
//! user the kubeconfig names.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use aip_api::ApprovalRequest;
use aip_api::approval_request::Decision;
use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

/// Arguments longer than this are cut in the listing (`kubectl get -o
/// yaml` shows them whole).
const ARGUMENTS_SHOWN: usize = 60;

#[derive(Clone, Copy)]
pub enum Verdict {
    Approved,
    Denied,
}

/// The cluster and namespace a command works on.
pub struct Target {
    client: Client,
    namespace: String,
    /// The API server's URL, for messages.
    server: String,
}

impl Target {
    pub async fn connect(
        kubeconfig: Option<&Path>,
        context: Option<String>,
        namespace: Option<String>,
    ) -> anyhow::Result<Target> {
        let options = KubeConfigOptions {
            context,
            ..KubeConfigOptions::default()
        };
        let config = match kubeconfig {
            Some(path) => {
                let file = read_kubeconfig(path)?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("kubeconfig {}", quoted(path)))?
            }
            None => {
                // kube's own errors say "failed to read kubeconfig from
                // '\"path\"'" and then the same I/O error again; kubectl
                // names the file once, so the files are looked for here.
                let paths = default_kubeconfigs();
                let listed: Vec<String> = paths.iter().map(|p| quoted(p)).collect();
                if !paths.iter().any(|p| p.exists()) {
                    anyhow::bail!(
                        "no kubeconfig: {} (set KUBECONFIG or pass --kubeconfig)",
                        match listed.as_slice() {
                            [one] => format!("{one} does not exist"),
                            many => format!("none of {} exists", many.join(", ")),
                        }
                    );
                }
                Config::from_kubeconfig(&options)
                    .await
                    .with_context(|| format!("kubeconfig {}", listed.join(", ")))?
            }
        };
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        Ok(Target {
            client: Client::try_from(config)?,
            namespace,
            server,
        })
    }

    /// An API error as kubectl words it; a server that cannot be reached
    /// is named.
    pub fn server_error(&self, e: kube::Error) -> anyhow::Error {
        match e {
            kube::Error::Api(status) => anyhow::anyhow!(
                "Error from server ({}): {}",
                if status.reason.is_empty() {
                    status.code.to_string()
                } else {
                    status.reason.clone()
                },
                status.message
            ),
            // kube's "ServiceError: " prefix says nothing to a reader;
            // the connection's own errors do.
            kube::Error::Service(inner) => self.unreachable(&*inner),
            kube::Error::HyperError(inner) => self.unreachable(&inner),
            other => anyhow::Error::new(other),
        }
    }

    fn unreachable(&self, e: &(dyn std::error::Error + 'static)) -> anyhow::Error {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            let said = cause.to_string();
            if !text.contains(&said) {
                text.push_str(": ");
                text.push_str(&said);
            }
            source = cause.source();
        }
        anyhow::anyhow!(
            "cannot reach the API server {} (is the kubeconfig's cluster up?): {text}",
            self.server
        )
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The requests as a table, pending only unless `all`.
    pub async fn list(&self, all_namespaces: bool, all: bool) -> anyhow::Result<String> {
        let api: Api<ApprovalRequest> = if all_namespaces {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), &self.namespace)
        };
        let mut requests: Vec<ApprovalRequest> = api
            .list(&ListParams::default())
            .await
            .map_err(|e| self.server_error(e))?
            .items
            .into_iter()
            .filter(|r| all || decision(r) == Decision::Pending)
            .collect();
        requests.sort_by_key(|r| r.metadata.creation_timestamp.clone().map(|t| t.0));
        if requests.is_empty() {
            return Ok(if all_namespaces {
                "No pending ApprovalRequests.\n".to_owned()
            } else {
                format!(
                    "No pending ApprovalRequests in namespace {}.\n",
                    self.namespace
                )
            });
        }
        Ok(table(&requests, all_namespaces, all, Timestamp::now()))
    }

    /// Records `verdict` on request `name`; what happened, in a line.
    pub async fn decide(
        &self,
        name: &str,
        verdict: Verdict,
        reason: Option<String>,
    ) -> anyhow::Result<String> {
        let api: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &self.namespace);
        let current = api.get(name).await.map_err(|e| self.server_error(e))?;
        let status = current.status.clone().unwrap_or_default();
        if status.decision != Decision::Pending {
            anyhow::bail!(
                "approvalrequest {name} is already {:?}{}; a decision is final",
                status.decision,
                status
                    .decided_by
                    .map(|by| format!(" (by {by})"))
                    .unwrap_or_default()
            );
        }
        let (word, value) = match verdict {
            Verdict::Approved => ("approved", "Approved"),
            Verdict::Denied => ("denied", "Denied"),
        };
        // The resourceVersion read above: a decision someone else made in
        // between makes this write fail instead of overwriting it.
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "status": {"decision": value, "reason": reason},
        });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| self.server_error(e))?;
        Ok(format!(
            "approvalrequest.aip.io/{name} {word} ({} from pod {})",
            current.spec.tool, current.spec.pod
        ))
    }
}

/// The kubeconfig at `path`, or an error naming it once and saying why
/// (the I/O error without its "(os error N)").
fn read_kubeconfig(path: &Path) -> anyhow::Result<Kubeconfig> {
    // Opened here first for the message; read_from then resolves the
    // file's relative certificate paths against its folder.
    std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the kubeconfig {}: {}",
            quoted(path),
            aip_errors::without_os_errors(&e.to_string())
        )
    })?;
    Kubeconfig::read_from(path).with_context(|| format!("kubeconfig {}", quoted(path)))
}

/// Where kubectl looks without `--kubeconfig`: every file KUBECONFIG lists,
/// else ~/.kube/config.
fn default_kubeconfigs() -> Vec<PathBuf> {
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        return std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    vec![home.join(".kube").join("config")]
}

/// A path in double quotes, as every message of this plugin shows one.
pub fn quoted(path: &Path) -> String {
    format!("\"{}\"", path.display())
}

fn decision(request: &ApprovalRequest) -> Decision {
    request
        .status
        .as_ref()
        .map(|s| s.decision)
        .unwrap_or_default()
}

fn table(requests: &[ApprovalRequest], namespaces: bool, all: bool, now: Timestamp) -> String {
    let mut header = vec!["NAME", "TOOL", "POD", "ARGUMENTS", "AGE", "EXPIRES"];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    if all {
        header.extend(["DECISION", "BY"]);
    }
    let rows: Vec<Vec<String>> = requests
        .iter()
        .map(|r| {
            let mut row = vec![
                r.name_any(),
                r.spec.tool.clone(),
                r.spec.pod.clone(),
                shorten(&r.spec.arguments),
                r.metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or("?".to_owned(), |t| age(t.0, now)),
                if r.spec.expires_at.0 > now {
                    format!("in {}", age(now, r.spec.expires_at.0))
                } else {
                    "expired".to_owned()
                },
            ];
            if namespaces {
                row.insert(0, r.namespace().unwrap_or_default());
            }
            if all {
                let status = r.status.clone().unwrap_or_default();
                row.push(format!("{:?}", status.decision));
                row.push(status.decided_by.unwrap_or_else(|| "-".to_owned()));
            }
            row
        })
        .collect();
    columns(&header, &rows)
}

/// Rows under a header, each column as wide as its widest cell, three
/// spaces apart (as kubectl prints tables).
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows.iter()) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}   ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn shorten(arguments: &str) -> String {
    if arguments.chars().count() <= ARGUMENTS_SHOWN {
        return arguments.to_owned();
    }
    let cut: String = arguments.chars().take(ARGUMENTS_SHOWN - 1).collect();
    format!("{cut}…")
}

/// kubectl's short age: 45s, 12m, 3h, 2d.
pub fn age(from: Timestamp, to: Timestamp) -> String {
    let secs = to.duration_since(from).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectls() {
        let t = |s: i64| Timestamp::from_second(s).expect("in range");
        assert_eq!(age(t(0), t(45)), "45s");
        assert_eq!(age(t(0), t(600)), "10m");
        assert_eq!(age(t(0), t(3 * 3600)), "3h");
        assert_eq!(age(t(0), t(3 * 86400)), "3d");
        assert_eq!(age(t(10), t(0)), "0s");
    }

    #[test]
    fn long_arguments_are_cut_on_a_character() {
        let long = format!("{{\"path\":\"{}\"}}", "é".repeat(100));
        let shown = shorten(&long);
        assert_eq!(shown.chars().count(), ARGUMENTS_SHOWN);
        assert!(shown.ends_with('…'));
        assert_eq!(shorten("{}"), "{}");
    }
}

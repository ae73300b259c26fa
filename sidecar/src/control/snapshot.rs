//! A snapshot from the operator, in the gateway's terms.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aip_mcp::{ClientCapabilities, Connection, Endpoint, Tls};
use aip_policy::tools::fingerprint::is_hash;
use aip_policy::tools::{Pin, Pins, Trust};
use aip_policy::{AgentPolicy, CompileOptions, Evaluator};
use aip_proto::v1;
use secrecy::SecretString;

use crate::config::{Config, ScanAction, ToolRules};

/// The gateway's Config for a snapshot. The policy is validated and
/// compiled here as well: the sidecar trusts no one to have done it. A
/// policy whose hash is unchanged keeps its compiled evaluator (and so its
/// rate-limit buckets); a changed one keeps the buckets of unchanged rules.
pub fn from_snapshot(snapshot: &v1::Snapshot, previous: &Config) -> Result<Config, String> {
    from_snapshot_in(snapshot, previous, Path::new(INJECTED_TOKEN_DIR))
}

/// Where the injector mounts the sidecar's projected tokens.
pub const INJECTED_TOKEN_DIR: &str = "/var/run/secrets/aip.io/serviceaccount";

/// [`from_snapshot`] for a sidecar whose projected tokens are in
/// `token_dir` (the directory of its `--token-file`): a connection that
/// authenticates with the pod's ServiceAccount token reads it there.
pub fn from_snapshot_in(
    snapshot: &v1::Snapshot,
    previous: &Config,
    token_dir: &Path,
) -> Result<Config, String> {
    let connection = |c: &v1::Connection| connection_in(c, token_dir);
    let connections = snapshot
        .connections
        .iter()
        .map(connection)
        .collect::<Result<Vec<_>, _>>()?;
    let tools = snapshot
        .connections
        .iter()
        .map(|c| Ok((c.name.clone(), tool_rules(c)?)))
        .collect::<Result<BTreeMap<_, _>, String>>()?;
    if snapshot.keep_previous && previous.policy.is_some() {
        tracing::warn!(reason = %snapshot.deny_reason, "the policy is invalid upstream; keeping the one in force");
        // The same connections as before, with whatever fresh credentials
        // the operator has for them; nothing newly granted.
        let fresh: Vec<Arc<Connection>> = snapshot
            .connections
            .iter()
            .map(connection)
            .collect::<Result<_, _>>()?;
        let connections = previous
            .connections
            .iter()
            .map(|old| {
                fresh
                    .iter()
                    .find(|c| c.name == old.name)
                    .unwrap_or(old)
                    .clone()
            })
            .collect();
        return Ok(Config {
            evaluator: previous.evaluator.clone(),
            policy: previous.policy.clone(),
            connections,
            tools,
        });
    }
    let Some(p) = &snapshot.policy else {
        if !snapshot.deny_reason.is_empty() {
            tracing::warn!(reason = %snapshot.deny_reason, "no policy applies to this pod; every tool call is refused");
        }
        return Ok(Config {
            connections,
            tools,
            ..Config::empty()
        });
    };
    let policy = AgentPolicy::from_json(&p.document_json)
        .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?;
    let unchanged = previous
        .policy
        .as_ref()
        .is_some_and(|old| aip_policy::hash::policy_hash(old) == p.hash);
    let evaluator = if unchanged {
        previous.evaluator.clone()
    } else {
        let options = CompileOptions::default();
        Arc::new(
            Evaluator::compile_after(&policy, &options, &previous.evaluator)
                .map_err(|e| format!("policy {}/{}: {e}", p.namespace, p.name))?,
        )
    };
    Ok(Config {
        evaluator,
        policy: Some(policy),
        connections,
        tools,
    })
}

/// What a connection's tools are held to, as the operator sends it; the
/// hashes are checked here as well.
pub fn tool_rules(c: &v1::Connection) -> Result<ToolRules, String> {
    let mut tools = BTreeMap::new();
    for (name, pin) in &c.tool_pins {
        let metadata = (!pin.metadata_hash.is_empty()).then(|| pin.metadata_hash.clone());
        for hash in [Some(&pin.schema_hash), metadata.as_ref()]
            .into_iter()
            .flatten()
        {
            if !is_hash(hash) {
                return Err(format!(
                    "connection {}: tool pin {name}: {hash:?} is not a fingerprint",
                    c.name
                ));
            }
        }
        tools.insert(
            name.clone(),
            Pin {
                schema_hash: pin.schema_hash.clone(),
                metadata_hash: metadata,
            },
        );
    }
    let trust = match v1::ToolTrust::try_from(c.tool_trust) {
        Ok(v1::ToolTrust::Listed) if tools.is_empty() => Trust::Listed,
        Ok(v1::ToolTrust::Listed) => {
            return Err(format!(
                "connection {}: trust Listed with tool pins",
                c.name
            ));
        }
        Ok(v1::ToolTrust::Pinned) => Trust::Pinned,
        // The operator sends FirstUse until it has recorded a first
        // listing, and the recorded acceptances as Pinned after.
        Ok(v1::ToolTrust::FirstUse) => Trust::FirstUse,
        Ok(v1::ToolTrust::Unspecified) if tools.is_empty() => Trust::Listed,
        Ok(v1::ToolTrust::Unspecified) => Trust::Pinned,
        // A trust this sidecar does not know: the strictest it does.
        Err(_) => Trust::Pinned,
    };
    let scan = match v1::ToolScan::try_from(c.tool_scan) {
        Ok(v1::ToolScan::Unspecified | v1::ToolScan::Warn) => ScanAction::Warn,
        Ok(v1::ToolScan::Off) => ScanAction::Off,
        Ok(v1::ToolScan::Block) | Err(_) => ScanAction::Block,
    };
    Ok(ToolRules {
        pins: Pins { trust, tools },
        scan,
    })
}

/// A connection as the operator sends it, in the gateway's terms.
pub fn connection(c: &v1::Connection) -> Result<Arc<Connection>, String> {
    connection_in(c, Path::new(INJECTED_TOKEN_DIR))
}

fn connection_in(c: &v1::Connection, token_dir: &Path) -> Result<Arc<Connection>, String> {
    let at = |field: &str| format!("connection {}: {field}", c.name);
    if !(c.url.starts_with("http://") || c.url.starts_with("https://")) {
        return Err(at("url is not http(s)"));
    }
    let credentials = if c.credentials_error.is_empty() {
        Ok(c.headers
            .iter()
            .map(|h| (h.name.clone(), SecretString::from(h.value.clone())))
            .collect())
    } else {
        Err(c.credentials_error.clone())
    };
    let millis = |ms: u32, field: &str| {
        if ms == 0 {
            Err(at(&format!("{field} is zero")))
        } else {
            Ok(Duration::from_millis(ms.into()))
        }
    };
    let tls = c.tls.clone().unwrap_or_default();
    let caps = c.capabilities.unwrap_or_default();
    Ok(Arc::new(Connection {
        name: c.name.clone(),
        endpoint: Endpoint::Http { url: c.url.clone() },
        credentials,
        timeout: millis(c.timeout_ms, "timeout")?,
        max_response_bytes: usize::try_from(c.max_response_bytes).unwrap_or(usize::MAX),
        health_interval: millis(c.health_interval_ms, "health interval")?,
        health_deadline: millis(c.health_deadline_ms, "health deadline")?,
        tool_prefix: c.tool_prefix.clone(),
        capabilities: ClientCapabilities {
            sampling: caps.sampling,
            elicitation: caps.elicitation,
            roots: caps.roots,
        },
        tls: Tls {
            ca_pem: (!tls.ca_pem.is_empty()).then_some(tls.ca_pem),
            server_name: (!tls.server_name.is_empty()).then_some(tls.server_name),
        },
        oauth: c
            .oauth
            .as_ref()
            .map(|o| {
                let timeout = millis(c.timeout_ms, "timeout").unwrap_or_default();
                oauth(o, &c.url, timeout, token_dir)
            })
            .transpose()?,
    }))
}

/// A connection's OAuth settings as the operator sent them.
fn oauth(
    o: &v1::OAuth,
    url: &str,
    timeout: std::time::Duration,
    token_dir: &Path,
) -> Result<aip_mcp::oauth::OAuth, String> {
    use aip_mcp::oauth::{AuthorizationServer, ClientAuth, Grant, OAuth};
    // A path under the projected tokens' directory, nowhere else.
    let under_tokens = |what: &str, file: &str| {
        let relative = Path::new(file);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "oauth: {what} {file:?} is not a plain relative path"
            ));
        }
        Ok(token_dir.join(relative))
    };
    let grant = match v1::Grant::try_from(o.grant) {
        Ok(v1::Grant::Unspecified | v1::Grant::ClientCredentials) if o.grant_file.is_empty() => {
            Grant::ClientCredentials
        }
        Ok(v1::Grant::JwtBearer) if !o.grant_file.is_empty() => Grant::JwtBearer {
            assertion: under_tokens("grant file", &o.grant_file)?,
        },
        Ok(v1::Grant::TokenExchange) if !o.grant_file.is_empty() => Grant::TokenExchange {
            subject_token: under_tokens("grant file", &o.grant_file)?,
            audience: (!o.audience.is_empty()).then(|| o.audience.clone()),
            subject_issuer: (!o.subject_issuer.is_empty()).then(|| o.subject_issuer.clone()),
        },
        _ => {
            return Err(format!(
                "oauth: grant {} with grant file {:?}: a JWT grant needs its file, client credentials none",
                o.grant, o.grant_file
            ));
        }
    };
    let server = match (o.issuer.is_empty(), o.token_endpoint.is_empty()) {
        (false, true) => AuthorizationServer::Issuer(o.issuer.clone()),
        (true, false) => AuthorizationServer::TokenEndpoint(o.token_endpoint.clone()),
        (true, true) => AuthorizationServer::FromResource,
        (false, false) => return Err("oauth: issuer and token_endpoint both given".to_owned()),
    };
    let given = [
        !o.client_secret.is_empty(),
        !o.private_key_pem.is_empty(),
        !o.assertion_file.is_empty(),
    ];
    let client_auth = match given {
        [false, false, true] => {
            ClientAuth::AssertionFile(under_tokens("assertion file", &o.assertion_file)?)
        }
        [false, false, false] if grant != Grant::ClientCredentials => ClientAuth::None,
        [true, false, false] => {
            let secret = secrecy::SecretString::from(o.client_secret.clone());
            match o.client_auth_method.as_str() {
                "" | "client_secret_basic" => ClientAuth::SecretBasic(secret),
                "client_secret_post" => ClientAuth::SecretPost(secret),
                other => return Err(format!("oauth: client auth method {other:?}")),
            }
        }
        [false, true, false] => ClientAuth::PrivateKeyJwt {
            key_pem: secrecy::SecretString::from(o.private_key_pem.clone()),
            key_id: (!o.key_id.is_empty()).then(|| o.key_id.clone()),
        },
        _ => {
            return Err(
                "oauth: one of client_secret, private_key_pem and assertion_file (none: only with a JWT grant)"
                    .to_owned(),
            );
        }
    };
    Ok(OAuth {
        server,
        grant,
        client_id: o.client_id.clone(),
        client_auth,
        scopes: o.scopes.clone(),
        send_resource: !o.omit_resource,
        resource: if o.resource.is_empty() {
            url.to_owned()
        } else {
            o.resource.clone()
        },
        timeout,
        tls: aip_mcp::Tls::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(schema_hash: &str, trust: v1::ToolTrust, scan: i32) -> v1::Connection {
        let pin = v1::ToolPin {
            schema_hash: schema_hash.to_owned(),
            metadata_hash: String::new(),
        };
        v1::Connection {
            name: "fs".into(),
            tool_pins: [("read".to_owned(), pin)].into(),
            tool_trust: trust.into(),
            tool_scan: scan,
            ..v1::Connection::default()
        }
    }

    #[test]
    fn pins_arrive_as_the_connection_wrote_them_and_are_checked_again() {
        let hash = format!("sha256:{}", "a".repeat(64));
        let rules = tool_rules(&pinned(&hash, v1::ToolTrust::Unspecified, 0)).unwrap_or_default();
        assert_eq!(rules.pins.trust, Trust::Pinned);
        assert_eq!(rules.pins.tools["read"].schema_hash, hash);
        assert_eq!(rules.pins.tools["read"].metadata_hash, None);
        assert_eq!(rules.scan, ScanAction::Warn);
        let err = tool_rules(&pinned("sha256:zz", v1::ToolTrust::Pinned, 0)).unwrap_err();
        assert_eq!(
            err,
            "connection fs: tool pin read: \"sha256:zz\" is not a fingerprint"
        );
        assert!(tool_rules(&pinned(&hash, v1::ToolTrust::Listed, 0)).is_err());
        // A scan action from a newer operator: the strictest this one knows.
        let rules = tool_rules(&pinned(&hash, v1::ToolTrust::Pinned, 99)).unwrap_or_default();
        assert_eq!(rules.scan, ScanAction::Block);
    }
}

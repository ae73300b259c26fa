//! The gateways users would pick instead of the sidecar, measured beside it
//! on the same upstream and load: mcp-proxy (Rust, tower-mcp) and ToolHive
//! (Go), the builds scripts/ensure-bench-peers.sh made into target/tools
//! and listed in target/tools/bench-peers.json.
//!
//! Where a peer can filter tools or authorize, it is given the equivalent
//! of the sidecar's policy (the upstream's `read` only), so policy work is
//! compared with policy work:
//!
//! - `mcp-proxy`: one backend, `expose_tools = ["read"]` (tools reach the
//!   agent as `up/read`).
//! - `thv-proxy`: `thv proxy --target-uri`, ToolHive's bare hop (no policy:
//!   it has no way to take one without its workload runner, which needs a
//!   container runtime).
//! - `thv-vmcp`: `thv vmcp serve`, ToolHive's gateway, with a static
//!   backend and Cedar authorization permitting `call_tool` on `read`.
//!
//! A peer that does not answer a call in the era measured (neither
//! aggregating peer speaks 2026-07-28) is left out of that era, with the
//! answer it gave.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use crate::{Era, first_answer};

/// A peer running in front of the upstream.
pub struct Peer {
    pub key: String,
    /// The release built (bench-peers.json).
    pub version: String,
    pub url: String,
    pub tool: String,
    pub child: Child,
    pub startup_ms: f64,
    /// Its configuration, home and log, under cargo's target/tmp; removed
    /// when this drops, after the process.
    _dir: tempfile::TempDir,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peers built for this machine, by name, with their versions: what
/// target/tools/bench-peers.json lists (nothing when `AIP_BENCH_PEERS=0`).
fn built() -> Value {
    if std::env::var("AIP_BENCH_PEERS").is_ok_and(|v| v == "0") {
        return json!({});
    }
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/bench-peers.json");
    std::fs::read(&list)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({}))
}

/// Starts every built peer in front of `upstream` and keeps those that
/// answer a call in `era`; the others by key, with why.
pub async fn start_all(upstream: SocketAddr, era: Era) -> (Vec<Peer>, Value) {
    let built = built();
    let mut running = Vec::new();
    let mut left_out = serde_json::Map::new();
    let kinds = [
        ("mcp-proxy", "mcp-proxy"),
        ("thv-proxy", "thv"),
        ("thv-vmcp", "thv"),
    ];
    for (key, binary) in kinds {
        let Some(bin) = built[binary]["bin"].as_str() else {
            left_out.insert(
                key.into(),
                json!("not built: scripts/ensure-bench-peers.sh (make bench runs it)"),
            );
            continue;
        };
        let version = built[binary]["version"].as_str().unwrap_or("?");
        match start(key, version, Path::new(bin), upstream, era).await {
            Ok(peer) => running.push(peer),
            Err(why) => {
                left_out.insert(key.into(), json!(format!("{version}: {why}")));
            }
        }
    }
    (running, Value::Object(left_out))
}

/// A port of loopback free a moment ago, for a peer that must be told one.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(
    key: &str,
    version: &str,
    bin: &Path,
    upstream: SocketAddr,
    era: Era,
) -> Result<Peer, String> {
    let dir = tempfile::Builder::new()
        .prefix("aip-bench-peer-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let port = free_port();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut command = crate::common::dies_with_us(bin);
    let (path, tool) = match key {
        "mcp-proxy" => {
            let config = dir.path().join("proxy.toml");
            std::fs::write(
                &config,
                format!(
                    "[proxy]\nname = \"bench\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\
                     [[backends]]\nname = \"up\"\ntransport = \"http\"\nurl = \"http://{upstream}/mcp\"\n\
                     expose_tools = [\"read\"]\n[observability]\nlog_level = \"warn\"\n"
                ),
            )
            .unwrap();
            command.arg("--config").arg(&config);
            ("/", "up/read")
        }
        "thv-proxy" => {
            command.args(["proxy", "--host", "127.0.0.1", "--port", &port.to_string()]);
            command.args(["--target-uri", &format!("http://{upstream}"), "up"]);
            ("/mcp", "read")
        }
        _ => {
            let config = dir.path().join("vmcp.yaml");
            std::fs::write(
                &config,
                format!(
                    "name: bench\ngroupRef: default\nbackends:\n  - name: up\n    url: http://{upstream}/mcp\n    \
                     transport: streamable-http\nincomingAuth:\n  type: anonymous\n  authz:\n    type: cedar\n    \
                     policies:\n      - 'permit(principal, action == Action::\"call_tool\", resource == Tool::\"read\");'\n\
                     outgoingAuth:\n  source: inline\n  default:\n    type: unauthenticated\naggregation:\n  \
                     conflictResolution: priority\n  conflictResolutionConfig:\n    priorityOrder: [\"up\"]\n"
                ),
            )
            .unwrap();
            command.args([
                "vmcp",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ]);
            command.arg("--config").arg(&config);
            ("/mcp", "read")
        }
    };
    // ToolHive keeps its state under the home directories and looks for a
    // container runtime it does not need for these two commands; neither
    // peer is to reach anything but the upstream.
    let xdg = |sub: &str| -> PathBuf { home.join(sub) };
    command
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", xdg(".config"))
        .env("XDG_DATA_HOME", xdg(".local/share"))
        .env("XDG_STATE_HOME", xdg(".local/state"))
        .env("XDG_CACHE_HOME", xdg(".cache"))
        .env("TOOLHIVE_SKIP_UPDATE_CHECK", "true")
        .env("TOOLHIVE_RUNTIME", "kubernetes")
        .current_dir(dir.path());
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let spawned = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let url = format!("http://127.0.0.1:{port}{path}");
    let mut peer = Peer {
        key: key.to_owned(),
        version: version.to_owned(),
        url,
        tool: tool.to_owned(),
        child,
        startup_ms: 0.0,
        _dir: dir,
    };
    match first_answer(&peer.url, tool, era, spawned).await {
        Ok(ms) => {
            peer.startup_ms = ms;
            Ok(peer)
        }
        Err(last) => {
            let log = std::fs::read_to_string(peer._dir.path().join("log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            Err(format!(
                "no call answered; the last answer: {}; its log ends: {}",
                cut(&last),
                cut(&tail)
            ))
        }
    }
}

fn cut(text: &str) -> String {
    text.chars().take(300).collect()
}

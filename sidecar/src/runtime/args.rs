//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The aip MCP gateway: enforces an AgentPolicy on every message between an
/// agent and its MCP servers.
#[derive(Parser)]
#[command(name = "aip-sidecar", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Diagnostics format on stderr.
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub log_format: aip_service::LogFormat,
    /// Export trace spans over OTLP/gRPC to this collector
    /// (e.g. http://127.0.0.1:4317); none are exported without it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve agents over Streamable HTTP, configured from a local file.
    Run(RunArgs),
    /// Serve one agent over stdio (a desktop MCP client), wrapping a stdio
    /// MCP server: `aip-sidecar stdio --config FILE -- COMMAND ARGS...`
    Stdio(StdioArgs),
    /// Validate a `run` configuration file and exit (1 if it is refused).
    Check {
        /// The file `run --config` would read.
        #[arg(value_name = "FILE", required_unless_present = "config_flag")]
        file: Option<PathBuf>,
        /// The same file, given as `run` and `stdio` take it.
        #[arg(long = "config", value_name = "FILE", conflicts_with = "file")]
        config_flag: Option<PathBuf>,
    },
    /// Exit 0 only if this pod's egress lock refuses a direct TCP
    /// connection and UDP datagram to PROBE at once (the injector runs it
    /// as a locked pod's first init container).
    LockCheck {
        /// A destination the lock forbids.
        #[arg(long, default_value = "192.0.2.1:9")]
        probe: std::net::SocketAddr,
    },
}

#[derive(clap::Args)]
pub struct StdioArgs {
    /// The configuration: an AgentPolicy and any ToolConnections, as for
    /// `run --config` (the wrapped command is one more connection).
    #[arg(long, visible_alias = "policy", value_name = "FILE")]
    pub config: PathBuf,
    /// Audit lines go here (default: stderr; stdout is the protocol).
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Rotate the audit file to FILE.1 once it reaches this many MiB.
    #[arg(long, default_value = "100", value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub audit_max_mb: u64,
    /// Serve the approval routes here (default: asks wait until they time out).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// The bearer token for the approval routes; created (mode 0600) with a
    /// random token when it does not exist.
    #[arg(long, value_name = "FILE")]
    pub approval_token_file: Option<PathBuf>,
    /// How long an ask waits for a person.
    #[arg(long, default_value = "300", value_name = "SECONDS")]
    pub approval_timeout_seconds: u64,
    /// Offer this client capability to the wrapped server (sampling,
    /// elicitation, roots); none is offered unless named.
    #[arg(long = "allow-capability", value_name = "CAPABILITY", value_parser = ["sampling", "elicitation", "roots"])]
    pub allow_capabilities: Vec<String>,
    /// How long one call to the wrapped server may take.
    #[arg(long, default_value = "60", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub call_timeout_seconds: u64,
    /// Keep polling this many microseconds after each line written before
    /// sleeping (trades a little CPU for fewer wake-ups; 0 turns it off).
    #[arg(
        long = "busy-poll-us",
        default_value = "50",
        value_name = "MICROS",
        value_parser = clap::value_parser!(u64).range(0..=10_000)
    )]
    pub busy_poll_us: u64,
    /// The stdio MCP server to wrap, after `--`: passed as an argv, never
    /// split on spaces. Without one, only the file's ToolConnections serve.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Standalone mode: multi-document YAML with one AgentPolicy and any
    /// ToolConnections.
    #[arg(
        long,
        required_unless_present = "operator",
        conflicts_with = "operator"
    )]
    pub config: Option<PathBuf>,
    /// Kubernetes mode: the operator's gRPC service (https://HOST:PORT).
    #[arg(long, env = "AIP_OPERATOR_URL", requires = "operator_trust")]
    pub operator: Option<String>,
    /// PEM CA bundle that signed the operator's certificate.
    #[arg(long, env = "AIP_OPERATOR_CA", group = "operator_trust")]
    pub operator_ca: Option<PathBuf>,
    /// The same bundle given inline as PEM text (the injected sidecar gets
    /// it so).
    #[arg(
        long,
        env = "AIP_OPERATOR_CA_PEM",
        group = "operator_trust",
        hide_env_values = true
    )]
    pub operator_ca_pem: Option<String>,
    /// Where to keep the newest CA bundle the operator hands out (a file in
    /// a writable emptyDir), so that after a rotation a restarted sidecar
    /// still trusts the operator. Read at start beside the bundle above.
    #[arg(long, env = "AIP_OPERATOR_CA_CACHE", requires = "operator")]
    pub operator_ca_cache: Option<PathBuf>,
    /// Verify the operator's certificate for this name instead of the
    /// URL's host.
    #[arg(long, env = "AIP_OPERATOR_SERVER_NAME")]
    pub operator_server_name: Option<String>,
    /// The projected service-account token (audience aip.io/sidecar).
    #[arg(
        long,
        env = "AIP_TOKEN_FILE",
        default_value = "/var/run/secrets/aip.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,
    /// Kubernetes mode: refuse every tool call once the operator has been
    /// away this long (e.g. 30m). Default: keep the last configuration.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_staleness: Option<Duration>,
    /// Where agents connect (loopback).
    #[arg(long, default_value = "127.0.0.1:8808")]
    pub listen: String,
    /// Threads serving agents, each with its own connections to agents and
    /// upstreams (default: one per CPU this process may use, its cgroup CPU
    /// limit included).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub lanes: Option<u16>,
    /// Every admin route: health, readiness, metrics, connections (upstream
    /// URLs and catalogs) and approvals. Keep it on loopback.
    #[arg(long, default_value = "127.0.0.1:8809", value_name = "ADDR")]
    pub admin: String,
    /// Also serve /healthz, /readyz and /metrics, and nothing else, here
    /// (e.g. 0.0.0.0:15020, for the kubelet's probes and Prometheus, which
    /// cannot reach loopback). Default: not served.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Audit lines go here (default: stdout).
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Rotate the audit file to FILE.1 once it reaches this many MiB.
    #[arg(long, default_value = "100", value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub audit_max_mb: u64,
    /// How long an ask waits for a person.
    #[arg(long, default_value = "300")]
    pub approval_timeout_seconds: u64,
    /// The bearer token for the approval routes; created (mode 0600) with a
    /// random token when it does not exist.
    #[arg(long)]
    pub approval_token_file: Option<PathBuf>,
    /// How often to look for configuration changes.
    #[arg(long, default_value = "1000")]
    pub reload_ms: u64,
    /// How long an agent may take to send a request's headers (also how
    /// long an idle keep-alive connection is kept).
    #[arg(long, default_value = "10", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=300))]
    pub header_timeout_seconds: u64,
    /// How long an agent may take to send a request's body once its headers
    /// arrived (then 408).
    #[arg(long, default_value = "30", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=300))]
    pub body_timeout_seconds: u64,
    /// Agent connections served at once; past it, new ones wait in the
    /// kernel's backlog until one ends.
    #[arg(long, default_value = "2048", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// How long in-flight calls may take to finish after SIGTERM.
    #[arg(long, default_value = "10")]
    pub drain_seconds: u64,
}

//! `aip-sidecar run --config FILE [--listen ADDR] [--admin ADDR] ...`

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aip_sidecar::admin::{self, Admin};
use aip_sidecar::agent::http as agent_http;
use aip_sidecar::audit::Audit;
use aip_sidecar::config::{file, operator};
use aip_sidecar::gate::{Gateway, GatewayOptions};
use clap::{Parser, Subcommand};
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The aip MCP gateway: enforces an AgentPolicy on every message between an
/// agent and its MCP servers.
#[derive(Parser)]
#[command(name = "aip-sidecar", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Diagnostics format on stderr.
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: aip_runtime::LogFormat,
    /// Export trace spans over OTLP/gRPC to this collector
    /// (e.g. http://127.0.0.1:4317); none are exported without it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    otlp_endpoint: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve agents over Streamable HTTP, configured from a local file.
    Run(RunArgs),
    /// Wrap a stdio MCP server for a desktop MCP client:
    /// `aip-sidecar stdio --policy FILE -- COMMAND ARGS...`
    Stdio(StdioArgs),
    /// Validate a `run` configuration file and exit (1 if it is refused).
    Check {
        /// The file `run --config` would read.
        config: PathBuf,
    },
}

#[derive(clap::Args)]
struct StdioArgs {
    /// The AgentPolicy (a file as for `run`; ToolConnections are ignored).
    #[arg(long)]
    policy: PathBuf,
    /// Audit lines go here (default: stderr; stdout is the protocol).
    #[arg(long)]
    audit: Option<PathBuf>,
    /// Serve the approval routes here (default: asks wait until they time out).
    #[arg(long)]
    admin: Option<String>,
    #[arg(long)]
    approval_token_file: Option<PathBuf>,
    #[arg(long, default_value = "300")]
    approval_timeout_seconds: u64,
    /// Offer this client capability to the server (sampling, elicitation, roots).
    #[arg(long = "allow-capability")]
    allow_capabilities: Vec<String>,
    /// Keep polling this many microseconds after each line written before
    /// sleeping (trades a little CPU for fewer wake-ups; 0 turns it off).
    #[arg(
        long = "busy-poll-us",
        default_value = "50",
        value_name = "MICROS",
        value_parser = clap::value_parser!(u64).range(0..=10_000)
    )]
    busy_poll_us: u64,
    /// The server to run, after `--`: passed as an argv, never split on spaces.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Standalone mode: multi-document YAML with one AgentPolicy and any
    /// ToolConnections.
    #[arg(
        long,
        required_unless_present = "operator",
        conflicts_with = "operator"
    )]
    config: Option<PathBuf>,
    /// Kubernetes mode: the operator's gRPC service (https://HOST:PORT).
    #[arg(long, env = "AIP_OPERATOR_URL", requires = "operator_trust")]
    operator: Option<String>,
    /// PEM CA bundle that signed the operator's certificate.
    #[arg(long, env = "AIP_OPERATOR_CA", group = "operator_trust")]
    operator_ca: Option<PathBuf>,
    /// The same bundle given inline as PEM text (the injected sidecar gets
    /// it so).
    #[arg(
        long,
        env = "AIP_OPERATOR_CA_PEM",
        group = "operator_trust",
        hide_env_values = true
    )]
    operator_ca_pem: Option<String>,
    /// Verify the operator's certificate for this name instead of the
    /// URL's host.
    #[arg(long, env = "AIP_OPERATOR_SERVER_NAME")]
    operator_server_name: Option<String>,
    /// The projected service-account token (audience aip.io/sidecar).
    #[arg(
        long,
        env = "AIP_TOKEN_FILE",
        default_value = "/var/run/secrets/aip.io/serviceaccount/token"
    )]
    token_file: PathBuf,
    /// Kubernetes mode: refuse every tool call once the operator has been
    /// away this long (e.g. 30m). Default: keep the last configuration.
    #[arg(long, value_parser = humantime::parse_duration)]
    max_staleness: Option<Duration>,
    /// Where agents connect (loopback).
    #[arg(long, default_value = "127.0.0.1:8808")]
    listen: String,
    /// Health, readiness, connections and approvals.
    #[arg(long, default_value = "127.0.0.1:8809")]
    admin: String,
    /// Audit lines go here (default: stdout).
    #[arg(long)]
    audit: Option<PathBuf>,
    /// How long an ask waits for a person.
    #[arg(long, default_value = "300")]
    approval_timeout_seconds: u64,
    /// The bearer token for the approval routes; created (mode 0600) with a
    /// random token when it does not exist.
    #[arg(long)]
    approval_token_file: Option<PathBuf>,
    /// How often to look for configuration changes.
    #[arg(long, default_value = "1000")]
    reload_ms: u64,
    /// How long in-flight calls may take to finish after SIGTERM.
    #[arg(long, default_value = "10")]
    drain_seconds: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Check { config } = &cli.command {
        aip_runtime::init_tracing(cli.log_format, "info");
        return check(config);
    }
    // The gateway uses every core; the stdio wrap relays one client on one
    // thread, which avoids a cross-thread wake-up per message.
    let is_stdio = matches!(cli.command, Command::Stdio(_));
    let runtime = match &cli.command {
        Command::Check { .. } => unreachable!("handled above"),
        Command::Run(_) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        Command::Stdio(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aip-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let endpoint = cli.otlp_endpoint.as_deref();
        let telemetry =
            aip_runtime::init_telemetry(cli.log_format, "info", endpoint, "aip-sidecar")
                .map_err(anyhow::Error::msg)?;
        let outcome = match cli.command {
            Command::Run(args) => run(args).await.map(|()| 0),
            Command::Stdio(args) => stdio(args).await,
            Command::Check { .. } => Ok(0),
        };
        // Flushing blocks on the exporter, whose client needs this runtime.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        outcome
    });
    if let (true, Ok(code)) = (is_stdio, &outcome) {
        // stdin may still hold a blocking read: do not wait for it.
        let _ = std::io::stderr().flush();
        std::process::exit(*code);
    }
    match outcome {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("aip-sidecar: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Follows the configuration file, logging why a first version is refused.
fn watch_config(path: &Path, poll: Duration, shutdown: &CancellationToken) -> file::Watched {
    let watched = file::watch(path.to_owned(), poll, shutdown.clone());
    if let Some(errors) = watched.errors.borrow().as_ref() {
        for e in &errors.0 {
            tracing::error!(file = %path.display(), error = %e, "configuration refused; every tool call is blocked until it is fixed");
        }
    }
    watched
}

/// Audit lines go to `path` (appended) or, without one, to `default`.
fn audit_sink(
    path: Option<&Path>,
    default: fn() -> Box<dyn Write + Send>,
) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match path {
        None => default(),
        Some(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
    })
}

/// Prints what the file configures (never a credential value), or every
/// error with its document and field.
fn check(path: &Path) -> ExitCode {
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
            aip_sidecar::config::Endpoint::Http { url } => format!("url {url}"),
            aip_sidecar::config::Endpoint::Stdio { command } => format!("command {command:?}"),
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

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let (evidence_tx, evidence) = tokio::sync::watch::channel(None);
    let kubernetes = args.operator.is_some();
    let trust = match (&args.operator_ca, &args.operator_ca_pem) {
        (Some(file), _) => Some(operator::OperatorCa::File(file.clone())),
        (None, Some(pem)) => Some(operator::OperatorCa::Pem(pem.clone())),
        (None, None) => None,
    };
    let (config, remote_approvals) = match (&args.config, &args.operator, trust) {
        (Some(path), _, _) => (
            watch_config(path, Duration::from_millis(args.reload_ms), &shutdown).config,
            None,
        ),
        (None, Some(url), Some(ca)) => {
            let source = operator::OperatorSource {
                url: url.clone(),
                ca,
                server_name: args.operator_server_name.clone(),
                token_file: args.token_file.clone(),
                max_staleness: args.max_staleness,
            };
            let watched = operator::watch(source, evidence, shutdown.clone())?;
            (watched.config, Some(watched.approvals))
        }
        _ => anyhow::bail!(
            "give --config FILE, or --operator URL with --operator-ca FILE (or --operator-ca-pem PEM)"
        ),
    };
    let audit = audit_sink(args.audit.as_deref(), || Box::new(std::io::stdout()))?;
    let options = GatewayOptions {
        approval_timeout: Duration::from_secs(args.approval_timeout_seconds),
        ..GatewayOptions::default()
    };
    let gateway = Gateway::new(config, Audit::new(audit), options, shutdown.clone());
    if let Some(remote) = remote_approvals {
        gateway.approvals.route_to(remote);
    }
    let evidence_gateway = gateway.clone();
    let _ = evidence_tx.send(Some(
        Arc::new(move || operator::gateway_evidence(&evidence_gateway)) as operator::EvidenceFn,
    ));
    // In Kubernetes mode approvals come only through the API server: the
    // agent shares this loopback, so no route here may grant anything.
    let (approval_token, token_note) = if kubernetes {
        (None, "approvals through Kubernetes".to_owned())
    } else {
        let token_file = args
            .approval_token_file
            .clone()
            .unwrap_or_else(default_token_file);
        let token = approval_token(&token_file)?;
        (
            Some(token),
            format!("approval token in {}", token_file.display()),
        )
    };

    let agent_listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let admin_listener = tokio::net::TcpListener::bind(&args.admin).await?;
    eprintln!(
        "aip-sidecar: agents at http://{}{} ; admin at http://{} ; {token_note}",
        agent_listener.local_addr()?,
        agent_http::MCP_PATH,
        admin_listener.local_addr()?,
    );
    tokio::spawn(aip_runtime::cancel_on_signal(shutdown.clone()));
    let admin = Arc::new(Admin {
        gateway: gateway.clone(),
        approval_token,
    });
    tokio::spawn(admin::serve(admin, admin_listener, shutdown.clone()));
    let tracker = TaskTracker::new();
    agent_http::serve(
        gateway.clone(),
        agent_listener,
        shutdown.clone(),
        tracker.clone(),
    )
    .await?;
    tracker.close();
    if tokio::time::timeout(Duration::from_secs(args.drain_seconds), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("in-flight calls did not finish within the drain bound");
    }
    gateway.close_connections().await;
    Ok(())
}

async fn stdio(args: StdioArgs) -> anyhow::Result<i32> {
    let shutdown = CancellationToken::new();
    let watched = watch_config(&args.policy, Duration::from_secs(1), &shutdown);
    let audit = audit_sink(args.audit.as_deref(), || Box::new(std::io::stderr()))?;
    let approvals = aip_sidecar::approvals::LocalApprovals::new();
    if let Some(addr) = &args.admin {
        let token_file = args
            .approval_token_file
            .clone()
            .unwrap_or_else(default_token_file);
        let approval_token = approval_token(&token_file)?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!(
            "aip-sidecar: approvals at http://{}/approvals ; token in {}",
            listener.local_addr()?,
            token_file.display()
        );
        let gateway =
            Gateway::with_approvals(watched.config.clone(), approvals.clone(), shutdown.clone());
        let admin = Arc::new(Admin {
            gateway,
            approval_token: Some(approval_token),
        });
        tokio::spawn(admin::serve(admin, listener, shutdown.clone()));
    }
    let wrap = aip_sidecar::wrap::Wrap {
        config: watched.config,
        audit: Arc::new(Audit::new(audit)),
        approvals,
        approval_timeout: Duration::from_secs(args.approval_timeout_seconds),
        ask_progress_interval: aip_sidecar::gate::DEFAULT_ASK_PROGRESS_INTERVAL,
        allow_capabilities: args.allow_capabilities,
        busy_poll: Duration::from_micros(args.busy_poll_us),
    };
    let (input, output) = aip_sidecar::wrap::agent_stdio();
    let code = wrap.run(&args.command, input, output).await?;
    shutdown.cancel();
    Ok(code)
}

fn default_token_file() -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("aip-sidecar-{}", std::process::id()))
        .join("approval-token")
}

/// Reads the token file, or creates it (directory 0700, file 0600) with a
/// random token.
fn approval_token(path: &Path) -> anyhow::Result<SecretString> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_owned();
        anyhow::ensure!(
            !token.is_empty(),
            "approval token file {} is empty",
            path.display()
        );
        return Ok(SecretString::from(token));
    }
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let token = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{token}")?;
    Ok(SecretString::from(token))
}

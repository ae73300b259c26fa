//! `aip-sidecar stdio --config FILE -- COMMAND ARGS...`: one agent on this
//! process's stdin and stdout, its tools served by the wrapped stdio server
//! (a connection named `stdio`, its tools under their own names) and by the
//! file's ToolConnections, all through the same pipeline HTTP agents get.

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::{ClientCapabilities, Connection, Endpoint};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::args::StdioArgs;
use super::{audit_sink, token, watch_config};
use crate::admin::{self, Admin, Surface};
use crate::agent::stdio as agent_stdio;
use crate::audit::Audit;
use crate::config::Config;
use crate::gate::{Gateway, GatewayOptions};

/// The wrapped command's connection name.
pub const WRAPPED: &str = "stdio";

pub(super) async fn stdio(args: StdioArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let watched = watch_config(&args.config, Duration::from_secs(1), &shutdown)?;
    let wrapped = wrapped_connection(&args);
    let config = with_wrapped(watched.config, wrapped, shutdown.clone())?;
    let audit = audit_sink(args.audit.as_deref(), args.audit_max_mb, || {
        Box::new(std::io::stderr())
    })?;
    let options = GatewayOptions {
        approval_timeout: Duration::from_secs(args.approval_timeout_seconds),
        ..GatewayOptions::default()
    };
    let gateway = Gateway::new(config, Audit::new(audit), options, shutdown.clone());
    if let Some(addr) = &args.admin {
        let token_file = args
            .approval_token_file
            .clone()
            .unwrap_or_else(token::default_token_file);
        let approval_token = token::approval_token(&token_file)?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!(
            "aip-sidecar: approvals at http://{}/approvals ; token in {}",
            listener.local_addr()?,
            token_file.display()
        );
        let admin = Arc::new(Admin {
            gateway: gateway.clone(),
            approval_token: Some(approval_token),
        });
        tokio::spawn(admin::serve(
            admin,
            listener,
            Surface::Admin,
            shutdown.clone(),
        ));
    }
    aip_service::busy_poll::start(Duration::from_micros(args.busy_poll_us));
    let (input, output) = agent_stdio::process_stdio();
    agent_stdio::serve(gateway.clone(), input, output).await;
    shutdown.cancel();
    gateway.close_connections().await;
    Ok(())
}

/// The wrapped command as a connection: no prefix, the capabilities the
/// command line allows, calls up to the call timeout, responses up to the
/// agent's own message limit.
fn wrapped_connection(args: &StdioArgs) -> Option<Arc<Connection>> {
    if args.command.is_empty() {
        return None;
    }
    let endpoint = Endpoint::Stdio {
        command: args.command.clone(),
    };
    let mut connection = Connection::new(WRAPPED, endpoint);
    let allowed = |name: &str| args.allow_capabilities.iter().any(|c| c == name);
    connection.capabilities = ClientCapabilities {
        sampling: allowed("sampling"),
        elicitation: allowed("elicitation"),
        roots: allowed("roots"),
    };
    connection.timeout = Duration::from_secs(args.call_timeout_seconds);
    connection.max_response_bytes = aip_mcp::jsonrpc::Limits::default().max_bytes;
    Some(Arc::new(connection))
}

/// The file's configuration with the wrapped command added, following every
/// reload (the same connection each time, so its process is kept).
fn with_wrapped(
    mut file: watch::Receiver<Arc<Config>>,
    wrapped: Option<Arc<Connection>>,
    shutdown: CancellationToken,
) -> anyhow::Result<watch::Receiver<Arc<Config>>> {
    let combine = move |config: &Config| -> Result<Arc<Config>, String> {
        if config.connection(WRAPPED).is_some() && wrapped.is_some() {
            return Err(format!(
                "a ToolConnection is named {WRAPPED:?}, the name of the wrapped command"
            ));
        }
        let mut connections = config.connections.clone();
        connections.extend(wrapped.clone());
        Ok(Arc::new(Config {
            evaluator: config.evaluator.clone(),
            policy: config.policy.clone(),
            connections,
            tools: config.tools.clone(),
        }))
    };
    let first = combine(&file.borrow_and_update()).map_err(anyhow::Error::msg)?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = file.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            }
            match combine(&file.borrow_and_update()) {
                Ok(config) => {
                    tx.send_replace(config);
                }
                Err(e) => {
                    tracing::error!(error = %e, "new configuration refused; keeping the previous one")
                }
            }
        }
    });
    Ok(rx)
}

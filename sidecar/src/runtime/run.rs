//! `aip-sidecar run`: agents over Streamable HTTP, configured from a local
//! file (standalone) or by the operator (Kubernetes mode).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::args::RunArgs;
use super::{audit_sink, token, watch_config};
use crate::admin::{self, Admin, Surface};
use crate::agent::http as agent_http;
use crate::audit::Audit;
use crate::control as operator;
use crate::gate::{Gateway, GatewayOptions};

/// How long a stopping sidecar gives its withdrawals to reach the operator.
const WITHDRAWAL_FLUSH: Duration = Duration::from_secs(3);

pub(super) async fn run(args: RunArgs, log_format: aip_service::LogFormat) -> anyhow::Result<()> {
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
            watch_config(path, Duration::from_millis(args.reload_ms), &shutdown)?.config,
            None,
        ),
        (None, Some(url), Some(ca)) => {
            let source = operator::OperatorSource {
                url: url.clone(),
                ca,
                ca_cache: args.operator_ca_cache.clone(),
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
    let audit = audit_sink(args.audit.as_deref(), args.audit_max_mb, || {
        Box::new(std::io::stdout())
    })?;
    let options = GatewayOptions {
        approval_timeout: Duration::from_secs(args.approval_timeout_seconds),
        ..GatewayOptions::default()
    };
    let gateway = Gateway::new(config, Audit::new(audit), options, shutdown.clone());
    if let Some(remote) = &remote_approvals {
        gateway.approvals.route_to(remote.clone());
    }
    let evidence_gateway = gateway.clone();
    let _ = evidence_tx.send(Some(Arc::new(move || {
        operator::evidence_of(&evidence_gateway.connections())
    }) as operator::EvidenceFn));
    // In Kubernetes mode approvals come only through the API server: the
    // agent shares this loopback, so no route here may grant anything.
    let (approval_token, token_note) = if kubernetes {
        (None, "approvals through Kubernetes".to_owned())
    } else {
        let token_file = args
            .approval_token_file
            .clone()
            .unwrap_or_else(token::default_token_file);
        let token = token::approval_token(&token_file)?;
        (
            Some(token),
            format!("approval token in {}", token_file.display()),
        )
    };

    let agent_listener = bind(&args.listen, "--listen").await?;
    let admin_listener = bind(&args.admin, "--admin").await?;
    let metrics_listener = match &args.metrics_listen {
        Some(addr) => Some(bind(addr, "--metrics-listen").await?),
        None => None,
    };
    let metrics_note = match &metrics_listener {
        Some(l) => format!(" ; metrics at http://{}", l.local_addr()?),
        None => String::new(),
    };
    let banner = format!(
        "aip-sidecar: agents at http://{}{} ; admin at http://{}{metrics_note} ; {token_note}",
        agent_listener.local_addr()?,
        agent_http::MCP_PATH,
        admin_listener.local_addr()?,
    );
    aip_service::announce(log_format, "aip_sidecar", &banner);
    tokio::spawn(aip_service::cancel_on_signal(shutdown.clone()));
    let admin = Arc::new(Admin {
        gateway: gateway.clone(),
        approval_token,
    });
    if let Some(listener) = metrics_listener {
        tokio::spawn(admin::serve(
            admin.clone(),
            listener,
            Surface::Probes,
            shutdown.clone(),
        ));
    }
    tokio::spawn(admin::serve(
        admin,
        admin_listener,
        Surface::Admin,
        shutdown.clone(),
    ));
    let tracker = TaskTracker::new();
    let limits = aip_service::serve::Limits {
        header_timeout: Duration::from_secs(args.header_timeout_seconds),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        body_timeout: Duration::from_secs(args.body_timeout_seconds),
    };
    let _lanes = agent_http::serve(
        gateway.clone(),
        agent_listener,
        limits,
        shutdown.clone(),
        tracker.clone(),
    )
    .await?;
    tracker.close();
    // Held asks were answered at once (-32016); calls under way get the
    // drain to finish.
    if tokio::time::timeout(Duration::from_secs(args.drain_seconds), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_s = args.drain_seconds,
            "in-flight calls did not finish within the drain bound"
        );
    }
    if let Some(remote) = &remote_approvals {
        // The operator learns that the held calls are gone before this
        // process is.
        remote.flush(WITHDRAWAL_FLUSH).await;
    }
    gateway.close_connections().await;
    Ok(())
}

/// Binds `addr`, saying which flag gave it when that fails.
async fn bind(addr: &str, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {flag} {addr}: {e}"))
}

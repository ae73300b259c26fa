//! `aip-fault-server --config FILE (--stdio | --http ADDR) [--log FILE] [--check]`

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aip_fault_server::core::Core;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{Script, Transport};
use aip_fault_server::{http, stdio};
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// A deterministic fault-injection MCP server: every tool answers from an
/// authored, finite script, and every attempt is logged.
#[derive(Parser)]
#[command(name = "aip-fault-server", version)]
struct Args {
    /// The FaultServer script (YAML).
    #[arg(long)]
    config: PathBuf,
    /// Serve MCP over stdin/stdout.
    #[arg(long, conflicts_with = "http")]
    stdio: bool,
    /// Serve Streamable HTTP on this address (e.g. 127.0.0.1:8931; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Append the attempt log to this file (default: stderr).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Put the call arguments themselves in the attempt log, not only their hash.
    #[arg(long)]
    log_args: bool,
    /// HTTP: answer with SSE when the client accepts both SSE and JSON.
    #[arg(long)]
    sse: bool,
    /// Validate the script for the chosen transport (HTTP if none) and exit.
    #[arg(long)]
    check: bool,
    /// Diagnostics format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    log_format: aip_service::LogFormat,
}

fn main() -> ExitCode {
    let args = Args::parse();
    aip_service::init_tracing(args.log_format, "warn");
    let transport = if args.stdio {
        Transport::Stdio
    } else {
        Transport::Http
    };
    let script = match std::fs::read_to_string(&args.config)
        .map_err(|e| e.to_string())
        .and_then(|text| Script::from_yaml(&text, transport).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", args.config.display());
            return ExitCode::FAILURE;
        }
    };
    if args.check {
        println!(
            "{}: ok ({} tools)",
            args.config.display(),
            script.tools.len()
        );
        return ExitCode::SUCCESS;
    }
    if !args.stdio && args.http.is_none() {
        eprintln!("aip-fault-server: choose a transport: --stdio or --http ADDR");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aip-fault-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(args, script));
    // stdin may still hold a blocking read; do not wait for it.
    let _ = std::io::stderr().flush();
    std::process::exit(if code { 0 } else { 1 });
}

async fn run(args: Args, script: Script) -> bool {
    let sink: Box<dyn Write + Send> = match &args.log {
        None => Box::new(std::io::stderr()),
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("aip-fault-server: cannot open {}: {e}", path.display());
                return false;
            }
        },
    };
    let core = Core::new(script, AttemptLog::new(sink, args.log_args));
    let shutdown = CancellationToken::new();
    tokio::spawn(aip_service::cancel_on_signal(shutdown.clone()));
    tokio::spawn(core.clone().run(shutdown.clone()));
    let served = match &args.http {
        None => {
            stdio::serve(
                core.clone(),
                tokio::io::stdin(),
                tokio::io::stdout(),
                shutdown.clone(),
            )
            .await
        }
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let local = listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                tracing::info!(address = %local, "listening");
                eprintln!(
                    "aip-fault-server: listening on http://{local}{}",
                    http::MCP_PATH
                );
                let options = http::HttpOptions {
                    prefer_sse: args.sse,
                };
                http::serve(core.clone(), listener, options, shutdown.clone()).await
            }
            Err(e) => Err(anyhow::anyhow!("cannot listen on {addr}: {e}")),
        },
    };
    shutdown.cancel();
    core.log.flush();
    match served {
        Ok(()) => true,
        Err(e) => {
            eprintln!("aip-fault-server: {e:#}");
            false
        }
    }
}

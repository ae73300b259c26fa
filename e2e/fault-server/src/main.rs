//! `aip-fault-server --config FILE (--stdio | --http ADDR) [--era both|legacy|modern] [--log FILE] [--check]`
//! `aip-fault-server --config FILE --shims DIR [--log FILE] [--deadline D] [--check]`

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aip_fault_server::cli::install::{InstallOptions, install};
use aip_fault_server::cli::invoke::{self, EXIT_FAIL_CLOSED, Invocation};
use aip_fault_server::cli::{CLI_KIND, CliScript};
use aip_fault_server::core::Core;
use aip_fault_server::era::Eras;
use aip_fault_server::log::AttemptLog;
use aip_fault_server::script::{MAX_DELAY_MS, Script, Transport, document_kind};
use aip_fault_server::{http, stdio};
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// A deterministic fault-injection server: every MCP tool, and every mocked
/// command-line executable, answers from an authored, finite script, and
/// every attempt is logged.
#[derive(Parser)]
#[command(name = "aip-fault-server", version)]
struct Args {
    /// The script (YAML): a FaultServer (MCP) or a FaultCli (executables) document.
    #[arg(long, required_unless_present = "mock_session")]
    config: Option<PathBuf>,
    /// Serve MCP over stdin/stdout.
    #[arg(long, conflicts_with = "http")]
    stdio: bool,
    /// Serve Streamable HTTP on this address (e.g. 127.0.0.1:8931; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// FaultCli: install one shim per declared executable into DIR (a new
    /// mock session) and print the PATH to give the agent.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["stdio", "http", "sse"])]
    shims: Option<PathBuf>,
    /// FaultCli: the longest any invocation may take (e.g. 5s, 1500ms; at
    /// most 300s); past it the attempt ends with exit code 124.
    #[arg(long, value_name = "DURATION", requires = "shims", value_parser = parse_deadline)]
    deadline: Option<u64>,
    /// Append the attempt log to this file (default: stderr; FaultCli: .aip-fault/attempts.jsonl in DIR).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Put the call arguments themselves in the attempt log, not only their hash.
    #[arg(long)]
    log_args: bool,
    /// HTTP: answer with SSE when the client accepts both SSE and JSON.
    #[arg(long)]
    sse: bool,
    /// Which eras of MCP to answer: both (2026-07-28 and the initialize
    /// handshake, chosen per request), legacy (a 2025-11-25 server) or
    /// modern (a 2026-07-28-only server). Default: the document's
    /// spec.era, else both.
    #[arg(long, value_name = "ERA", value_parser = parse_era, conflicts_with = "shims")]
    era: Option<Eras>,
    /// Validate the script and exit (a FaultServer for the chosen transport, HTTP if none).
    #[arg(long)]
    check: bool,
    /// Diagnostics format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    log_format: aip_service::LogFormat,
    /// Run as the shim of a mock session (what the shims exec).
    #[arg(long, value_name = "DIR", hide = true, requires = "mock")]
    mock_session: Option<PathBuf>,
    /// The mocked executable's name (with --mock-session).
    #[arg(long, value_name = "NAME", hide = true, requires = "mock_session")]
    mock: Option<String>,
    /// The mocked executable's arguments (after `--`).
    #[arg(last = true, hide = true)]
    argv: Vec<OsString>,
}

fn parse_era(text: &str) -> Result<Eras, String> {
    text.parse()
}

fn parse_deadline(text: &str) -> Result<u64, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms > MAX_DELAY_MS {
        return Err(format!("must be at most {MAX_DELAY_MS} ms, found {ms} ms"));
    }
    Ok(ms)
}

fn main() -> ExitCode {
    let started = tokio::time::Instant::now();
    let args = Args::parse();
    if let (Some(session), Some(executable)) = (&args.mock_session, &args.mock) {
        let invocation = Invocation {
            session: session.clone(),
            executable: executable.clone(),
            argv: (args.argv.iter())
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        };
        run_mock(invocation, started);
    }
    aip_service::init_tracing(args.log_format, "warn");
    let Some(config) = args.config.clone() else {
        eprintln!("aip-fault-server: --config is required");
        return ExitCode::FAILURE;
    };
    let text = match std::fs::read_to_string(&config) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    let is_cli = document_kind(&text).as_deref() == Some(CLI_KIND);
    if args.shims.is_some() || (is_cli && args.check) {
        return install_shims(&args, &config, &text);
    }
    if is_cli {
        eprintln!(
            "{}: kind: a {CLI_KIND} document is installed with --shims DIR, not served over MCP",
            config.display()
        );
        return ExitCode::FAILURE;
    }
    let transport = if args.stdio {
        Transport::Stdio
    } else {
        Transport::Http
    };
    let mut script = match Script::from_yaml(&text, transport) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    if let Some(era) = args.era {
        script.era = era;
    }
    if args.check {
        println!("{}: ok ({} tools)", config.display(), script.tools.len());
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

/// Validates a FaultCli document and, unless only checking, installs it.
fn install_shims(args: &Args, config: &std::path::Path, text: &str) -> ExitCode {
    let script = match CliScript::from_yaml(text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = args.shims.clone().filter(|_| !args.check) else {
        println!(
            "{}: ok ({} executables)",
            config.display(),
            script.executables.len()
        );
        return ExitCode::SUCCESS;
    };
    let binary = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("aip-fault-server: cannot find this binary's path for the shims: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = InstallOptions {
        dir,
        log: args.log.clone(),
        log_args: args.log_args,
        deadline_ms: args.deadline,
        binary,
        inherited_path: std::env::var_os("PATH"),
    };
    match install(&script, text, &options) {
        Ok(installed) => {
            let names: Vec<&str> = script.executables.iter().map(|e| e.name.as_str()).collect();
            eprintln!(
                "aip-fault-server: session {} in {}: {} shims ({}); attempts to {}",
                installed.session,
                installed.dir.display(),
                names.len(),
                names.join(", "),
                installed.log.display()
            );
            // One line, ready for `export "$(aip-fault-server ... --shims DIR)"`.
            let mut stdout = std::io::stdout();
            let mut line = b"PATH=".to_vec();
            line.extend_from_slice(installed.path.as_encoded_bytes());
            line.push(b'\n');
            if stdout
                .write_all(&line)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aip-fault-server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One invocation of a shim, on a small runtime of its own; exits the
/// process with the invocation's code.
fn run_mock(invocation: Invocation, started: tokio::time::Instant) -> ! {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aip-fault-server: cannot start the runtime: {e}");
            std::process::exit(i32::from(EXIT_FAIL_CLOSED));
        }
    };
    let code = runtime.block_on(invoke::run(invocation, started));
    // Exit without dropping the runtime: a write to a reader that stopped
    // draining may still hold a blocking thread, and dropping would wait.
    std::process::exit(i32::from(code));
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

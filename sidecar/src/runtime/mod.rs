//! What `main` runs: the command line, the tokio runtime each command wants,
//! telemetry, and the three commands (`run`, `stdio`, `check`).

pub mod args;
mod check;
mod lock_check;
mod run;
mod stdio;
mod token;

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::file;
pub use args::{Cli, Command};

/// Runs the command `cli` names and says how the process should exit.
pub fn main(cli: Cli) -> ExitCode {
    if let Command::LockCheck { probe } = &cli.command {
        return lock_check::lock_check(*probe);
    }
    if let Command::Check { file, config_flag } = &cli.command {
        aip_service::init_tracing(cli.log_format, "info");
        let Some(config) = file.as_ref().or(config_flag.as_ref()) else {
            unreachable!("clap requires one of them");
        };
        return check::check(config);
    }
    // Every runtime is single-threaded, which avoids cross-thread wake-ups
    // per message: one stdio agent is served on one thread; the HTTP
    // gateway serves agents on a lane per CPU, this thread being the first.
    let is_stdio = matches!(cli.command, Command::Stdio(_));
    if let Command::Run(args) = &cli.command {
        let lanes = args.lanes.map(usize::from);
        aip_service::lanes::declare(lanes.unwrap_or_else(aip_service::lanes::default_count));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            let text = format!(
                "error: cannot start the runtime: {}",
                aip_errors::without_os_errors(&e.to_string())
            );
            aip_service::print_line(cli.log_format, "ERROR", "aip_sidecar", &text);
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let endpoint = cli.otlp_endpoint.as_deref();
        let telemetry =
            aip_service::init_telemetry(cli.log_format, "info", endpoint, "aip-sidecar")
                .map_err(anyhow::Error::msg)?;
        let outcome = match cli.command {
            Command::Run(args) => run::run(args, cli.log_format).await,
            Command::Stdio(args) => stdio::stdio(args).await,
            Command::Check { .. } | Command::LockCheck { .. } => Ok(()),
        };
        // Flushing blocks on the exporter, whose client needs this runtime.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        outcome
    });
    let code = match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("error: {}", aip_errors::one_line(&e));
            aip_service::print_line(cli.log_format, "ERROR", "aip_sidecar", &text);
            ExitCode::FAILURE
        }
    };
    if is_stdio {
        // stdin may still hold a blocking read: do not wait for it.
        let _ = std::io::stderr().flush();
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
    code
}

/// Follows the configuration file; a first version that cannot be used is
/// an error (the process must not run on without a policy).
fn watch_config(
    path: &Path,
    poll: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<file::Watched> {
    let watched = file::watch(path.to_owned(), poll, shutdown.clone());
    if let Some(errors) = watched.errors.borrow().as_ref() {
        let lines: Vec<String> = errors
            .0
            .iter()
            .map(|e| format!("{}: {e}", path.display()))
            .collect();
        anyhow::bail!("the configuration cannot be used:\n{}", lines.join("\n"));
    }
    Ok(watched)
}

/// Audit lines go to `path` (appended, rotated to `PATH.1` past
/// `max_mb` MiB) or, without one, to `default` (a container runtime bounds
/// what its stdout and stderr keep).
fn audit_sink(
    path: Option<&Path>,
    max_mb: u64,
    default: fn() -> Box<dyn Write + Send>,
) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match path {
        None => default(),
        Some(path) => Box::new(crate::audit::RotatingFile::open(
            path,
            max_mb.saturating_mul(1024 * 1024),
        )?),
    })
}

//! `aip-operator`: see `aip_operator::runtime::Args` for the flags.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = aip_operator::runtime::Args::parse();
    // kube-runtime's watcher logs each failed list itself, as a Debug dump
    // of the API server's answer; the operator logs (and acts on) every
    // watch error in its own words.
    aip_service::init_tracing(args.log_format, "info,kube_runtime::watcher=error");
    match aip_operator::runtime::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = aip_errors::one_line(&e), "aip-operator failed");
            ExitCode::FAILURE
        }
    }
}

//! `aip-operator`: see `aip_operator::runtime::Args` for the flags.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = aip_operator::runtime::Args::parse();
    aip_service::init_tracing(args.log_format, "info");
    match aip_operator::runtime::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = aip_errors::one_line(&e), "aip-operator failed");
            ExitCode::FAILURE
        }
    }
}

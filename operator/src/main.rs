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
            tracing::error!(error = message(&e), "aip-operator failed");
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes in one line, each said once: kube formats its
/// source into its own message, so `{e:#}` would repeat the kubeconfig's
/// I/O error three times. "(os error N)" only repeats the description.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    let mut rest = out.as_str();
    let mut clean = String::with_capacity(out.len());
    while let Some(at) = rest.find(" (os error ") {
        let tail = &rest[at + " (os error ".len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        let end = if digits > 0 && tail[digits..].starts_with(')') {
            at + " (os error ".len() + digits + 1
        } else {
            clean.push_str(&rest[..at + 1]);
            rest = &rest[at + 1..];
            continue;
        };
        clean.push_str(&rest[..at]);
        rest = &rest[end..];
    }
    clean.push_str(rest);
    clean
}

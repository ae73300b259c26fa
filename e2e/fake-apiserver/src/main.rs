//! `aip-fake-apiserver [--listen ADDR] [--token-file FILE] [--kubeconfig FILE]`

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// A Kubernetes API server for tests (in memory; see its README).
#[derive(Parser)]
#[command(name = "aip-fake-apiserver", version)]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Users: `token,user,uid,"group1,group2"` per line.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Write a kubeconfig for the bootstrap administrator here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Write the CA (`ca.crt`) and a kubeconfig per user
    /// (`admin.kubeconfig`, `USER.kubeconfig`) here.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS (kubectl then sends no tokens).
    #[arg(long)]
    plain_http: bool,
    #[arg(long, value_enum, default_value = "text")]
    log_format: aip_service::LogFormat,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    aip_service::init_tracing(cli.log_format, "info");
    let tokens = match &cli.token_file {
        None => aip_fake_apiserver::Tokens::default(),
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| aip_fake_apiserver::Tokens::parse(&t))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("aip-fake-apiserver: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
    };
    let users: Vec<(String, String)> = tokens
        .iter()
        .map(|(token, user)| (user.name.replace([':', '/'], "-"), token.clone()))
        .collect();
    let options = aip_fake_apiserver::Options {
        listen: cli.listen,
        tokens,
        tls: !cli.plain_http,
    };
    let running = match aip_fake_apiserver::start(options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aip-fake-apiserver: cannot listen on {}: {e}", cli.listen);
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &cli.kubeconfig
        && let Err(e) = std::fs::write(path, running.kubeconfig(aip_fake_apiserver::ADMIN_TOKEN))
    {
        eprintln!("aip-fake-apiserver: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    if let Some(dir) = &cli.out_dir
        && let Err(e) = write_out(dir, &running, &users)
    {
        eprintln!("aip-fake-apiserver: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    eprintln!("aip-fake-apiserver: serving on {}", running.url());
    let shutdown = tokio_util::sync::CancellationToken::new();
    aip_service::cancel_on_signal(shutdown.clone()).await;
    running.stop();
    ExitCode::SUCCESS
}

/// The CA and one kubeconfig per user, for tests and scripts.
fn write_out(
    dir: &std::path::Path,
    running: &aip_fake_apiserver::Running,
    users: &[(String, String)],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if let Some(ca) = &running.ca_pem {
        std::fs::write(dir.join("ca.crt"), ca)?;
    }
    let admin = running.kubeconfig(aip_fake_apiserver::ADMIN_TOKEN);
    std::fs::write(dir.join("admin.kubeconfig"), admin)?;
    for (name, token) in users {
        std::fs::write(
            dir.join(format!("{name}.kubeconfig")),
            running.kubeconfig(token),
        )?;
    }
    Ok(())
}

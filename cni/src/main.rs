//! `aip-cni`: run by the container runtime as a CNI plugin (CNI_COMMAND set),
//! or by the DaemonSet as `aip-cni install` / `aip-cni installed`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use aip_cni::install::Install;
use aip_cni::lookup::ApiServer;
use aip_cni::netns::NodeTools;
use aip_cni::plugin::{self, Config};

const USAGE: &str = "usage: aip-cni install|installed --bin-dir DIR --conf-dir DIR
  (as a CNI plugin the runtime runs it with CNI_COMMAND set)

  install    copies this binary into --bin-dir, chains it last in the first
             *.conflist of --conf-dir, writes its kubeconfig (from the pod's
             service account), keeps them in place and removes them on SIGTERM
  installed  exits 0 when the plugin is installed and chained (a probe)

  --host-conf-dir DIR  --conf-dir as the node sees it (default: the same)
  --binary PATH     the binary to install (default: this one)
  --token-file, --ca-file  the identity the plugin looks pods up with
                    (default: the pod's service account)
  --server URL      the API server (default: from KUBERNETES_SERVICE_HOST
                    and KUBERNETES_SERVICE_PORT)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_some() {
        return as_plugin();
    }
    if args.iter().any(|a| a == "--version") {
        println!("aip-cni {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    match args.first().map(String::as_str) {
        Some(command @ ("install" | "installed")) => {
            match Install::from_args(&args[1..], |name| std::env::var(name).ok()) {
                Ok(install) if command == "installed" => {
                    if install.installed() {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!(
                            "aip-cni: not installed (or not chained) in {}",
                            install.conf_dir.display()
                        );
                        ExitCode::FAILURE
                    }
                }
                Ok(install) => {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            eprintln!("aip-cni: cannot start: {e}");
                            return ExitCode::FAILURE;
                        }
                    };
                    match runtime.block_on(install.run()) {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => {
                            eprintln!("aip-cni: {e}");
                            ExitCode::FAILURE
                        }
                    }
                }
                Err(e) => {
                    eprintln!("aip-cni: {e}\n{USAGE}");
                    ExitCode::from(2)
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// One CNI invocation: the answer on stdout, a line for the runtime's log
/// on stderr.
fn as_plugin() -> ExitCode {
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CNI_"))
        .collect();
    let mut stdin = Vec::new();
    // At most 1 MiB of configuration.
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut stdin);
    let kubeconfig = serde_json::from_slice::<Config>(&stdin)
        .ok()
        .and_then(|c| c.kubeconfig)
        .unwrap_or_default();
    let answer = plugin::run(&env, &stdin, &ApiServer { kubeconfig }, &NodeTools);
    if let Some(said) = &answer.said {
        eprintln!("{said}");
    }
    if let Some(out) = &answer.stdout {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{out}");
        let _ = stdout.flush();
    }
    if answer.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! `aip-node`: one real Kubernetes node on this machine for the tests and
//! the cluster demo (see `src/node/mod.rs` for where it lives and how it
//! leaves the machine as it was). Runs as root.
//!
//! ```text
//! aip-node run [--check-host] [--image ARCHIVE]... -- COMMAND [ARGS]...
//!     starts the node, runs COMMAND inside its network namespace with
//!     AIP_TEST_NODE and KUBECONFIG set, stops the node, exits with
//!     COMMAND's status. --check-host: and fails if iptables-save, the
//!     sysctls, the mounts or the cgroup directories of the host differ
//!     from before.
//! aip-node up [--image ARCHIVE]...
//!     starts the node and keeps it until Ctrl-C.
//! aip-node enter -- COMMAND [ARGS]...
//!     runs COMMAND inside the running node's network namespace.
//! aip-node clean
//!     removes whatever a killed run left behind.
//! ```
//!
//! Without --image, every archive in target/images/ is imported (`make
//! images` writes them).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use aip_kube_test::node::{self, NodeInfo, host::Snapshot};

const USAGE: &str = "usage: aip-node run [--check-host] [--image ARCHIVE]... -- COMMAND [ARGS]...
       aip-node up [--image ARCHIVE]...
       aip-node enter -- COMMAND [ARGS]...
       aip-node clean";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((verb, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let parsed = match Parsed::from(rest) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("aip-node: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match verb.as_str() {
        "run" if !parsed.command.is_empty() => run(&parsed),
        "up" => up(&parsed),
        "enter" if !parsed.command.is_empty() => enter(&parsed.command),
        "clean" => node::clean_leftovers()
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| e.to_string()),
        "inside" => inside(&parsed),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("aip-node: {e}");
        ExitCode::FAILURE
    })
}

struct Parsed {
    check_host: bool,
    images: Vec<PathBuf>,
    dir: Option<PathBuf>,
    command: Vec<String>,
}

impl Parsed {
    fn from(args: &[String]) -> Result<Parsed, String> {
        let mut parsed = Parsed {
            check_host: false,
            images: Vec::new(),
            dir: None,
            command: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--check-host" => parsed.check_host = true,
                "--image" => parsed
                    .images
                    .push(args.next().ok_or("--image needs an archive")?.into()),
                "--dir" => parsed.dir = Some(args.next().ok_or("--dir needs a directory")?.into()),
                "--" => {
                    parsed.command = args.cloned().collect();
                    break;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(parsed)
    }

    /// The archives to import: those named, or every one `make images` made.
    fn images(&self) -> Result<Vec<PathBuf>, String> {
        if !self.images.is_empty() {
            return Ok(self.images.clone());
        }
        let dir = workspace_root().join("target/images");
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("no images in {} ({e}): run `make images`", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "tar"))
            .collect();
        found.sort();
        if found.is_empty() {
            return Err(format!(
                "no image archives in {}: run `make images`",
                dir.display()
            ));
        }
        Ok(found)
    }
}

/// Below this much free disk a run is likely to fail for want of it, not
/// for its code: containerd's images and the pods' logs are written to the
/// node's directory, and the kubelet evicts pods under 256 MiB free.
const LOW_DISK: u64 = 2 << 30;

/// Says how much disk the node's directory has left, and warns when it is
/// little: a run that failed for a full disk then says so in its log.
fn report_disk(dir: &std::path::Path) {
    match rustix::fs::statvfs(dir) {
        Ok(stat) => {
            let free = stat.f_bavail.saturating_mul(stat.f_frsize);
            let gib = free as f64 / f64::from(1u32 << 30);
            if free < LOW_DISK {
                eprintln!(
                    "aip-node: WARNING: only {gib:.1} GiB free on the disk of {}: pods may be evicted and builds fail for want of disk",
                    dir.display()
                );
            } else {
                eprintln!(
                    "aip-node: {gib:.1} GiB free on the disk of {}",
                    dir.display()
                );
            }
        }
        Err(e) => eprintln!(
            "aip-node: cannot tell the free disk of {}: {e}",
            dir.display()
        ),
    }
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map_or(manifest.clone(), PathBuf::from)
}

fn run(parsed: &Parsed) -> Result<ExitCode, String> {
    let mut stop = Stop::catch()?;
    let images = parsed.images()?;
    let before = parsed.check_host.then(Snapshot::take);
    let launched = node::launch(&images).map_err(|e| e.to_string())?;
    eprintln!(
        "aip-node: node {} at {} ready in {:.1} s; running {}",
        launched.info.node_name,
        launched.info.node_address,
        launched.info.started_in_ms as f64 / 1000.0,
        parsed.command.join(" ")
    );
    report_disk(&launched.info.dir);
    let (program, args) = parsed.command.split_first().ok_or("no command")?;
    let status = stop.wait_or_signal(launched.command(program, args));
    let stopped = launched.stop();
    let mut failed = false;
    if let Err(e) = stopped {
        eprintln!("aip-node: {e}");
        failed = true;
    }
    if let Some(before) = before {
        let after = Snapshot::take();
        let differences = after.differences(&before);
        if differences.is_empty() {
            eprintln!("aip-node: host check: {} unchanged", after.summary());
        } else {
            eprintln!("aip-node: host check failed, the node left the machine changed:");
            for line in differences {
                eprintln!("  {line}");
            }
            failed = true;
        }
    }
    let code = match status {
        Ok(code) => code,
        Err(e) => {
            eprintln!("aip-node: {e}");
            1
        }
    };
    Ok(if failed && code == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::from(u8::try_from(code).unwrap_or(1))
    })
}

/// SIGINT and SIGTERM, caught from the launcher's first moment: one that
/// arrives while the node is starting is not fatal to the launcher (which
/// would leave its node to notice its closed stdin, and exit with the
/// signal's status); it is acted on once the node is up.
struct Stop {
    runtime: tokio::runtime::Runtime,
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    fn catch() -> Result<Stop, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (interrupt, terminate) = {
            let _entered = runtime.enter();
            let caught = |kind| signal(kind).map_err(|e| format!("cannot catch signals: {e}"));
            (
                caught(SignalKind::interrupt())?,
                caught(SignalKind::terminate())?,
            )
        };
        Ok(Stop {
            runtime,
            interrupt,
            terminate,
        })
    }

    /// Waits for SIGINT or SIGTERM (caught since [`Stop::catch`]).
    fn until_signal(&mut self) -> rustix::process::Signal {
        self.runtime
            .block_on(next_signal(&mut self.interrupt, &mut self.terminate))
    }

    /// Runs `command` to its end; SIGINT or SIGTERM to the launcher (also
    /// one that came while the node started) is passed on to it (its
    /// process group), and the launcher then stops the node: 130.
    fn wait_or_signal(&mut self, command: std::process::Command) -> Result<i32, String> {
        let signal = next_signal(&mut self.interrupt, &mut self.terminate);
        self.runtime.block_on(async {
            let mut command = tokio::process::Command::from(command);
            command.process_group(0);
            let mut child = command
                .spawn()
                .map_err(|e| format!("cannot run the command: {e}"))?;
            let signalled = tokio::select! {
                status = child.wait() => return Ok(status.map_err(|e| e.to_string())?.code().unwrap_or(1)),
                signalled = signal => signalled,
            };
            eprintln!("aip-node: interrupted; stopping the command, then the node");
            if let Some(group) = child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process_group(group, signalled);
            }
            let _ = child.wait().await;
            Ok(130)
        })
    }
}

/// The next SIGINT or SIGTERM.
async fn next_signal(
    interrupt: &mut tokio::signal::unix::Signal,
    terminate: &mut tokio::signal::unix::Signal,
) -> rustix::process::Signal {
    tokio::select! {
        _ = interrupt.recv() => rustix::process::Signal::INT,
        _ = terminate.recv() => rustix::process::Signal::TERM,
    }
}

fn up(parsed: &Parsed) -> Result<ExitCode, String> {
    let mut stop = Stop::catch()?;
    let images = parsed.images()?;
    let launched = node::launch(&images).map_err(|e| e.to_string())?;
    let info = &launched.info;
    println!(
        "node {} at {} ready in {:.1} s (API server {})",
        info.node_name,
        info.node_address,
        info.started_in_ms as f64 / 1000.0,
        info.url
    );
    println!("  aip-node enter -- kubectl get nodes    # any command, inside the node's network");
    println!("  logs: {}", info.dir.display());
    println!("Ctrl-C stops it");
    stop.until_signal();
    launched.stop().map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

fn enter(command: &[String]) -> Result<ExitCode, String> {
    let dir = std::env::var_os(node::ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| node::base_dir().join("node"));
    let info = NodeInfo::read(&dir)
        .map_err(|e| format!("no running node ({e}): start one with `aip-node up`"))?;
    // Only returns if it could not become the command.
    let error = node::enter(&info, command);
    Err(format!("cannot run {}: {error}", command.join(" ")))
}

fn inside(parsed: &Parsed) -> Result<ExitCode, String> {
    let dir = parsed.dir.clone().ok_or("inside needs --dir")?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(node::serve(&dir, &parsed.images))
        .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

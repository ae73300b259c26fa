//! Starting and stopping the node from the host: cleaning up after a run
//! that was killed, keeping what the node changes, starting `aip-node
//! inside` in namespaces of its own, and putting everything back.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{NodeInfo, cgroups, host};
use crate::Error;

/// How long the node may take from launch to ready (control plane, images,
/// kubelet, DNS) on a loaded 2-core machine.
const START: Duration = Duration::from_secs(300);
/// How long the node may take to stop once told to.
const STOP: Duration = Duration::from_secs(60);

/// The launcher's directory, the same for every run so that a run that was
/// killed is found and cleaned up by the next: `$TMPDIR/aip-node`.
pub fn base_dir() -> PathBuf {
    std::env::temp_dir().join("aip-node")
}

fn saved_sysctls() -> PathBuf {
    base_dir().join("sysctls.saved")
}

/// Undoes whatever a node left on the machine (a run that was killed, or
/// the end of this one): kills every process in the node's cgroups,
/// removes them, restores the sysctls, removes the directory. Says what it
/// found when there was anything.
pub fn clean_leftovers() -> Result<(), Error> {
    let base = base_dir();
    let processes = cgroups::processes();
    let had_cgroups = cgroups::hierarchies()
        .iter()
        .any(|h| h.join(cgroups::ROOT).exists());
    if !base.exists() && !had_cgroups {
        return Ok(());
    }
    if !processes.is_empty() {
        eprintln!(
            "aip-node: cleaning up after an earlier node: {} processes",
            processes.len()
        );
    }
    cgroups::kill_all(None).map_err(|reason| Error::Cleanup { reason })?;
    cgroups::remove().map_err(|reason| Error::Cleanup { reason })?;
    if let Ok(saved) = std::fs::read_to_string(saved_sysctls()) {
        host::restore_sysctls(&saved).map_err(|reason| Error::Cleanup { reason })?;
    }
    match std::fs::remove_dir_all(&base) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io("cannot remove", &base)(e))
        }
        _ => Ok(()),
    }
}

/// A running node.
pub struct Launched {
    pub info: NodeInfo,
    child: Child,
    /// Closing it stops the node.
    lifeline: Option<ChildStdin>,
}

impl Launched {
    /// A command that runs `program` inside the node's network namespace,
    /// in the node's cgroup (so that it goes with the node), with
    /// [`super::ENV`] and `KUBECONFIG` (the administrator) set.
    pub fn command(&self, program: &str, args: &[String]) -> Command {
        let mut command =
            Command::new(std::env::current_exe().unwrap_or_else(|_| "aip-node".into()));
        command
            .arg("enter")
            .arg("--")
            .arg(program)
            .args(args)
            .env(super::ENV, &self.info.dir)
            .env(
                "KUBECONFIG",
                self.info.dir.join("controlplane/admin.kubeconfig"),
            );
        command
    }

    /// Stops the node and undoes everything it changed.
    pub fn stop(mut self) -> Result<(), Error> {
        drop(self.lifeline.take());
        let deadline = Instant::now() + STOP;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        clean_leftovers()
    }
}

/// `aip-node enter -- PROGRAM ARGS...` on behalf of [`Launched::command`]:
/// joins the node's cgroup and becomes `nsenter --net=... PROGRAM ARGS...`.
pub fn enter(info: &NodeInfo, program: &[String]) -> std::io::Error {
    if let Err(e) = cgroups::join(std::process::id()) {
        return e;
    }
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/proc/{}/ns/net", info.pid))
        .arg("--")
        .args(program)
        .env(super::ENV, &info.dir);
    if std::env::var_os("KUBECONFIG").is_none() {
        command.env("KUBECONFIG", info.dir.join("controlplane/admin.kubeconfig"));
    }
    command.exec()
}

/// Cleans up after any earlier run, saves what the node will change, and
/// starts the node with `images` imported; returns once it is ready.
pub fn launch(images: &[PathBuf]) -> Result<Launched, Error> {
    for tool in [
        "unshare",
        "nsenter",
        "ip",
        "mount",
        "ctr",
        "containerd",
        "runc",
        "iptables",
    ] {
        if !on_path(tool) {
            return Err(Error::ToolMissing {
                tool,
                hint: "scripts/ensure-node.sh installs what the node needs",
            });
        }
    }
    clean_leftovers()?;
    let base = base_dir();
    make_private_dir(&base)?;
    let saved = saved_sysctls();
    std::fs::write(&saved, host::read_kubelet_sysctls())
        .map_err(Error::io("cannot write", &saved))?;
    cgroups::create().map_err(Error::io("cannot create cgroup", cgroups::ROOT))?;
    let dir = base.join("node");
    make_private_dir(&dir)?;

    let exe = std::env::current_exe().map_err(Error::io("cannot find", "aip-node"))?;
    let mut command = Command::new("unshare");
    command
        .args(["--net", "--mount", "--propagation", "private", "--"])
        .arg(&exe)
        .arg("inside")
        .arg("--dir")
        .arg(&dir);
    for image in images {
        command.arg("--image").arg(image);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its own process group: a terminal's Ctrl-C reaches the launcher,
        // which stops the node in order.
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            process: "aip-node inside",
            source,
        })?;
    let lifeline = child.stdin.take();
    let stdout = child.stdout.take();
    let (said, heard) = mpsc::channel();
    std::thread::spawn(move || {
        let Some(stdout) = stdout else { return };
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if said.send(line).is_err() {
                break;
            }
        }
    });
    let mut launched = Launched {
        info: NodeInfo {
            url: String::new(),
            ca_pem: String::new(),
            tokens: Default::default(),
            node_name: String::new(),
            node_address: String::new(),
            pid: child.id(),
            dir: dir.clone(),
            containerd_socket: PathBuf::new(),
            started_in_ms: 0,
        },
        child,
        lifeline,
    };
    match heard.recv_timeout(START) {
        Ok(line) if line == "ready" => {
            launched.info = NodeInfo::read(&dir)?;
            Ok(launched)
        }
        outcome => {
            let why = match outcome {
                Ok(line) => format!("it said {line:?}"),
                Err(mpsc::RecvTimeoutError::Timeout) => format!("not ready within {START:?}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    "it exited (its error is above)".into()
                }
            };
            let _ = launched.stop();
            Err(Error::Node {
                what: "starting the node".into(),
                reason: format!("{why}; the processes' logs were in {}", dir.display()),
            })
        }
    }
}

fn make_private_dir(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)
        .map_err(Error::io("cannot create", path))
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .any(|dir| dir.join(tool).is_file())
}

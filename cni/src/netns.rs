//! Programs a pod's network namespace with the node's own tools: `nsenter
//! --net=NETNS` runs `iptables-restore` and `ip6tables-restore` inside it
//! (either backend, legacy or nft, whichever the node's tools are). The
//! rules live in the pod's namespace and go with it: nothing is written to
//! the node's own tables.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aip_api::egress_lock::Lock;

use crate::plugin::Program;
use crate::rules::{CHAIN, Family, restore_input};

/// How long one tool may run (it waits at most 5 s for the xtables lock).
const TOOL_PATIENCE: Duration = Duration::from_secs(15);

/// The node's iptables tools, found on PATH or in /usr/sbin and /sbin.
pub struct NodeTools;

impl Program for NodeTools {
    fn lock(&self, netns: &str, lock: &Lock) -> Result<(), String> {
        for family in [Family::V4, Family::V6] {
            let saved = inside(netns, family.save(), &["-t", "filter"], None)?;
            let jump = format!("-A OUTPUT -j {CHAIN}");
            let jump_exists = saved.lines().any(|l| l.trim() == jump);
            let input = restore_input(lock, family, jump_exists);
            inside(
                netns,
                family.restore(),
                &["--noflush", "-w", "5"],
                Some(&input),
            )?;
        }
        Ok(())
    }
}

/// Runs `tool ARGS` in the network namespace at `netns`, with `input` on
/// its stdin; its stdout, or its stderr as the error.
pub fn inside(
    netns: &str,
    tool: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    let program = find(tool)
        .ok_or_else(|| format!("{tool} is not installed on the node (PATH, /usr/sbin, /sbin)"))?;
    let nsenter = find("nsenter").ok_or("nsenter (util-linux) is not installed on the node")?;
    let mut child = Command::new(nsenter)
        .arg(format!("--net={netns}"))
        .arg(&program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nsenter: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.unwrap_or("").as_bytes())
            .map_err(|e| format!("cannot write to {tool}: {e}"))?;
    }
    let deadline = Instant::now() + TOOL_PATIENCE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{tool} did not finish within {}s",
                    TOOL_PATIENCE.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {tool}: {e}")),
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("cannot read {tool}'s output: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{tool} in {netns} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `name` on PATH, or in /usr/sbin or /sbin (a runtime may run plugins
/// with a short PATH).
fn find(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

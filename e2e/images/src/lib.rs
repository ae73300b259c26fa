//! The images `make images` writes (target/images/NAME.tar), opened the way
//! a container runtime opens them: the archive's manifest and image config
//! read, its layers unpacked into a root filesystem, and the entrypoint run
//! from that root as the image's user — by chroot(1) with `--userspec` when
//! the tests run as root, in a user namespace (unshare(1)) otherwise — with
//! no shell and only the config's environment.
//!
//! Test support for tests/images.rs; nothing here ships.

#![allow(clippy::unwrap_used)] // test support: a panic is the failure report

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// What `make images` builds, each as target/images/NAME.tar.
pub const IMAGES: [&str; 4] = ["aip-operator", "aip-sidecar", "aip-cni", "aip-fault-server"];

/// How long a process in an image may take to start or answer.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of current archives: scripts/images.sh (what `make images`
/// runs; it rebuilds only what changed) is run once per test process and by
/// one process at a time, so test runners that start a process per test
/// share one build. AIP_IMAGES=DIR tests archives built elsewhere instead.
pub fn archives() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("AIP_IMAGES") {
            return PathBuf::from(dir);
        }
        let repo = repo();
        let dir = repo.join("target/images");
        std::fs::create_dir_all(&dir).unwrap();
        let mut build = Command::new("flock");
        build
            .arg(dir.join(".lock"))
            .arg(repo.join("scripts/images.sh"))
            .current_dir(&repo);
        // The variables cargo sets for this test process would reach the
        // release build's build scripts (ring reads CARGO_MANIFEST_DIR) and
        // make it differ from `make images`' own: each would rebuild the
        // other's binaries, minutes every time.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if TEST_ONLY_VARIABLES.iter().any(|p| key.starts_with(p)) {
                build.env_remove(&*key);
            }
        }
        let status = build
            .status()
            .expect("flock (util-linux) runs scripts/images.sh");
        assert!(status.success(), "scripts/images.sh failed: {status}");
        dir
    })
    .clone()
}

/// Prefixes of what cargo sets for a test process and not for a build.
const TEST_ONLY_VARIABLES: [&str; 6] = [
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
];

/// One entry of a layer, as `tar --numeric-owner -tv` lists it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// e.g. `-rwxr-xr-x`, `drwxr-xr-x`, `lrwxrwxrwx`.
    pub mode: String,
    /// `uid/gid`.
    pub owner: String,
    /// Relative to the root, without a leading `./` or a trailing `/`.
    pub path: String,
}

/// An image archive, unpacked.
pub struct Image {
    pub name: String,
    /// What `docker load` names it (the archive's RepoTags).
    pub tags: Vec<String>,
    /// The image configuration (os, architecture, config.User, ...).
    pub config: Value,
    pub rootfs: PathBuf,
    pub entries: Vec<Entry>,
    scratch: PathBuf,
}

impl Image {
    /// Unpacks NAME.tar under `scratch` (removed again when the Image is
    /// dropped).
    pub fn open(name: &str, scratch: &Path) -> Image {
        let archive = archives().join(format!("{name}.tar"));
        let dir = scratch.join(name);
        make_writable(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let unpacked = dir.join("archive");
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&unpacked).unwrap();
        std::fs::create_dir_all(&rootfs).unwrap();
        tar(&["-xf", path_str(&archive), "-C", path_str(&unpacked)]);
        let manifest: Value = read_json(&unpacked.join("manifest.json"));
        let images = manifest.as_array().expect("manifest.json is a list");
        assert_eq!(images.len(), 1, "one image per archive: {manifest}");
        let image = &images[0];
        let config = read_json(&unpacked.join(image["Config"].as_str().unwrap()));
        let tags = strings(&image["RepoTags"]);
        let mut entries = Vec::new();
        for layer in strings(&image["Layers"]) {
            let layer = unpacked.join(layer);
            tar(&[
                "--numeric-owner",
                "-xpf",
                path_str(&layer),
                "-C",
                path_str(&rootfs),
            ]);
            entries.extend(list(&layer));
        }
        if !is_root() {
            // In the user namespace the unpacking user becomes the image's:
            // take write access away, as root ownership does for a runtime.
            let status = Command::new("chmod")
                .args(["-R", "a-w"])
                .arg(&rootfs)
                .status()
                .unwrap();
            assert!(status.success());
        }
        Image {
            name: name.to_owned(),
            tags,
            config,
            rootfs,
            entries,
            scratch: dir,
        }
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.config["config"]["Labels"][key].as_str()
    }

    pub fn entrypoint(&self) -> Vec<String> {
        strings(&self.config["config"]["Entrypoint"])
    }

    /// `uid:gid` as the config gives them.
    pub fn user(&self) -> (u32, u32) {
        let user = self.config["config"]["User"].as_str().unwrap_or_default();
        let (uid, gid) = user.split_once(':').unwrap_or((user, user));
        (uid.parse().unwrap(), gid.parse().unwrap())
    }

    /// Provides a file in the root filesystem as a volume mount would
    /// (a ConfigMap, a Secret, the kubelet's /etc/hosts): readable by the
    /// image's user, writable by no one.
    pub fn mount_file(&self, path: &str, contents: &str) {
        let target = self.rootfs.join(path.trim_start_matches('/'));
        let parent = target.parent().unwrap();
        make_writable(&self.rootfs);
        std::fs::create_dir_all(parent).unwrap();
        std::fs::write(&target, contents).unwrap();
        let status = Command::new("chmod")
            .args(["-R", "a+rX,a-w"])
            .arg(&self.rootfs)
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The entrypoint with `args`, as the runtime starts it: from the root
    /// filesystem, as the image's user, in its working directory, with
    /// exactly the config's environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let (uid, gid) = self.user();
        let mut command = if is_root() {
            let mut c = Command::new(program("chroot"));
            c.arg(format!("--userspec={uid}:{gid}")).arg(&self.rootfs);
            c
        } else {
            let mut c = Command::new(program("unshare"));
            c.args(["--user", &format!("--map-user={uid}")])
                .arg(format!("--map-group={gid}"))
                .arg(format!("--root={}", self.rootfs.display()))
                .arg("--wd=/");
            c
        };
        command.args(self.entrypoint()).args(args).env_clear();
        for pair in strings(&self.config["config"]["Env"]) {
            if let Some((key, value)) = pair.split_once('=') {
                command.env(key, value);
            }
        }
        command
    }

    /// Starts the entrypoint with `args`; its stderr lines arrive on
    /// [`Running::line_containing`].
    pub fn start(&self, args: &[&str]) -> Running {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            name: self.name.clone(),
            child,
            lines,
            seen: Vec::new(),
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        make_writable(&self.scratch);
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// A process started from an image; killed when dropped.
pub struct Running {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    /// Waits for the first stderr line containing `needle` and returns it.
    pub fn line_containing(&mut self, needle: &str) -> String {
        loop {
            match self.lines.recv_timeout(PATIENCE) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.seen.push(line),
                Err(e) => panic!(
                    "{}: no line with {needle:?} ({e}); stderr so far:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name` on this process's PATH: the command's own environment is the
/// image's, which has none.
fn program(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} (util-linux or coreutils) is not on PATH"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false)
}

fn make_writable(dir: &Path) {
    if dir.exists() {
        let _ = Command::new("chmod").args(["-R", "u+w"]).arg(dir).status();
    }
}

fn tar(args: &[&str]) {
    let out = Command::new("tar").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn list(layer: &Path) -> Vec<Entry> {
    let out = Command::new("tar")
        .args(["--numeric-owner", "-tvf"])
        .arg(layer)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            // mode owner size date time path [-> target]
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields[5]
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_owned();
            Entry {
                mode: fields[0].to_owned(),
                owner: fields[1].to_owned(),
                path,
            }
        })
        .filter(|e| !e.path.is_empty() && e.path != ".")
        .collect()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("paths under target/ are UTF-8")
}

//! `aip-cni install`: what the DaemonSet runs on every node. It copies the
//! plugin into the node's CNI binary directory, appends it to the node's
//! network configuration list (after the cluster's own plugins: it adds no
//! interface, it locks the one they made), writes the kubeconfig the plugin
//! looks pods up with, keeps all three in place while it runs (the
//! cluster's CNI may rewrite its list; the token rotates), and on SIGTERM
//! takes all three away again, leaving the node as it found it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

/// The plugin's `type` in the list, and its binary's name.
pub const PLUGIN: &str = "aip-cni";
/// The plugin's own files in the configuration directory (not a
/// configuration file: the runtime reads only *.conf, *.conflist, *.json).
pub const STATE_DIR: &str = "aip-cni.d";

/// How often the installer checks that its files are still in place.
const RECHECK: Duration = Duration::from_secs(2);

/// Where the installer puts things and what it copies.
#[derive(Debug, Clone)]
pub struct Install {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    /// `conf_dir` as the node (the runtime, the plugin) sees it: the
    /// installer may see it mounted elsewhere.
    pub host_conf_dir: PathBuf,
    /// The plugin binary to copy (this program).
    pub binary: PathBuf,
    /// The API server as pods reach it (https://HOST:PORT).
    pub server: String,
    /// The DaemonSet's projected token and the cluster's CA.
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
}

/// Why the installer stopped.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no network configuration list (*.conflist) in {}: the cluster's CNI has not written one yet, or writes a single .conf, which aip-cni cannot chain onto", dir.display())]
    NoList { dir: PathBuf },
    #[error("{}: not a CNI configuration list: {reason}", path.display())]
    NotAList { path: PathBuf, reason: String },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Where the pod's service account is mounted.
const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The installer's flags, each `--flag VALUE` or `--flag=VALUE`.
const FLAGS: [&str; 7] = [
    "--bin-dir",
    "--conf-dir",
    "--host-conf-dir",
    "--binary",
    "--token-file",
    "--ca-file",
    "--server",
];

impl Install {
    /// From the command line; `env` reads the pod's environment (the API
    /// server's address when `--server` is not given).
    pub fn from_args(
        args: &[String],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Install, String> {
        let mut flags: std::collections::BTreeMap<&str, String> = Default::default();
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            let (name, inline) = match flag.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (flag.as_str(), None),
            };
            let Some(name) = FLAGS.iter().copied().find(|f| *f == name) else {
                return Err(format!("unknown flag {name}"));
            };
            let value = match inline {
                Some(value) => value,
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))?,
            };
            flags.insert(name, value);
        }
        let path = |name: &str| flags.get(name).map(PathBuf::from);
        let server = match flags.get("--server") {
            Some(s) => s.clone(),
            None => {
                let host = env("KUBERNETES_SERVICE_HOST").unwrap_or_default();
                let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
                if host.is_empty() {
                    return Err(
                        "--server is required outside a pod (no KUBERNETES_SERVICE_HOST)".into(),
                    );
                } else if host.contains(':') {
                    format!("https://[{host}]:{port}")
                } else {
                    format!("https://{host}:{port}")
                }
            }
        };
        let conf_dir = path("--conf-dir").ok_or("--conf-dir is required")?;
        Ok(Install {
            bin_dir: path("--bin-dir").ok_or("--bin-dir is required")?,
            host_conf_dir: path("--host-conf-dir").unwrap_or_else(|| conf_dir.clone()),
            conf_dir,
            binary: match path("--binary") {
                Some(p) => p,
                None => {
                    std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?
                }
            },
            server,
            token_file: path("--token-file")
                .unwrap_or_else(|| PathBuf::from(ACCOUNT).join("token")),
            ca_file: path("--ca-file").unwrap_or_else(|| PathBuf::from(ACCOUNT).join("ca.crt")),
        })
    }

    fn state_dir(&self) -> PathBuf {
        self.conf_dir.join(STATE_DIR)
    }

    /// The state directory as the node sees it.
    fn host_state_dir(&self) -> PathBuf {
        self.host_conf_dir.join(STATE_DIR)
    }

    /// The plugin's entry in the list.
    pub fn entry(&self) -> Value {
        json!({"type": PLUGIN, "kubeconfig": self.host_state_dir().join("kubeconfig")})
    }

    /// Puts every file in place (again); true when something changed.
    pub fn ensure(&self) -> Result<bool, InstallError> {
        let mut changed = false;
        let target = self.bin_dir.join(PLUGIN);
        let source = std::fs::read(&self.binary).map_err(io("read", &self.binary))?;
        if std::fs::read(&target).ok().as_deref() != Some(&source[..]) {
            write_atomically(&target, &source, 0o755)?;
            changed = true;
        }
        let state = self.state_dir();
        std::fs::create_dir_all(&state).map_err(io("create", &state))?;
        set_mode(&state, 0o700)?;
        let token = std::fs::read(&self.token_file).map_err(io("read", &self.token_file))?;
        let ca = std::fs::read(&self.ca_file).map_err(io("read", &self.ca_file))?;
        changed |= replace(&state.join("token"), &token, 0o600)?;
        changed |= replace(&state.join("ca.crt"), &ca, 0o600)?;
        let kubeconfig = kubeconfig(&self.server, &self.host_state_dir());
        changed |= replace(&state.join("kubeconfig"), kubeconfig.as_bytes(), 0o600)?;
        let list = primary_list(&self.conf_dir)?;
        let text = std::fs::read_to_string(&list).map_err(io("read", &list))?;
        let parsed: Value = serde_json::from_str(&text).map_err(|e| InstallError::NotAList {
            path: list.clone(),
            reason: e.to_string(),
        })?;
        if unchain(&parsed).is_none() {
            // The list as the cluster's CNI wrote it, to put back byte for
            // byte when the plugin leaves.
            replace(&state.join(original_name(&list)), text.as_bytes(), 0o600)?;
        }
        if let Some(chained) =
            chain(&parsed, &self.entry()).map_err(|reason| InstallError::NotAList {
                path: list.clone(),
                reason,
            })?
        {
            let text = serde_json::to_string_pretty(&chained).unwrap_or_default();
            write_atomically(&list, text.as_bytes(), 0o644)?;
            changed = true;
        }
        Ok(changed)
    }

    /// True when the plugin is installed and chained (the readiness probe).
    pub fn installed(&self) -> bool {
        let chained = primary_list(&self.conf_dir)
            .ok()
            .and_then(|list| std::fs::read_to_string(list).ok())
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|list| chain(&list, &self.entry()).ok())
            .is_some_and(|change| change.is_none());
        chained
            && self.bin_dir.join(PLUGIN).is_file()
            && self.state_dir().join("kubeconfig").is_file()
    }

    /// Takes the plugin out of every list and removes its files.
    pub fn remove(&self) -> Result<(), InstallError> {
        for list in lists(&self.conf_dir)? {
            let Ok(text) = std::fs::read_to_string(&list) else {
                continue;
            };
            let Ok(parsed) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if let Some(unchained) = unchain(&parsed) {
                let original = std::fs::read(self.state_dir().join(original_name(&list)))
                    .ok()
                    .filter(|o| {
                        serde_json::from_slice::<Value>(o).ok().as_ref() == Some(&unchained)
                    });
                let text = original.unwrap_or_else(|| {
                    serde_json::to_string_pretty(&unchained)
                        .unwrap_or_default()
                        .into_bytes()
                });
                write_atomically(&list, &text, 0o644)?;
            }
        }
        let binary = self.bin_dir.join(PLUGIN);
        match std::fs::remove_file(&binary) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &binary)(e)),
        }
        let state = self.state_dir();
        match std::fs::remove_dir_all(&state) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &state)(e)),
        }
    }

    /// Installs, keeps it so until SIGTERM or SIGINT, then removes it.
    pub async fn run(&self) -> Result<(), InstallError> {
        self.ensure()?;
        say(&format!(
            "installed {} and chained it in {}",
            self.bin_dir.join(PLUGIN).display(),
            primary_list(&self.conf_dir)?.display()
        ));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io("handle SIGTERM for", &self.binary))?;
        let mut tick = tokio::time::interval(RECHECK);
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = tick.tick() => match self.ensure() {
                    Ok(true) => say("put the plugin back in place (its files or its entry had changed)"),
                    Ok(false) => {}
                    Err(e) => say(&format!("cannot keep the plugin in place: {e}")),
                },
            }
        }
        self.remove()?;
        say("removed the plugin from the node");
        Ok(())
    }
}

fn say(message: &str) {
    eprintln!(
        "{}",
        json!({"level": "INFO", "target": "aip_cni::install", "message": message})
    );
}

/// The kubeconfig the plugin reads: the server, the CA and the token, each
/// from the files next to it (the token file is rewritten as it rotates).
fn kubeconfig(server: &str, state: &Path) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {
            "server": server,
            "certificate-authority": state.join("ca.crt")}}],
        "users": [{"name": PLUGIN, "user": {"tokenFile": state.join("token")}}],
        "contexts": [{"name": PLUGIN, "context": {"cluster": "cluster", "user": PLUGIN}}],
        "current-context": PLUGIN
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// Where the state directory keeps `list` as it was before the plugin.
fn original_name(list: &Path) -> String {
    let name = list
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}.original")
}

/// The configuration lists of `dir`, in the order the runtime reads them.
fn lists(dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io("read", dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conflist") && p.is_file())
        .collect();
    out.sort();
    Ok(out)
}

/// The list the runtime uses: the first by name.
fn primary_list(dir: &Path) -> Result<PathBuf, InstallError> {
    lists(dir)?
        .into_iter()
        .next()
        .ok_or_else(|| InstallError::NoList {
            dir: dir.to_path_buf(),
        })
}

/// `list` with `entry` last among its plugins, or None when it is there
/// already (an older entry of this plugin is replaced).
pub fn chain(list: &Value, entry: &Value) -> Result<Option<Value>, String> {
    let plugins = list["plugins"]
        .as_array()
        .ok_or("it has no \"plugins\" array")?;
    if plugins.last() == Some(entry) && plugins.iter().filter(|p| is_ours(p)).count() == 1 {
        return Ok(None);
    }
    let mut out = list.clone();
    let mut kept: Vec<Value> = plugins.iter().filter(|p| !is_ours(p)).cloned().collect();
    if kept.is_empty() {
        return Err("it lists no plugin to chain onto".into());
    }
    kept.push(entry.clone());
    out["plugins"] = Value::Array(kept);
    Ok(Some(out))
}

/// `list` without this plugin, or None when it has none.
pub fn unchain(list: &Value) -> Option<Value> {
    let plugins = list["plugins"].as_array()?;
    if !plugins.iter().any(is_ours) {
        return None;
    }
    let mut out = list.clone();
    out["plugins"] = Value::Array(plugins.iter().filter(|p| !is_ours(p)).cloned().collect());
    Some(out)
}

fn is_ours(plugin: &Value) -> bool {
    plugin["type"] == PLUGIN
}

/// Writes `path` unless it holds `bytes` already; true when written.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, InstallError> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(false);
    }
    write_atomically(path, bytes, mode)?;
    Ok(true)
}

/// Writes a temporary file beside `path` and renames it over: a reader (the
/// runtime, the plugin) sees the old file or the new one, never half.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.aip-cni-tmp"));
    std::fs::write(&temporary, bytes).map_err(io("write", &temporary))?;
    set_mode(&temporary, mode)?;
    std::fs::rename(&temporary, path).map_err(io("replace", path))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io("chmod", path))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn list() -> Value {
        json!({"cniVersion": "1.0.0", "name": "k8s", "plugins": [
            {"type": "bridge", "bridge": "cni0"}, {"type": "portmap"}]})
    }

    fn setup() -> (tempfile::TempDir, Install) {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["bin", "net.d", "sa"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("net.d/10-k8s.conflist"), list().to_string()).unwrap();
        std::fs::write(
            dir.path().join("net.d/99-other.conflist"),
            list().to_string(),
        )
        .unwrap();
        std::fs::write(dir.path().join("sa/token"), "t1").unwrap();
        std::fs::write(dir.path().join("sa/ca.crt"), "ca").unwrap();
        std::fs::write(dir.path().join("plugin"), "binary").unwrap();
        let install = Install {
            bin_dir: dir.path().join("bin"),
            conf_dir: dir.path().join("net.d"),
            host_conf_dir: dir.path().join("net.d"),
            binary: dir.path().join("plugin"),
            server: "https://10.96.0.1:443".into(),
            token_file: dir.path().join("sa/token"),
            ca_file: dir.path().join("sa/ca.crt"),
        };
        (dir, install)
    }

    #[test]
    fn install_chains_last_in_the_first_list_and_removal_leaves_the_node_as_it_was() {
        let (dir, install) = setup();
        let before = snapshot(dir.path());
        assert!(!install.installed());
        assert!(install.ensure().unwrap());
        assert!(install.installed());
        let chained: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("net.d/10-k8s.conflist")).unwrap(),
        )
        .unwrap();
        assert_eq!(chained["plugins"][0]["type"], "bridge");
        assert_eq!(chained["plugins"][2]["type"], PLUGIN);
        let other = std::fs::read_to_string(dir.path().join("net.d/99-other.conflist")).unwrap();
        assert!(!other.contains(PLUGIN), "only the list the runtime uses");
        assert!(!install.ensure().unwrap(), "nothing to do the second time");

        // The cluster's CNI rewrites its list; the token rotates.
        std::fs::write(dir.path().join("net.d/10-k8s.conflist"), list().to_string()).unwrap();
        std::fs::write(dir.path().join("sa/token"), "t2").unwrap();
        assert!(install.ensure().unwrap());
        assert!(install.installed());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("net.d/aip-cni.d/token")).unwrap(),
            "t2"
        );

        install.remove().unwrap();
        assert!(!install.installed());
        // Byte for byte, as the cluster's CNI wrote it.
        assert_eq!(
            std::fs::read_to_string(dir.path().join("net.d/10-k8s.conflist")).unwrap(),
            list().to_string()
        );
        assert_eq!(snapshot(dir.path()), before);
        install.remove().unwrap();
    }

    #[test]
    fn flags_take_their_values_either_way_and_the_server_comes_from_the_pod() {
        let args: Vec<String> = [
            "--bin-dir=/host/bin",
            "--conf-dir",
            "/host/net.d",
            "--host-conf-dir=/etc/cni/net.d",
        ]
        .map(String::from)
        .to_vec();
        let env = |name: &str| match name {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".to_owned()),
            _ => None,
        };
        let install = Install::from_args(&args, env).unwrap();
        assert_eq!(install.bin_dir, Path::new("/host/bin"));
        assert_eq!(install.conf_dir, Path::new("/host/net.d"));
        assert_eq!(
            install.entry()["kubeconfig"],
            "/etc/cni/net.d/aip-cni.d/kubeconfig"
        );
        assert_eq!(install.server, "https://[fd00::1]:6443");
        assert_eq!(install.token_file, Path::new(ACCOUNT).join("token"));
        let err = Install::from_args(&["--bin".to_owned()], env).unwrap_err();
        assert_eq!(err, "unknown flag --bin");
        let err = Install::from_args(&["--conf-dir=/x".to_owned()], |_| None).unwrap_err();
        assert!(err.contains("--server is required"), "{err}");
    }

    #[test]
    fn a_missing_list_is_named() {
        let (dir, install) = setup();
        for name in ["10-k8s.conflist", "99-other.conflist"] {
            std::fs::remove_file(dir.path().join("net.d").join(name)).unwrap();
        }
        let said = install.ensure().unwrap_err().to_string();
        assert!(
            said.starts_with("no network configuration list (*.conflist) in "),
            "{said}"
        );
    }

    /// The node's side: every file of the binary and configuration
    /// directories, a list as its JSON value (it is rewritten indented).
    fn snapshot(dir: &Path) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.join("bin"), dir.join("net.d")];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    out.push((path.display().to_string(), value));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

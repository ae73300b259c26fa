//! The standalone configuration source: a multi-document YAML file, read at
//! start and again whenever its content changes. An invalid new file keeps
//! the previous configuration and reports its errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aip_policy::CompileOptions;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Config, ConfigError, ConfigErrors, from_documents};

/// Reads and validates the file.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    read(path).1
}

/// Reads the file once: the digest of exactly the bytes read, and what they
/// configure.
fn read(path: &Path) -> (Option<Vec<u8>>, Result<Config, ConfigErrors>) {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            let error = ConfigError::at(
                "",
                "",
                format!(
                    "cannot be read: {}",
                    aip_errors::without_os_errors(&e.to_string())
                ),
            );
            return (None, Err(ConfigErrors(vec![error])));
        }
    };
    let digest = Some(Sha256::digest(&bytes).to_vec());
    let config = match String::from_utf8(bytes) {
        Ok(text) => parse(&text, &options_for(path)),
        Err(e) => Err(ConfigErrors(vec![ConfigError::at(
            "",
            "",
            format!("not UTF-8 at byte {}", e.utf8_error().valid_up_to()),
        )])),
    };
    (digest, config)
}

/// Parses configuration text.
pub fn parse(text: &str, options: &CompileOptions) -> Result<Config, ConfigErrors> {
    let options_yaml = serde_saphyr::options! { strict_booleans: true };
    let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options_yaml)
        .map_err(|e| ConfigErrors(vec![ConfigError::at("", "", format!("invalid YAML: {e}"))]))?;
    let documents: Vec<Value> = documents.into_iter().filter(|d| !d.is_null()).collect();
    from_documents(&documents, options)
}

/// The file's own absolute path is protected; `~` is `$HOME`.
pub fn options_for(path: &Path) -> CompileOptions {
    CompileOptions {
        home: std::env::var("HOME").ok().filter(|h| !h.is_empty()),
        policy_path: std::path::absolute(path)
            .ok()
            .map(|p| p.display().to_string()),
        ..CompileOptions::default()
    }
}

/// A watched configuration file: the config in force, and the errors of the
/// most recent load that was refused (None once a load succeeds).
pub struct Watched {
    pub config: watch::Receiver<Arc<Config>>,
    pub errors: watch::Receiver<Option<Arc<ConfigErrors>>>,
}

/// Loads the file and keeps watching it, publishing each new valid
/// configuration. If the first load fails, the config is empty (every tool
/// call blocked) and the errors are published.
pub fn watch(path: PathBuf, poll: Duration, shutdown: CancellationToken) -> Watched {
    let (mut seen, loaded) = read(&path);
    let (first, first_errors) = match loaded {
        Ok(c) => (c, None),
        Err(e) => (Config::empty(), Some(Arc::new(e))),
    };
    let (config_tx, config) = watch::channel(Arc::new(first));
    let (errors_tx, errors) = watch::channel(first_errors);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if digest(&path) == seen {
                continue;
            }
            let (now, loaded) = read(&path);
            seen = now;
            match loaded {
                Ok(new) => {
                    tracing::info!(file = %path.display(), "configuration reloaded");
                    config_tx.send_replace(Arc::new(new));
                    errors_tx.send_if_modified(|e| e.take().is_some());
                }
                Err(e) => {
                    for error in &e.0 {
                        tracing::error!(file = %path.display(), %error, "new configuration refused; keeping the previous one");
                    }
                    errors_tx.send_replace(Some(Arc::new(e)));
                }
            }
        }
    });
    Watched { config, errors }
}

fn digest(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path)
        .ok()
        .map(|b| Sha256::digest(&b).to_vec())
}

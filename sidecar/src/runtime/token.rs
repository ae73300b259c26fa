//! The approval token of a standalone gateway's admin routes.

use std::io::Write;
use std::path::{Path, PathBuf};

use secrecy::SecretString;

pub(super) fn default_token_file() -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("aip-sidecar-{}", std::process::id()))
        .join("approval-token")
}

/// Reads the token file, or creates it (directory 0700, file 0600) with a
/// random token.
pub(super) fn approval_token(path: &Path) -> anyhow::Result<SecretString> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_owned();
        anyhow::ensure!(
            !token.is_empty(),
            "approval token file {} is empty",
            path.display()
        );
        return Ok(SecretString::from(token));
    }
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let token = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{token}")?;
    Ok(SecretString::from(token))
}

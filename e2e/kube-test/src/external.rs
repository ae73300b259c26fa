//! Any cluster, reached through a kubeconfig (`AIP_TEST_KUBECONFIG`): its
//! current context is the administrator, and everyone else is that
//! administrator impersonating them.

use std::path::{Path, PathBuf};

use base64::Engine;
use kube::config::Kubeconfig;

use crate::Error;
use crate::kubeconfig::current_only;
use crate::process::Supervised;

pub(crate) struct External {
    /// The kubeconfig's current context, cluster and user, and nothing else.
    pub admin: Kubeconfig,
    pub url: String,
    pub ca_pem: Option<String>,
    /// Where the per-user kubeconfigs (copies of the administrator's
    /// credentials) are written, readable by this user only; removed on
    /// drop, and by the janitor when the test process exits.
    pub dir: PathBuf,
    _janitor: Supervised,
}

impl Drop for External {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn load(path: &Path) -> Result<External, Error> {
    let invalid = |reason: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let config = Kubeconfig::read_from(path).map_err(|e| invalid(e.to_string()))?;
    let admin = current_only(&config).map_err(invalid)?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| invalid("its current cluster is empty".into()))?;
    let url = cluster
        .server
        .clone()
        .ok_or_else(|| invalid("its current cluster has no server".into()))?;
    let ca_pem = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| invalid(format!("certificate-authority-data is not base64: {e}")))?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        }
        (None, Some(file)) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| invalid(format!("certificate-authority {file}: {e}")))?,
        ),
        (None, None) => None,
    };
    let dir = crate::local::fresh_dir()?;
    // Nothing to supervise but the directory: a process that only waits,
    // whose watchdog removes the directory when the test process goes.
    let janitor = Supervised::spawn(
        "janitor",
        Path::new("sleep"),
        &["2147483647".to_owned()],
        &dir,
        Some(&dir),
    );
    let janitor = match janitor {
        Ok(janitor) => janitor,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    Ok(External {
        admin,
        url,
        ca_pem,
        dir,
        _janitor: janitor,
    })
}

//! Local resources a test or benchmark sets up: a serving certificate on
//! disk and a free loopback port.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// The operator's serving certificate (for localhost and 127.0.0.1) and
/// key, on disk.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate's PEM text.
    pub cert_pem: String,
}

impl TlsFiles {
    pub fn new(dir: &Path) -> TlsFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
        let files = TlsFiles {
            cert: dir.join("operator.crt"),
            key: dir.join("operator.key"),
            cert_pem: cert.pem(),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

/// A loopback port free a moment ago (for a process that must come back
/// on the same one).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

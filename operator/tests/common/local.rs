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
/// on the same one). Taken below the kernel's range for outgoing
/// connections (32768-60999 by default): a port the kernel handed out for
/// binding port 0 is also one it may hand any process as the source port of
/// a connection before our process binds it, and then the bind fails with
/// `Address already in use` (the control planes beside a test open many).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over the range by process and by call, so that test processes
    // running at once start at different places.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % 6000) as u16 * 2;
    for _ in 0..12_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (start.wrapping_add(offset.wrapping_mul(7)) % 12_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 20000-31999")
}

//! The gRPC listener's connections, bounded as every listener of the project
//! is (`aip_service::serve`): a cap on the sidecars served at once
//! (`--max-sidecars`; each connection holds its slot until it closes), and
//! accept errors — out of file descriptors — that slow accepting down
//! instead of spinning or ending the server. TLS is done here rather than
//! by tonic, so that each handshake presents the certificate served at that
//! moment (`certs::server_config`): a rotation needs no restart.
//!
//! A connection over the cap is not left in the kernel's backlog with no
//! answer: it is accepted, marked (`Slot::Over`), and every call on it is
//! refused at once with RESOURCE_EXHAUSTED (`ConfigService`), so that the
//! sidecar reconnects, with jitter, through the Service, until a replica
//! with room takes it. It is closed after `OVER_CAP_LIFETIME` whatever the
//! client does, and at most `OVER_CAP_MAX` of them are open at once
//! (beyond that, the backlog again: a burst larger than any fleet).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Sidecars (one connection each) a single operator replica serves at
/// once, by default (`--max-sidecars`): docs/operator.md#capacity says how
/// it was measured.
pub const DEFAULT_MAX_SIDECARS: usize = 5000;
/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a connection over the cap stays open: long enough to hear its
/// refusal.
pub const OVER_CAP_LIFETIME: Duration = Duration::from_secs(10);
/// Connections over the cap open at once, at most.
pub const OVER_CAP_MAX: usize = 1024;

/// Whether a connection is served or only told to go elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Served,
    /// The replica serves its cap: every call is refused.
    OverCap,
}

/// What a call learns of its connection (tonic puts it in the request's
/// extensions).
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    pub tcp: TcpConnectInfo,
    pub admission: Admission,
}

/// An accepted connection, past its TLS handshake, and its slot: under the
/// cap, or among those over it (closed at `closes_at`).
pub struct Counted {
    stream: TlsStream<TcpStream>,
    admission: Admission,
    _slot: OwnedSemaphorePermit,
    closes_at: Option<Pin<Box<Sleep>>>,
    _counted: Option<crate::metrics::ConnectedGuard>,
}

/// The listener's connections as a stream for tonic, until the receiver
/// is dropped; at most `max_sidecars` served at once (counted in
/// `metrics`, with those refused for the cap).
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    max_sidecars: usize,
    metrics: Arc<crate::metrics::Metrics>,
) -> ReceiverStream<io::Result<Counted>> {
    metrics.set_max_sidecars(max_sidecars);
    let (tx, rx) = mpsc::channel(16);
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(max_sidecars.max(1)));
    let overflow = Arc::new(Semaphore::new(OVER_CAP_MAX));
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(5);
        loop {
            // A slot under the cap if there is one, else one over it.
            let (slot, admission) = match slots.clone().try_acquire_owned() {
                Ok(slot) => (slot, Admission::Served),
                Err(_) => tokio::select! {
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => (slot, Admission::Served),
                        Err(_) => return,
                    },
                    slot = overflow.clone().acquire_owned() => match slot {
                        Ok(slot) => (slot, Admission::OverCap),
                        Err(_) => return,
                    },
                },
            };
            let stream = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            match stream {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(5);
                    let _ = stream.set_nodelay(true);
                    if admission == Admission::OverCap {
                        metrics.capacity_refused();
                    }
                    // The handshake runs beside the accept loop: a slow
                    // client holds up only its own slot.
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                let over = admission == Admission::OverCap;
                                let closes_at =
                                    over.then(|| Box::pin(tokio::time::sleep(OVER_CAP_LIFETIME)));
                                let _ = tx
                                    .send(Ok(Counted {
                                        stream,
                                        admission,
                                        _slot: slot,
                                        closes_at,
                                        _counted: (!over).then(|| metrics.grpc_connection()),
                                    }))
                                    .await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed")
                            }
                            Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "gRPC accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

impl Connected for Counted {
    type ConnectInfo = ConnectInfo;

    fn connect_info(&self) -> ConnectInfo {
        ConnectInfo {
            tcp: self.stream.get_ref().0.connect_info(),
            admission: self.admission,
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A connection over the cap ends (reads as closed) when its time
        // is up, whatever its client does.
        if let Some(closes_at) = this.closes_at.as_mut()
            && closes_at.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

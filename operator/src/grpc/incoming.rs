//! The gRPC listener's connections, bounded as every listener of the project
//! is (`aip_service::serve`): a cap on connections served at once (each holds
//! its slot until it closes), and accept errors — out of file descriptors —
//! that slow accepting down instead of spinning or ending the server. TLS is
//! done here rather than by tonic, so that each handshake presents the
//! certificate served at that moment (`certs::server_config`): a rotation
//! needs no restart.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Sidecars (one connection each) a single operator replica serves at once.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// An accepted connection, past its TLS handshake, and its slot under the
/// cap.
pub struct Counted {
    stream: TlsStream<TcpStream>,
    _slot: OwnedSemaphorePermit,
}

/// The listener's connections as a stream for tonic, until the receiver
/// is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> ReceiverStream<io::Result<Counted>> {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(5);
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            match stream {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(5);
                    let _ = stream.set_nodelay(true);
                    // The handshake runs beside the accept loop: a slow
                    // client holds up only its own slot.
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                let _ = tx
                                    .send(Ok(Counted {
                                        stream,
                                        _slot: slot,
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
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.get_ref().0.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
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

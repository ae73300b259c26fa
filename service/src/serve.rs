//! The one accept loop every HTTP/1 listener of the project runs: a bounded
//! number of connections, a deadline for each request's headers (so neither
//! idle nor header-trickling connections are held forever), and accept
//! errors (out of file descriptors, a reset before accept) that slow the loop
//! down instead of ending the process.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bounds of one listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; past this, new ones wait in the
    /// kernel's backlog until one ends.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, counted
    /// from the connection's start or the end of its previous response
    /// (so an idle keep-alive connection is closed after this too).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have
    /// (enforced by the server that reads the body).
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// An HTTP/1 connection builder with the limits' header deadline.
pub fn http1(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
}

/// Accepts connections until `shutdown`, handing each to `handle` (which
/// serves it, usually with [`http1`]) in a task on `tracker`. Returns when
/// `shutdown` fires; connections already accepted go on until they end.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    mut handle: F,
) where
    F: FnMut(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = Duration::from_millis(5);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            () = shutdown.cancelled() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(5);
                stream
            }
            Err(e) => {
                // EMFILE and friends: nothing is wrong with the listener, and
                // retrying at once would spin. Wait, then try again.
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "accept failed");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let served = handle(stream);
        tracker.spawn(async move {
            served.await;
            drop(permit);
        });
    }
}

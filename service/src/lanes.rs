//! Lanes: one single-threaded runtime per CPU the process may use, each
//! serving its own share of a listener's connections to their end.
//!
//! A work-stealing runtime pays for its balance on every message of a
//! proxy: a task woken while it runs (hyper handing a request body to the
//! service that reads it, a pooled upstream connection answering) is
//! re-queued and an idle worker is woken to steal it, a futex call and a
//! cross-CPU wake-up each time (about four per call in the sidecar's HTTP
//! hop, docs/performance.md). A lane never hands work to another thread:
//! a connection, the tasks it spawns and the upstream connections it
//! dials all stay on the lane that serves it. What a lane needs of its own
//! (an upstream connection pool, say) is picked by [`current`]. Balance
//! is decided once per connection instead ([`Spread`]): lane 0 accepts,
//! and each connection goes to the lane serving the fewest.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

thread_local! {
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// Lanes the process runs (set once at start; 1 until then).
static COUNT: AtomicUsize = AtomicUsize::new(1);

/// The lane this thread serves: 0 for the main runtime's thread (and any
/// thread that is no lane), 1.. for the others.
pub fn current() -> usize {
    LANE.with(Cell::get)
}

/// How many lanes the process runs: what per-lane state is sized by.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// How many lanes to run when none is asked for: one per CPU this process
/// may use (its affinity and cgroup CPU quota included).
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Declares `n` lanes (at least one); call before building anything that
/// sizes itself by [`count`]. Lane 0 is the caller's own runtime.
pub fn declare(n: usize) {
    COUNT.store(n.max(1), Ordering::Relaxed);
}

/// Serves a connection to its end, on the lane it is handed to.
pub type ServeFn = Arc<dyn Fn(TcpStream) -> BoxFuture + Send + Sync>;
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A connection on its way to another lane, and how that lane says it
/// ended.
struct Arrival {
    stream: std::net::TcpStream,
    ended: oneshot::Sender<()>,
}

/// Hands each accepted connection to the lane serving the fewest (lane 0,
/// the caller's, included); the other lanes' threads run until this is
/// dropped, so tasks that connections started there live as long as the
/// caller needs them.
pub struct Spread {
    serve: ServeFn,
    others: Vec<mpsc::UnboundedSender<Arrival>>,
    open: Arc<[AtomicUsize]>,
    next: AtomicUsize,
    stop: CancellationToken,
}

impl Spread {
    /// Starts lanes 1..[`count`], each a thread with a single-threaded
    /// runtime that serves what it is handed with `serve`.
    pub fn start(serve: ServeFn) -> std::io::Result<Spread> {
        let stop = CancellationToken::new();
        let mut others = Vec::new();
        for lane in 1..count() {
            let (tx, rx) = mpsc::unbounded_channel();
            spawn_lane(lane, serve.clone(), rx, stop.clone())?;
            others.push(tx);
        }
        let open = (0..count()).map(|_| AtomicUsize::new(0)).collect();
        Ok(Spread {
            serve,
            others,
            open,
            next: AtomicUsize::new(0),
            stop,
        })
    }

    /// Serves `stream` on the least busy lane; the future ends when the
    /// connection does (whichever lane serves it).
    pub fn dispatch(&self, stream: TcpStream) -> BoxFuture {
        let lane = self.pick();
        let open = Open::new(self.open.clone(), lane);
        if lane == 0 {
            let served = (self.serve)(stream);
            return Box::pin(async move {
                served.await;
                drop(open);
            });
        }
        let (ended, done) = oneshot::channel();
        let handed = stream
            .into_std()
            .map(|stream| Arrival { stream, ended })
            .map_err(|e| tracing::warn!(lane, error = %e, "cannot hand a connection over"))
            .ok()
            .and_then(|arrival| self.others[lane - 1].send(arrival).ok());
        Box::pin(async move {
            if handed.is_some() {
                let _ = done.await;
            }
            drop(open);
        })
    }

    /// The lane with the fewest open connections, ties taken in turn.
    fn pick(&self) -> usize {
        let n = self.open.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&lane| self.open[lane].load(Ordering::Relaxed))
            .unwrap_or(0)
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One open connection counted against its lane.
struct Open(Arc<[AtomicUsize]>, usize);

impl Open {
    fn new(open: Arc<[AtomicUsize]>, lane: usize) -> Open {
        open[lane].fetch_add(1, Ordering::Relaxed);
        Open(open, lane)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0[self.1].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Lane `lane`'s thread: serves each arrival in a task of its own until
/// `stop`.
fn spawn_lane(
    lane: usize,
    serve: ServeFn,
    mut arrivals: mpsc::UnboundedReceiver<Arrival>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("lane-{lane}"))
        .spawn(move || {
            LANE.with(|l| l.set(lane));
            runtime.block_on(async move {
                loop {
                    let arrival = tokio::select! {
                        arrival = arrivals.recv() => arrival,
                        () = stop.cancelled() => return,
                    };
                    let Some(Arrival { stream, ended }) = arrival else {
                        break;
                    };
                    match TcpStream::from_std(stream) {
                        Ok(stream) => {
                            let served = serve(stream);
                            tokio::spawn(async move {
                                served.await;
                                let _ = ended.send(());
                            });
                        }
                        Err(e) => tracing::warn!(lane, error = %e, "cannot take a connection"),
                    }
                }
                stop.cancelled().await;
            });
            // Tasks still running (a stream to an upstream) end with the
            // process; nothing waits for them here.
            runtime.shutdown_background();
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections go to the lane serving the fewest, each served on its
    /// lane's own thread, and a dispatch ends when its connection does.
    #[tokio::test]
    async fn connections_are_spread_over_the_lanes_and_served_there() {
        declare(2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let serve: ServeFn = Arc::new(move |mut stream: TcpStream| {
            let tx = tx.clone();
            Box::pin(async move {
                use tokio::io::AsyncReadExt;
                let thread = std::thread::current().name().map(str::to_owned);
                tx.send((current(), thread)).unwrap();
                let mut byte = [0u8; 1];
                let _ = stream.read(&mut byte).await; // until the client closes
            })
        });
        let spread = Spread::start(serve).unwrap();
        let open = |s: &Spread| {
            s.open
                .iter()
                .map(|o| o.load(Ordering::Relaxed))
                .sum::<usize>()
        };
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..4 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            served.push(tokio::spawn(spread.dispatch(stream)));
        }
        let mut lanes = Vec::new();
        for _ in 0..4 {
            lanes.push(rx.recv().await.unwrap());
        }
        lanes.sort();
        let main = std::thread::current().name().map(str::to_owned);
        assert_eq!(
            lanes,
            vec![
                (0, main.clone()),
                (0, main),
                (1, Some("lane-1".to_owned())),
                (1, Some("lane-1".to_owned()))
            ]
        );
        assert_eq!(open(&spread), 4);
        drop(clients);
        for s in served {
            s.await.unwrap();
        }
        assert_eq!(open(&spread), 0);
        declare(1);
    }
}

//! Bounded busy polling, for a process that relays lines over pipes (the
//! sidecar's stdio mode).
//!
//! Each hop through a proxy process costs a wake-up: the reader sleeps in
//! `epoll_wait` and the kernel has to schedule it again when a line arrives.
//! On small VMs a wake-up across CPUs costs tens of microseconds, more than
//! the wrap's own work. After the wrap writes a line, the answer (or the
//! client's next request) usually follows within microseconds, so for a short
//! window the event loop keeps polling the I/O driver without sleeping, as
//! Go's scheduler and Linux's `busy_poll` sockets do. The window is bounded
//! and restarts only when traffic flows: an idle process sleeps.
//!
//! One poller serves the whole process ([`start`]); every writer on the hot
//! path ([`touch`]: the agent's stdout, a stdio server's stdin) says when
//! traffic flowed. Without a poller, [`touch`] is one atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub struct BusyPoll {
    window: Duration,
    epoch: Instant,
    /// Nanoseconds since `epoch` until which the loop keeps polling.
    until: AtomicU64,
    traffic: Notify,
    /// Polls made without sleeping, for tests and curiosity.
    polls: AtomicU64,
}

/// The process's poller, once started.
static POLLER: OnceLock<Arc<BusyPoll>> = OnceLock::new();

/// Starts the process's poller on the current runtime (a zero window turns
/// busy polling off); a second start keeps the first poller.
pub fn start(window: Duration) -> Option<Arc<BusyPoll>> {
    let poll = BusyPoll::start(window)?;
    Some(POLLER.get_or_init(|| poll).clone())
}

/// Traffic just flowed: the process's poller (if any) keeps polling for
/// another window.
pub fn touch() {
    if let Some(poll) = POLLER.get() {
        poll.touch();
    }
}

impl BusyPoll {
    /// Starts a polling task on the current runtime; `None` for a zero
    /// window (busy polling off).
    pub fn start(window: Duration) -> Option<Arc<BusyPoll>> {
        if window.is_zero() {
            return None;
        }
        let poll = Arc::new(BusyPoll {
            window,
            epoch: Instant::now(),
            until: AtomicU64::new(0),
            traffic: Notify::new(),
            polls: AtomicU64::new(0),
        });
        tokio::spawn(poll.clone().run());
        Some(poll)
    }

    /// Traffic just flowed: keep polling for another window.
    pub fn touch(&self) {
        let until = self.now() + self.window.as_nanos() as u64;
        self.until.store(until, Ordering::Relaxed);
        self.traffic.notify_one();
    }

    /// How many times the loop has polled without sleeping so far.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    async fn run(self: Arc<Self>) {
        // The task ends with the runtime.
        loop {
            self.traffic.notified().await;
            // Yielding lets the scheduler poll the I/O driver without
            // sleeping, then run whatever became ready.
            while self.now() < self.until.load(Ordering::Relaxed) {
                self.polls.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_window_turns_it_off() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { assert!(BusyPoll::start(Duration::ZERO).is_none()) });
    }

    #[test]
    fn it_polls_for_the_window_after_traffic_and_then_sleeps() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let poll = BusyPoll::start(Duration::from_millis(20)).unwrap();
            tokio::task::yield_now().await;
            assert_eq!(poll.polls(), 0, "no traffic, no polling");
            poll.touch();
            // A timer still fires while the loop polls: the driver is polled.
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(poll.polls() > 0, "polling after traffic");
            tokio::time::sleep(Duration::from_millis(40)).await;
            let after = poll.polls();
            tokio::time::sleep(Duration::from_millis(40)).await;
            assert_eq!(poll.polls(), after, "asleep once the window is over");
        });
    }
}

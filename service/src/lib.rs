//! `aip-service`: what every long-running aip binary shares — diagnostics
//! and trace export, shutdown on SIGTERM/SIGINT, the one HTTP/1 accept loop
//! (bounded: a connection cap, a header deadline, accept errors that never
//! end the process), a lock that survives a panicked holder, and a sleep
//! until an optional deadline, busy polling for a stdio relay, and a memory
//! budget for the requests in flight, and lanes (a single-threaded runtime
//! per CPU, each serving its own connections).
//!
//! Nothing here knows about MCP, policy or Kubernetes.

pub mod budget;
pub mod busy_poll;
pub mod lanes;
pub mod serve;
pub mod sync;
pub mod telemetry;
pub mod time;

pub use telemetry::{
    LogFormat, TRACE_TARGET, Telemetry, announce, cancel_on_signal, init_telemetry, init_tracing,
    join_remote_trace, print_line, trace_context_of,
};

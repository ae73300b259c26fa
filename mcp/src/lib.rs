//! One MCP client connection to one server: the resolved connection
//! description, strict JSON-RPC parsing and canonical serialization, bounded
//! line reading, the Streamable HTTP and stdio transports, the standalone
//! GET stream, SSE, and the failure table that says what each failure means
//! for the session and the connection.
//!
//! Used by the gateway for every upstream call and by the operator's health
//! prober. It knows nothing of policy, agents or Kubernetes, and it never
//! re-sends a request: a failed call is reported, not replayed. Credentials
//! are secrets that no error or log line prints.

pub mod connection;
pub mod credentials;
pub mod failure;
pub mod http;
pub mod jsonrpc;
pub mod lines;
pub mod listen;
pub mod modern;
pub mod oauth;
pub mod protocol;
pub mod raw;
pub mod sse;
pub mod stdio;
pub mod upstream;

pub use connection::{ClientCapabilities, Connection, Endpoint, Tls};
pub use failure::{ConnectionEffect, Failure, SessionEffect};
pub use protocol::{Exchange, Related};
pub use upstream::Upstream;

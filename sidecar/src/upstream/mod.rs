//! MCP clients to the servers the gateway brokers.

pub mod failure;
pub mod http;
pub mod sse;

pub use failure::{ConnectionEffect, Failure, SessionEffect};
pub mod health;

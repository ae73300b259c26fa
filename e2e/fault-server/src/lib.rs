//! A deterministic fault-injection server: MCP tools (stdio and Streamable
//! HTTP, both eras of MCP on one endpoint) and command-line executables that
//! answer from authored, finite scripts and record every attempt. It plays
//! exactly what the document says and must never reach anything live: no
//! fall-through to a real server or binary.

#![forbid(unsafe_code)]

pub mod cli;
pub mod core;
pub mod era;
pub mod http;
pub mod log;
pub mod script;
pub mod stdio;

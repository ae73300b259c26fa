//! A deterministic fault-injection server: MCP tools (stdio and Streamable
//! HTTP) and command-line executables that answer from authored, finite
//! scripts and record every attempt. It plays exactly what the document says
//! and must never reach anything live: no fall-through to a real server or
//! binary.

pub mod cli;
pub mod core;
pub mod http;
pub mod log;
pub mod script;
pub mod stdio;

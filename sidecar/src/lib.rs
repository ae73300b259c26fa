//! `aip-sidecar`: the MCP gateway in each agent pod. Every message the agent
//! sends is parsed strictly, checked against the AgentPolicy, forwarded as
//! the canonical bytes of what was checked, and every response is redacted
//! before the agent sees it.
//!
//! It must fail closed: no policy, no tool call. It must never replay a tool
//! call, never forward the agent's own credentials, and never print a
//! connection credential.

#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod approvals;
pub mod audit;
pub mod config;
pub mod control;
pub mod gate;
pub mod metrics;
pub mod runtime;
pub mod upstream;

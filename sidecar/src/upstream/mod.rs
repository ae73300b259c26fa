//! The gateway's side of its upstream connections: each connection's
//! health, catalog and gates (the MCP client itself is `aip_mcp`).

pub use aip_mcp::credentials;
pub mod health;
pub mod tools;

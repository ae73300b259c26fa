//! The gateway's side of its upstream connections: each connection's
//! health, catalog and gates (the MCP client itself is `aip_mcp`).

pub mod credentials;
pub mod health;
pub mod tools;

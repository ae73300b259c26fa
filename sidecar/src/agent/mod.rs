//! The MCP server the agent talks to: Streamable HTTP on loopback, or stdio
//! for a desktop client. Both hand every message to the same pipeline
//! (`gate`); they differ only in framing and sessions.

pub mod http;
pub mod stdio;

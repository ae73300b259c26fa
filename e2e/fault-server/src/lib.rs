pub mod core;
pub mod http;
pub mod log;
pub mod script;
pub mod stdio;

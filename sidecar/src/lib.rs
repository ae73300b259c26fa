pub mod jsonrpc;

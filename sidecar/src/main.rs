//! `aip-sidecar`: the MCP gateway. `run` serves agents over Streamable HTTP
//! (standalone from a file, or configured by the operator), `stdio` serves
//! one desktop client over stdio, `check` validates a configuration file.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    aip_sidecar::runtime::main(aip_sidecar::runtime::Cli::parse())
}

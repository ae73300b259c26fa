//! `aip-sidecar`: the MCP gateway. `run` serves agents over Streamable HTTP
//! (standalone from a file, or configured by the operator), `stdio` serves
//! one desktop client over stdio, `check` validates a configuration file.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, whose background thread hands freed pages back to the kernel
/// (glibc's per-thread arenas keep them: a load's peak stayed resident).
/// Its options are built in, from `.cargo/config.toml`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    aip_sidecar::runtime::main(aip_sidecar::runtime::Cli::parse())
}

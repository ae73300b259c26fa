//! The CLI half: mocked executables that answer from a FaultCli document.
//!
//! `--shims DIR` installs one shim per declared name into DIR, to be put
//! first on the agent's PATH; names the document does not declare resolve
//! through the rest of PATH as usual. Every invocation of a shim is one
//! process that consumes exactly one step of the session's shared sequence
//! state and records its attempt. It must never run a real binary: an
//! unmatched or exhausted invocation fails closed.

pub mod attempt;
pub mod document;
pub mod install;
pub mod invoke;
pub mod session;

pub use document::{CLI_KIND, CliScript};

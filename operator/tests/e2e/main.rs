//! End-to-end stories against the fake API server, with the real kubectl
//! and the real aip-operator, aip-sidecar and kubectl-aip binaries.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod approvals;
mod enforcement;
mod support;

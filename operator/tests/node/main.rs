//! The stories in real pods: on the test node that `aip-node run` starts
//! (the genuine control plane with kube-scheduler, a kubelet, containerd,
//! runc, the CNI bridge, kube-proxy and CoreDNS), the chart installed as it
//! ships with `helm install`, the operator in a pod from its image, agent
//! pods injected by it and run by the kubelet. One node per test run: each
//! test in namespaces of its own, the chart once (see `support.rs`).
//!
//! Run with `make node-test` (part of `make test`); a plain `cargo test`
//! skips them (`test = false` in Cargo.toml), `cargo test --test node`
//! under `aip-node run` runs them.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod approvals;
mod chart;
mod disruptions;
mod egress;
mod enforcement;
mod example;
mod faults;
mod support;
mod tool_drift;
mod upstream_auth;

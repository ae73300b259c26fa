//! End-to-end stories against the genuine kube-apiserver, each on a
//! control plane of its own (the chart it installs is once per cluster),
//! with the real helm, kubectl and the real aip-operator, aip-sidecar and
//! kubectl-aip binaries. No kubelet: each story plays it for its agent pod
//! (it starts the sidecar with a token bound to the pod).

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod approvals;
mod chart;
mod enforcement;
mod examples;
mod rotation;
mod support;
mod tool_acceptance;
mod upstream_auth;

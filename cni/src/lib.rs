//! `aip-cni`: the egress lock of governed pods.
//!
//! - [`plugin`]: the CNI protocol, as a chained plugin the runtime runs
//!   when it creates a pod's sandbox; it decides whether the pod is to be
//!   locked and with what rules.
//! - [`rules`]: a pod's rules as `iptables-restore` input (pure).
//! - [`netns`]: programs them inside the pod's network namespace with the
//!   node's own tools.
//! - [`lookup`]: finds a pod's lock in the API server.
//! - [`install`]: what the DaemonSet runs on every node to install the
//!   plugin, keep it in place and take it away again.

pub mod install;
pub mod lookup;
pub mod netns;
pub mod plugin;
pub mod rules;

//! aip-operator: the control plane. It validates AgentPolicies and
//! ToolConnections, resolves credentials, probes connection health, compiles
//! one configuration per agent pod and streams it to that pod's sidecar.
//!
//! It must never write a credential anywhere but the sidecar's TLS stream:
//! not in a status, an Event, a log line or an error message.

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod certs;
pub mod controllers;
pub mod errors;
pub mod events;
pub mod grpc;
pub mod identity;
pub mod index;
pub mod lease;
pub mod metrics;
pub mod runtime;
pub mod selector;
pub mod validate;
pub mod webhooks;

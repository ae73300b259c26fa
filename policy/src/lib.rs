//! `aip-policy`: the AIP AgentPolicy engine (aip.io/v1alpha1).
//!
//! Parse and validate a policy ([`AgentPolicy`]), compile it once into an
//! immutable [`Evaluator`], and evaluate every JSON-RPC message an agent sends
//! into a [`Verdict`]: decision, violation, reason and the exact JSON-RPC error.
//! Also DLP redaction of tool results ([`Redactor`]), audit records
//! ([`AuditRecord`]) and the policy hash.
//!
//! This crate does no I/O, spawns nothing and knows nothing of Kubernetes or
//! async runtimes: the sidecar enforces with it, the operator validates and
//! hashes with it, the `aip` CLI tests policies with it. It must fail closed:
//! with no policy every tool call is blocked, and what it cannot check it
//! refuses. It never rewrites the names it is asked about.

#![forbid(unsafe_code)]

pub mod approval;
pub mod audit;
pub mod compile;
pub mod dlp;
pub mod document;
pub mod errors;
pub mod evaluate;
pub mod fields;
pub mod hash;
pub mod kubernetes;
pub mod limits;
pub mod message;
pub mod normalize;
pub mod paths;
pub mod ratelimit;
pub mod regexes;
pub mod tools;

pub use approval::{Approval, UnknownWithdrawal, Withdrawal};
pub use audit::{AuditRecord, Direction, DlpRecord, MAX_AUDIT_ARGS_BYTES};
pub use compile::{CompileOptions, DEFAULT_ALLOWED_METHODS, Evaluator};
pub use dlp::{DlpEvent, Redacted, Redactor};
pub use document::{AgentPolicy, FieldError, Mode, PolicyErrors};
pub use errors::{RpcError, Subject, codes};
pub use evaluate::{Cause, Decision, Listing, Verdict, arg_string};
pub use message::{MessageError, Request, ToolCall};
pub use normalize::normalize_name;
pub use ratelimit::{ManualClock, RateClock, RateLimit};

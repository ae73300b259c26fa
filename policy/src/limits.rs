//! Every bound the engine enforces, in one place.

/// Largest policy document accepted, in bytes.
pub const MAX_POLICY_BYTES: usize = 4 * 1024 * 1024;
/// Longest regex source accepted, in bytes.
pub const MAX_REGEX_SOURCE: usize = 8 * 1024;
/// Largest compiled program one regex may grow to (the `regex` crate's
/// `size_limit`): a pattern such as `(a{1000}){1000}` is refused at validation
/// instead of consuming memory or time.
pub const MAX_REGEX_COMPILED: usize = 1024 * 1024;
/// Cache bound for each regex's lazy DFA.
pub const MAX_REGEX_DFA_CACHE: usize = 2 * 1024 * 1024;
/// Deepest nesting of groups and repetitions in one regex.
pub const MAX_REGEX_NEST: u32 = 64;
/// Depth to which argument values are scanned for protected paths; deeper
/// structures are refused rather than half-checked.
pub const MAX_ARG_DEPTH: usize = 64;
/// Largest rate-limit count.
pub const MAX_RATE_COUNT: u32 = 1_000_000_000;

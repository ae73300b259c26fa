//! The strict JSON-RPC parser and canonicalizer: never panics, and what it
//! accepts re-serializes to bytes it accepts again as the same message
//! (forwarding is idempotent: the server sees what the policy saw).
#![no_main]

use aip_mcp::jsonrpc::{Limits, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 16,
        max_depth: 32,
    };
    if let Ok(message) = parse(data, limits) {
        let forwarded = message.to_bytes();
        let again = parse(&forwarded, limits).expect("canonical bytes are accepted");
        assert_eq!(again.value, message.value);
        assert_eq!(again.kind, message.kind);
        assert_eq!(again.to_bytes(), forwarded, "canonical form is a fixed point");
    }
});

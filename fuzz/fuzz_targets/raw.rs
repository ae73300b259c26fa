//! Finding members in the bytes the strict parser accepted
//! (`aip_mcp::raw`): never panics, and over any accepted object either
//! declines (an escaped key) or finds exactly the members the parser read,
//! each value's text reading as that member's value; replacing a
//! value gives the object with that member changed, the rest as it was.
#![no_main]

use aip_mcp::jsonrpc::{Limits, parse_value};
use aip_mcp::raw;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 16,
        max_depth: 32,
    };
    let Ok(Value::Object(map)) = parse_value(data, limits) else {
        return;
    };
    let Some((members, close)) = raw::members(data, raw::whole(data)) else {
        assert!(data.contains(&b'\\'), "declined without an escape");
        return;
    };
    assert_eq!(data[close], b'}');
    // The parser refuses duplicate keys: as many members as entries, and
    // each found member is an entry.
    assert_eq!(members.len(), map.len());
    for m in &members {
        let key = std::str::from_utf8(&data[m.key.clone()]).unwrap();
        let read: Value = serde_json::from_slice(&data[m.value.clone()]).unwrap();
        assert_eq!(Some(&read), map.get(key), "{key}");
    }
    if let Some(first) = members.first() {
        let mut splice = raw::Splice::default();
        splice.replace(first.value.clone(), b"[0]".to_vec());
        let changed: Value = serde_json::from_slice(&splice.apply(data)).unwrap();
        let mut expected = map.clone();
        let key = std::str::from_utf8(&data[first.key.clone()]).unwrap();
        expected.insert(key.to_owned(), serde_json::json!([0]));
        assert_eq!(changed, Value::Object(expected));
    }
});

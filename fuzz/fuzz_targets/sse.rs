//! The SSE parser: never panics, and the events it finds do not depend on
//! how the stream was cut into chunks.
#![no_main]

use aip_mcp::sse::Parser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&[u8], Vec<u8>)| {
    let (stream, cuts) = input;
    let whole = Parser::default().push(stream);
    let mut parser = Parser::default();
    let mut pieces = Vec::new();
    let mut at = 0;
    for cut in cuts {
        let end = (at + usize::from(cut)).min(stream.len());
        pieces.extend(parser.push(&stream[at..end]));
        at = end;
    }
    pieces.extend(parser.push(&stream[at..]));
    assert_eq!(
        format!("{whole:?}"),
        format!("{pieces:?}"),
        "chunking changed the events"
    );
});

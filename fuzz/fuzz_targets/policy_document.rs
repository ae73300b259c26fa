//! The AgentPolicy document parser and compiler: any text is either refused
//! with errors or compiles, and a compiled policy evaluates a call without
//! panicking.
#![no_main]

use aip_policy::{CompileOptions, Evaluator};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let options = CompileOptions {
        home: Some("/home/agent".to_owned()),
        ..CompileOptions::default()
    };
    match Evaluator::from_yaml(text, &options) {
        Ok(evaluator) => {
            let verdict = evaluator.evaluate_call(
                &serde_json::json!(1),
                "read",
                &serde_json::json!({"path": "/etc/shadow", "n": 1}),
            );
            let _ = verdict.response();
        }
        Err(errors) => assert!(!errors.0.is_empty(), "a refusal names at least one error"),
    }
});

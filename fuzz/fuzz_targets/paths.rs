//! The protected-path canonicalizer: never panics on any argument, and an
//! argument that literally holds a protected path is always caught.
#![no_main]

use aip_policy::{CompileOptions, Evaluator};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static EVALUATOR: LazyLock<Evaluator> = LazyLock::new(|| {
    let options = CompileOptions {
        home: Some("/home/agent".to_owned()),
        ..CompileOptions::default()
    };
    Evaluator::from_yaml(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: f}\nspec:\n  allowed_tools: [read]\n  protected_paths: [/etc/shadow, ~/.ssh, .env]\n",
        &options,
    )
    .expect("the fuzz policy is valid")
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let verdict = EVALUATOR.evaluate_call(&serde_json::json!(1), "read", &serde_json::json!({"path": text}));
    if text.contains("/etc/shadow") {
        assert_eq!(
            verdict.audit_decision(),
            "PROTECTED_PATH",
            "{text:?} names /etc/shadow"
        );
    }
});

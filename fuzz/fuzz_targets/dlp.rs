//! DLP redaction: never panics, and what it leaves holds no match of any
//! pattern (a secret is never half-redacted), whatever the text.
#![no_main]

use aip_policy::AgentPolicy;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static REDACTOR: LazyLock<aip_policy::Redactor> = LazyLock::new(|| {
    let policy = AgentPolicy::from_yaml(
        "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: f}\nspec:\n  dlp:\n    detect_encoding: true\n    patterns:\n      - {name: Email, regex: '[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,}'}\n      - {name: Key, regex: 'AKIA[0-9A-Z]{16}'}\n      - {name: Token, regex: 'tok_[a-z0-9]{8}'}\n",
    )
    .expect("the fuzz policy is valid");
    aip_policy::Redactor::new(policy.spec.dlp.as_ref().expect("a dlp block"))
        .expect("patterns compile")
        .expect("dlp is enabled")
});

static PATTERNS: LazyLock<Vec<regex::Regex>> = LazyLock::new(|| {
    ["[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,}", "AKIA[0-9A-Z]{16}", "tok_[a-z0-9]{8}"]
        .iter()
        .map(|p| regex::Regex::new(p).expect("valid"))
        .collect()
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let redacted = REDACTOR.redact(text);
    let out = redacted.text.as_ref();
    for pattern in PATTERNS.iter() {
        assert!(
            !pattern.is_match(out),
            "{pattern} still matches the redacted text {out:?}"
        );
    }
});

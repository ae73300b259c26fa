//! Regex compilation with explicit bounds and errors that name the byte.
//!
//! `regex` gives RE2 semantics: linear-time matching, no backreferences or
//! look-around. Note that `\d`, `\w`, `\s` and `\b` are Unicode-aware here (RE2
//! makes them ASCII-only); write `[0-9]` or `(?-u:\d)` for ASCII classes.

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};

use crate::limits;

/// Checks that `pattern` parses and compiles within the limits, returning a
/// message such as `regex parse error at 7: unclosed group`.
pub fn check(pattern: &str) -> Result<(), String> {
    compile(pattern).map(drop)
}

/// Compiles one pattern with the engine's limits.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    precheck(pattern)?;
    RegexBuilder::new(pattern)
        .size_limit(limits::MAX_REGEX_COMPILED)
        .dfa_size_limit(limits::MAX_REGEX_DFA_CACHE)
        .nest_limit(limits::MAX_REGEX_NEST)
        .build()
        .map_err(describe_build_error)
}

/// Compiles a set of already-checked patterns (the DLP prefilter).
pub fn compile_set<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<RegexSet, String> {
    RegexSetBuilder::new(patterns)
        .size_limit(limits::MAX_REGEX_COMPILED * 8)
        .dfa_size_limit(limits::MAX_REGEX_DFA_CACHE * 4)
        .nest_limit(limits::MAX_REGEX_NEST)
        .build()
        .map_err(describe_build_error)
}

/// Parses with regex-syntax first, because its errors carry the byte offset
/// that `regex::Error`'s display only draws as a caret diagram.
fn precheck(pattern: &str) -> Result<(), String> {
    if pattern.len() > limits::MAX_REGEX_SOURCE {
        return Err(format!(
            "regex is {} bytes long; the limit is {}",
            pattern.len(),
            limits::MAX_REGEX_SOURCE
        ));
    }
    let mut parser = regex_syntax::ParserBuilder::new()
        .nest_limit(limits::MAX_REGEX_NEST)
        .build();
    parser.parse(pattern).map(drop).map_err(|e| match e {
        regex_syntax::Error::Parse(e) => {
            format!(
                "regex parse error at {}: {}",
                e.span().start.offset,
                e.kind()
            )
        }
        regex_syntax::Error::Translate(e) => {
            format!(
                "regex parse error at {}: {}",
                e.span().start.offset,
                e.kind()
            )
        }
        other => format!("regex parse error: {other}"),
    })
}

fn describe_build_error(e: regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(limit) => {
            format!("regex is too large: its compiled form exceeds the {limit}-byte limit")
        }
        other => format!("regex error: {}", other.to_string().replace('\n', " ")),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn parse_error_names_the_byte() {
        assert_eq!(
            check("^https://(github").unwrap_err(),
            "regex parse error at 9: unclosed group"
        );
    }

    #[test]
    fn oversized_pattern_is_refused_quickly() {
        let err = check("(a{1000}){1000}").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn backreferences_are_not_supported() {
        let err = check(r"(a)\1").unwrap_err();
        assert!(err.starts_with("regex parse error at"), "{err}");
    }
}

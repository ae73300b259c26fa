//! Regex compilation with explicit bounds and errors that name the byte.
//!
//! `regex` gives RE2 semantics: linear-time matching, no backreferences or
//! look-around. Note that `\d`, `\w`, `\s` and `\b` are Unicode-aware here (RE2
//! makes them ASCII-only); write `[0-9]` or `(?-u:\d)` for ASCII classes.
//!
//! Building a `Regex` costs 50-500 µs (its NFAs, prefilters and engines),
//! parsing it about a tenth of that. So a policy's argument regexes are
//! checked by parsing, plus a bound on the compiled size computed from the
//! parse (`compiled_bound`), and compiled on first use ([`LazyRegex`]): a
//! reload of a policy with a hundred regexes costs milliseconds, and every
//! error a full build would give is still given at validation.

use std::fmt;
use std::sync::{Arc, OnceLock};

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use regex_syntax::hir::{Class, Hir, HirKind};
use regex_syntax::utf8::Utf8Sequences;
use rustc_hash::FxHashMap;

use crate::limits;

/// Checks that `pattern` parses and compiles within the limits, returning a
/// message such as `regex parse error at 7: unclosed group`.
pub fn check(pattern: &str) -> Result<(), String> {
    LazyRegex::new(pattern).map(drop)
}

/// A pattern that passed [`check`], built when it is first matched (or by
/// [`LazyRegex::build`] off the hot path).
#[derive(Debug)]
pub struct LazyRegex {
    pattern: Box<str>,
    built: OnceLock<Result<Regex, String>>,
}

impl LazyRegex {
    /// Checks `pattern`; a pattern whose size bound exceeds the limit is
    /// built now, because only the build can tell whether it really does.
    pub fn new(pattern: &str) -> Result<LazyRegex, String> {
        let hir = precheck(pattern)?;
        let built = OnceLock::new();
        if compiled_bound(&hir) > limits::MAX_REGEX_COMPILED as u64 {
            let _ = built.set(Ok(build(pattern)?));
        }
        Ok(LazyRegex {
            pattern: pattern.into(),
            built,
        })
    }

    /// The pattern's source text.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The built regex. An error here means the size bound was wrong, which
    /// the tests below rule out over a generated corpus; callers fail closed.
    pub fn build(&self) -> Result<&Regex, &str> {
        self.built
            .get_or_init(|| build(&self.pattern))
            .as_ref()
            .map_err(String::as_str)
    }
}

/// The argument patterns a policy's validation checked, by their text:
/// handed from the validated document to its compilation, so that no
/// pattern is parsed twice (the parse is most of a reload's cost). Two are
/// always equal: what they hold follows from the spec they came with, and
/// the spec is what is compared.
#[derive(Clone, Default)]
pub struct Checked(Arc<FxHashMap<Box<str>, Arc<LazyRegex>>>);

impl Checked {
    pub fn new(patterns: FxHashMap<Box<str>, Arc<LazyRegex>>) -> Checked {
        Checked(Arc::new(patterns))
    }

    /// The checked regex of `pattern`, if validation saw it.
    pub fn get(&self, pattern: &str) -> Option<&Arc<LazyRegex>> {
        self.0.get(pattern)
    }
}

impl PartialEq for Checked {
    fn eq(&self, _: &Checked) -> bool {
        true
    }
}

impl fmt::Debug for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checked({} patterns)", self.0.len())
    }
}

/// Compiles one pattern with the engine's limits.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    precheck(pattern)?;
    build(pattern)
}

fn build(pattern: &str) -> Result<Regex, String> {
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
fn precheck(pattern: &str) -> Result<Hir, String> {
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
    parser.parse(pattern).map_err(|e| match e {
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

/// Bytes a state takes in regex-automata's NFA builder, with margin (it is
/// 32 there), and a transition or union alternate (8 and 4).
const STATE: u64 = 48;
const EDGE: u64 = 8;
/// The unanchored prefix, the group-0 capture and the match state.
const FIXED: u64 = 2048;

/// An upper bound of the memory the NFA builder reaches for `hir`, forward
/// or reverse, which is what the `size_limit` is checked against: every node
/// is counted as compiled without sharing, each Unicode class as its UTF-8
/// sequences, each repetition as as many copies as it can take. It is 2-4x
/// the real figure for ordinary patterns, so only patterns near the limit
/// need a build to decide.
fn compiled_bound(hir: &Hir) -> u64 {
    FIXED.saturating_add(bound(hir))
}

fn bound(hir: &Hir) -> u64 {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => STATE,
        HirKind::Literal(literal) => (literal.0.len() as u64 + 1) * STATE,
        HirKind::Class(Class::Bytes(class)) => 3 * STATE + EDGE * class.ranges().len() as u64,
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .flat_map(|r| Utf8Sequences::new(r.start(), r.end()))
            .fold(4 * STATE, |sum, seq| {
                sum.saturating_add(seq.len() as u64 * (STATE + EDGE) + 2 * EDGE)
            }),
        HirKind::Repetition(rep) => {
            let copies = u64::from(rep.max.unwrap_or(rep.min.saturating_add(1)).max(1)) + 1;
            copies
                .saturating_mul(bound(&rep.sub).saturating_add(4 * STATE))
                .saturating_add(4 * STATE)
        }
        HirKind::Capture(capture) => bound(&capture.sub).saturating_add(4 * STATE),
        HirKind::Concat(parts) => parts.iter().fold(2 * STATE, |sum, part| {
            sum.saturating_add(bound(part)).saturating_add(2 * STATE)
        }),
        HirKind::Alternation(parts) => parts.iter().fold(2 * STATE, |sum, part| {
            sum.saturating_add(bound(part))
                .saturating_add(STATE + 2 * EDGE)
        }),
    }
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
    use regex::RegexBuilder;

    use super::{LazyRegex, check, compiled_bound, precheck};
    use crate::limits;

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

    #[test]
    fn ordinary_patterns_are_built_on_first_use() {
        let regex = LazyRegex::new(r"^https://github\.com/.*").unwrap();
        assert!(regex.built.get().is_none(), "not built at validation");
        assert!(regex.build().unwrap().is_match("https://github.com/acme"));
        assert!(regex.built.get().is_some());
    }

    #[test]
    fn patterns_near_the_limit_are_decided_by_a_build() {
        // \w is about 50 KB built; its bound is four times that.
        let near = LazyRegex::new(r"\w{8}").unwrap();
        assert!(near.built.get().is_some(), "built at validation");
        let err = check(r"\w{30}").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    /// The bound is what lets validation skip the build, so it must never be
    /// below what the build reaches: every pattern of a generated corpus
    /// builds with its own bound as the size limit.
    #[test]
    fn the_size_bound_is_never_below_the_build() {
        let pieces = [
            "a",
            "abc",
            r"\w",
            r"\d",
            r"\s",
            ".",
            "[a-z]",
            "(?i)k",
            "(?i)straße",
            r"\p{Greek}",
            r"\pL",
            "[^a]",
            r"(?-u:\w)",
            "(?s:.)",
            r"\b",
            "^",
            r"[\w./-]",
            "é",
            r"(?-u:[\x80-\xff])",
        ];
        let reps = [
            "", "*", "+", "?", "{3}", "{2,5}", "{0,12}", "{7,}", "*?", "{1,3}?",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut pick = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut checked = 0;
        for _ in 0..400 {
            let mut pattern = String::new();
            for _ in 0..=pick(4) {
                let (piece, rep) = (pieces[pick(pieces.len())], reps[pick(reps.len())]);
                pattern = match pick(4) {
                    0 => format!("{pattern}({piece}{rep})"),
                    1 => format!("{pattern}(?:{piece}|{}){rep}", pieces[pick(pieces.len())]),
                    2 => format!("{pattern}(?:{pattern}){rep}"),
                    _ => format!("{pattern}(?:{piece})"),
                };
            }
            let Ok(hir) = precheck(&pattern) else {
                continue;
            };
            let bound = compiled_bound(&hir);
            if bound > 8 * limits::MAX_REGEX_COMPILED as u64 {
                continue;
            }
            let built = RegexBuilder::new(&pattern)
                .size_limit(bound as usize)
                .build();
            assert!(built.is_ok(), "{pattern}: bound {bound} is below the build");
            checked += 1;
        }
        assert!(checked > 300, "only {checked} patterns checked");
    }
}

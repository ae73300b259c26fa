//! DLP redaction (spec §5): every match of every pattern in a tool result is
//! replaced by `[REDACTED:<name>]`, and each pattern reports its match count.
//!
//! One `RegexSet` pass decides which patterns occur at all, so clean text
//! costs a single scan. Patterns that occur are located in the original text;
//! where matches of different patterns overlap, the union is redacted under
//! the earliest pattern's name. That equals applying the patterns one after
//! another (the AIP reference's order) except that no part of any match is
//! ever left behind and a marker is never re-scanned.

use std::borrow::Cow;

use base64::Engine as _;
use regex::{Regex, RegexSet};
use serde::Serialize;
use serde_json::Value;

use crate::document::DlpConfig;
use crate::limits;
use crate::regexes;

/// How many times one pattern matched in one redaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlpEvent {
    pub rule: String,
    pub count: usize,
}

/// The result of redacting one text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted<'a> {
    pub text: Cow<'a, str>,
    pub events: Vec<DlpEvent>,
}

impl Redacted<'_> {
    pub fn changed(&self) -> bool {
        matches!(self.text, Cow::Owned(_))
    }
}

#[derive(Debug)]
pub struct Redactor {
    names: Vec<String>,
    markers: Vec<String>,
    regexes: Vec<Regex>,
    set: RegexSet,
    detect_encoding: bool,
    filter_stderr: bool,
}

/// Candidate base64 or hex runs worth decoding when `detect_encoding` is on.
const ENCODED_RUN: &str = r"(?:0[xX])?[0-9A-Fa-f]{16,}|[A-Za-z0-9+/_-]{16,}={0,2}";

impl Redactor {
    /// None when the policy has no DLP block, it is disabled, or it has no
    /// patterns: then content passes unchanged.
    pub fn new(config: &DlpConfig) -> Result<Option<Redactor>, String> {
        if !config.is_enabled() || config.patterns.is_empty() {
            return Ok(None);
        }
        let mut regexes = Vec::with_capacity(config.patterns.len());
        for p in &config.patterns {
            regexes.push(regexes::compile(&p.regex).map_err(|e| format!("{}: {e}", p.name))?);
        }
        let set = regexes::compile_set(config.patterns.iter().map(|p| p.regex.as_str()))?;
        Ok(Some(Redactor {
            names: config.patterns.iter().map(|p| p.name.clone()).collect(),
            markers: config
                .patterns
                .iter()
                .map(|p| format!("[REDACTED:{}]", p.name))
                .collect(),
            regexes,
            set,
            detect_encoding: config.detect_encoding.unwrap_or(false),
            filter_stderr: config.filter_stderr.unwrap_or(false),
        }))
    }

    /// Whether stderr of a stdio upstream should be redacted too.
    pub fn filter_stderr(&self) -> bool {
        self.filter_stderr
    }

    /// Redacts one text.
    pub fn redact<'a>(&self, text: &'a str) -> Redacted<'a> {
        let present = self.set.is_match(text);
        if !present && !self.detect_encoding {
            return Redacted {
                text: Cow::Borrowed(text),
                events: Vec::new(),
            };
        }
        let mut spans = Vec::new();
        let mut counts = vec![0usize; self.regexes.len()];
        if present {
            for i in self.set.matches(text).iter() {
                for m in self.regexes[i].find_iter(text) {
                    if m.is_empty() {
                        continue;
                    }
                    counts[i] += 1;
                    spans.push((m.start(), m.end(), i));
                }
            }
        }
        if self.detect_encoding {
            self.find_encoded(text, &mut spans, &mut counts);
        }
        let events = self.events(&counts);
        if spans.is_empty() {
            return Redacted {
                text: Cow::Borrowed(text),
                events,
            };
        }
        Redacted {
            text: Cow::Owned(self.splice(text, spans)),
            events,
        }
    }

    /// Redacts every string in a JSON value in place (object keys are left
    /// alone), adding to `totals`.
    ///
    /// Returns whether anything was replaced: a caller that still holds the
    /// text `value` was read from may pass that text on when nothing was.
    pub fn redact_strings(&self, value: &mut Value, totals: &mut Vec<DlpEvent>) -> bool {
        self.redact_strings_at(value, totals, 0)
    }

    /// Whether [`Redactor::redact_strings`] would replace anything in
    /// `value`, found without copying it.
    pub fn would_redact(&self, value: &Value) -> bool {
        self.would_redact_at(value, 0)
    }

    fn would_redact_at(&self, value: &Value, depth: usize) -> bool {
        match value {
            Value::String(s) => self.redact(s).changed(),
            Value::Array(_) | Value::Object(_) if depth > limits::MAX_ARG_DEPTH => true,
            Value::Array(items) => items.iter().any(|v| self.would_redact_at(v, depth + 1)),
            Value::Object(map) => map.values().any(|v| self.would_redact_at(v, depth + 1)),
            _ => false,
        }
    }

    fn redact_strings_at(
        &self,
        value: &mut Value,
        totals: &mut Vec<DlpEvent>,
        depth: usize,
    ) -> bool {
        match value {
            Value::String(s) => {
                let r = self.redact(s);
                merge_events(totals, r.events);
                match r.text {
                    Cow::Owned(new) => {
                        *s = new;
                        true
                    }
                    Cow::Borrowed(_) => false,
                }
            }
            // Deeper than we scan: replace rather than pass unchecked.
            Value::Array(_) | Value::Object(_) if depth > limits::MAX_ARG_DEPTH => {
                *value = Value::String("[REDACTED:too deeply nested]".to_owned());
                true
            }
            Value::Array(items) => items.iter_mut().fold(false, |changed, v| {
                self.redact_strings_at(v, totals, depth + 1) | changed
            }),
            Value::Object(map) => map.values_mut().fold(false, |changed, v| {
                self.redact_strings_at(v, totals, depth + 1) | changed
            }),
            _ => false,
        }
    }

    /// Redacts an MCP tool result in place: every string in it, whatever its
    /// shape (content blocks, embedded resources, `structuredContent`,
    /// `_meta`, fields nobody expected). Returns per-pattern totals.
    pub fn redact_tool_result(&self, result: &mut Value) -> Vec<DlpEvent> {
        // Every string, whatever the result's shape: a server that puts a
        // secret in an unexpected field (or a malformed result) must not
        // get it past the scan.
        let mut totals = Vec::new();
        self.redact_strings(result, &mut totals);
        totals
    }

    fn events(&self, counts: &[usize]) -> Vec<DlpEvent> {
        counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| DlpEvent {
                rule: self.names[i].clone(),
                count: *c,
            })
            .collect()
    }

    /// Builds the output from (start, end, pattern) spans, merging overlaps.
    fn splice(&self, text: &str, mut spans: Vec<(usize, usize, usize)>) -> String {
        spans.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        let mut iter = spans.into_iter().peekable();
        while let Some((start, mut end, mut pattern)) = iter.next() {
            while let Some(&(s, e, p)) = iter.peek() {
                if s >= end {
                    break;
                }
                end = end.max(e);
                pattern = pattern.min(p);
                iter.next();
            }
            out.push_str(&text[copied..start]);
            out.push_str(&self.markers[pattern]);
            copied = end;
        }
        out.push_str(&text[copied..]);
        out
    }

    /// Finds base64 or hex runs whose decoded text matches a pattern; the
    /// whole encoded run is then redacted under that pattern's name.
    fn find_encoded(
        &self,
        text: &str,
        spans: &mut Vec<(usize, usize, usize)>,
        counts: &mut [usize],
    ) {
        static RUN: std::sync::OnceLock<Option<Regex>> = std::sync::OnceLock::new();
        let Some(run) = RUN.get_or_init(|| Regex::new(ENCODED_RUN).ok()) else {
            return;
        };
        for m in run.find_iter(text) {
            let Some(decoded) = decode(m.as_str()) else {
                continue;
            };
            if let Some(i) = self.set.matches(&decoded).iter().next() {
                counts[i] += 1;
                spans.push((m.start(), m.end(), i));
            }
        }
    }
}

/// Decodes a hex or base64 (standard or URL-safe, padded or not) run into
/// UTF-8 text, if it is that.
fn decode(run: &str) -> Option<String> {
    let hex = run
        .strip_prefix("0x")
        .or_else(|| run.strip_prefix("0X"))
        .unwrap_or(run);
    let bytes = if hex.len().is_multiple_of(2) && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(hex).ok()
    } else {
        let engines = [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ];
        engines.iter().find_map(|e| e.decode(run).ok())
    }?;
    String::from_utf8(bytes).ok()
}

/// Adds `more` into `totals`, one entry per rule.
pub fn merge_events(totals: &mut Vec<DlpEvent>, more: Vec<DlpEvent>) {
    for e in more {
        match totals.iter_mut().find(|t| t.rule == e.rule) {
            Some(t) => t.count += e.count,
            None => totals.push(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::DlpPattern;
    use serde_json::json;

    fn redactor(patterns: &[(&str, &str)], detect_encoding: bool) -> Redactor {
        let config = DlpConfig {
            enabled: None,
            detect_encoding: Some(detect_encoding),
            filter_stderr: None,
            patterns: patterns
                .iter()
                .map(|(n, r)| DlpPattern {
                    name: (*n).into(),
                    regex: (*r).into(),
                })
                .collect(),
        };
        Redactor::new(&config).unwrap().unwrap()
    }

    const EMAIL: &str = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}";
    const AWS: &str = "(AKIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ASIA)[A-Z0-9]{16}";

    /// What `redact_strings` says of a value decides whether a gateway
    /// may pass on the text the value was read from: it must say "changed"
    /// for every replacement, the too-deep one included.
    #[test]
    fn redact_strings_says_whether_anything_changed() {
        let r = redactor(&[("Email", EMAIL)], false);
        let mut clean = json!({"a": ["plain", {"b": "text", "n": 1}]});
        assert!(!r.redact_strings(&mut clean, &mut Vec::new()));
        let mut found = json!({"a": ["plain", {"b": "mail bob@example.com"}]});
        assert!(r.redact_strings(&mut found, &mut Vec::new()));
        let mut deep = json!("x");
        for _ in 0..=limits::MAX_ARG_DEPTH + 1 {
            deep = json!([deep]);
        }
        assert!(r.redact_strings(&mut deep, &mut Vec::new()));
    }

    #[test]
    fn every_match_of_every_pattern_is_redacted_and_counted() {
        let r = redactor(
            &[("Email", EMAIL), ("SSN", r"\b\d{3}-\d{2}-\d{4}\b")],
            false,
        );
        let out = r.redact("a@x.io, b@y.org, SSN: 123-45-6789");
        assert_eq!(
            out.text,
            "[REDACTED:Email], [REDACTED:Email], SSN: [REDACTED:SSN]"
        );
        assert_eq!(
            out.events,
            vec![
                DlpEvent {
                    rule: "Email".into(),
                    count: 2
                },
                DlpEvent {
                    rule: "SSN".into(),
                    count: 1
                }
            ]
        );
    }

    #[test]
    fn clean_text_is_borrowed_and_silent() {
        let r = redactor(&[("AWS Key", AWS)], false);
        let out = r.redact("nothing to see");
        assert!(!out.changed());
        assert!(out.events.is_empty());
    }

    #[test]
    fn overlapping_matches_leave_nothing_behind() {
        let r = redactor(&[("A", "abc"), ("B", "bcdef")], false);
        assert_eq!(r.redact("xabcdefy").text, "x[REDACTED:A]y");
    }

    #[test]
    fn disabled_block_means_no_redactor() {
        let config = DlpConfig {
            enabled: Some(false),
            detect_encoding: None,
            filter_stderr: None,
            patterns: vec![DlpPattern {
                name: "E".into(),
                regex: EMAIL.into(),
            }],
        };
        assert!(Redactor::new(&config).unwrap().is_none());
    }

    #[test]
    fn encoded_secrets_are_found_when_asked() {
        // base64 of AKIAIOSFODNN7EXAMPLE
        let text = "blob QUtJQUlPU0ZPRE5ON0VYQU1QTEU= end";
        assert!(!redactor(&[("AWS Key", AWS)], false).redact(text).changed());
        let out = redactor(&[("AWS Key", AWS)], true).redact(text);
        assert_eq!(out.text, "blob [REDACTED:AWS Key] end");
        let hex = "0x414b4941494f53464f444e4e374558414d504c45";
        assert_eq!(
            redactor(&[("AWS Key", AWS)], true).redact(hex).text,
            "[REDACTED:AWS Key]"
        );
    }

    #[test]
    fn tool_result_every_string_whatever_the_field() {
        let r = redactor(&[("Email", EMAIL)], false);
        let mut result = json!({
            "content": [
                {"type": "text", "text": "mail a@x.io"},
                {"type": "image", "data": "a@x.io", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///x", "text": "b@y.io"}}
            ],
            "structuredContent": {"owner": {"email": "c@z.io"}, "n": 1, "list": ["d@w.io"]}
        });
        let events = r.redact_tool_result(&mut result);
        assert_eq!(
            events,
            vec![DlpEvent {
                rule: "Email".into(),
                count: 5
            }]
        );
        assert_eq!(result["content"][0]["text"], "mail [REDACTED:Email]");
        assert_eq!(
            result["content"][1]["data"], "[REDACTED:Email]",
            "no field is exempt: a secret is a secret wherever it sits"
        );
        assert_eq!(result["content"][2]["resource"]["text"], "[REDACTED:Email]");
        assert_eq!(
            result["structuredContent"]["owner"]["email"],
            "[REDACTED:Email]"
        );
        assert_eq!(result["structuredContent"]["list"][0], "[REDACTED:Email]");
    }
}

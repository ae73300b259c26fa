//! The connection's own credentials, kept out of everything relayed from its
//! server: a server that echoes the bearer token or a header value in an
//! error or a result (a debug message, a reflected request) would otherwise
//! hand it to the agent.
//!
//! Every value is looked for raw and without an `authorization` scheme
//! word, in any ASCII case (upper-cased text, hex and percent-encoding in
//! either case), in hex, in base64 (standard and URL-safe, padded or not,
//! and inside a longer base64 text: the three alignments a value can have
//! in it), percent-encoded and JSON-escaped; a string that holds `%` or a
//! backslash is also read decoded (percent-encoding of any part, in any
//! case, and JSON escapes such as `\/`). A value cut in two, its head
//! ending one string of a message and its tail starting another (two text
//! items, two fields, in whatever order a reader joins them), is redacted
//! in both.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

/// What a found credential is replaced with.
pub const MARK: &str = "[REDACTED:credential]";

/// Shorter values are not looked for: a short header value (a version, a
/// tenant) is usually no secret, and redacting it everywhere would mangle
/// ordinary text.
pub const MIN_SECRET_CHARS: usize = 8;

/// The credential values of one connection, in every spelling looked for.
pub struct Credentials {
    spellings: Option<Spellings>,
}

/// Every spelling of every credential value, and the automata that find
/// them whole and cut in two.
struct Spellings {
    /// Longest first, so a value's base64 is replaced whole rather than as
    /// the raw value it happens to contain.
    whole: AhoCorasick,
    /// Each spelling's length in bytes.
    lengths: Vec<usize>,
    /// Each spelling's proper prefixes, found where a string ends.
    heads: Prefixes,
    /// Each reversed spelling's proper prefixes: a spelling's tail, found
    /// where a string starts (read backwards).
    tails: Prefixes,
}

/// The proper prefixes of some texts, all in one automaton (a text's
/// prefixes share its path through it, so it is as large as the texts).
struct Prefixes {
    automaton: AhoCorasick,
    /// (text, prefix length) of each pattern.
    of: Vec<(usize, usize)>,
    /// The longest prefix's length: how far from a string's end (or
    /// start) one can reach.
    reach: usize,
}

/// Spellings longer than this are not looked for cut in two: each one's
/// prefixes cost its length squared to index.
const MAX_CUT_SPELLING: usize = 1024;

impl Credentials {
    pub fn new(headers: &[(String, SecretString)]) -> Credentials {
        let mut spellings: Vec<String> = Vec::new();
        for (_, value) in headers {
            let value = value.expose_secret();
            let bare = value
                .split_once(' ')
                .filter(|(scheme, _)| {
                    matches!(
                        scheme.to_ascii_lowercase().as_str(),
                        "bearer" | "basic" | "token"
                    )
                })
                .map_or(value, |(_, rest)| rest.trim());
            for secret in [value, bare] {
                if secret.chars().count() >= MIN_SECRET_CHARS {
                    spellings.extend(spellings_of(secret));
                }
            }
        }
        // Matched without regard to ASCII case: one of each.
        spellings.sort_by_key(|s| s.to_ascii_lowercase());
        spellings.dedup_by_key(|s| s.to_ascii_lowercase());
        spellings.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Credentials {
            spellings: Spellings::build(spellings),
        }
    }

    /// Replaces every spelling of a credential in every string (and object
    /// key) of `value`, and both pieces of one cut across two strings;
    /// returns how many were found.
    pub fn redact(&self, value: &mut Value) -> usize {
        let Some(spellings) = &self.spellings else {
            return 0;
        };
        let mut found = redact_keys(spellings, value);
        let mut strings = Vec::new();
        strings_of(value, &mut strings);
        for s in &mut strings {
            let spans = spellings.find(s);
            found += spans.len();
            splice(s, spans);
        }
        let pieces = spellings.cut_in_two(&strings);
        found += pieces.found;
        for (i, spans) in pieces.spans {
            splice(strings[i], spans);
        }
        found
    }
}

impl Credentials {
    /// A copy of `value` with every credential redacted (what may be shown
    /// of something a server sent).
    pub fn redacted(&self, value: &Value) -> Value {
        let mut shown = value.clone();
        self.redact(&mut shown);
        shown
    }
}

/// Every spelling of one value looked for (matched without regard to ASCII
/// case).
fn spellings_of(secret: &str) -> Vec<String> {
    let mut out = vec![
        secret.to_owned(),
        secret.to_uppercase(),
        secret.to_lowercase(),
        secret.bytes().map(|b| format!("{b:02x}")).collect(),
        percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC)
            .to_string(),
        secret.replace('/', "\\/"),
    ];
    if let Ok(quoted) = serde_json::to_string(secret) {
        out.push(quoted.trim_matches('"').to_owned());
    }
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        out.push(engine.encode(secret));
    }
    // Inside a longer base64 text the value starts 0, 1 or 2 bytes into a
    // group of three; each alignment has its own characters for it. Only
    // those that hold nothing but the value's bits are looked for.
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            let mut bytes = vec![0u8; offset];
            bytes.extend_from_slice(secret.as_bytes());
            let encoded = engine.encode(&bytes);
            let start = (offset * 8).div_ceil(6);
            let end = bytes.len() * 8 / 6;
            if let Some(core) = encoded.get(start..end) {
                out.push(core.to_owned());
            }
        }
    }
    out
}

impl Spellings {
    fn build(spellings: Vec<String>) -> Option<Spellings> {
        if spellings.is_empty() {
            return None;
        }
        let whole: Vec<&[u8]> = spellings.iter().map(|s| s.as_bytes()).collect();
        let reversed: Vec<Vec<u8>> = spellings
            .iter()
            .map(|s| s.bytes().rev().collect())
            .collect();
        Some(Spellings {
            whole: matcher(&whole, MatchKind::LeftmostFirst)?,
            lengths: spellings.iter().map(String::len).collect(),
            heads: Prefixes::of(&whole)?,
            tails: Prefixes::of(&reversed)?,
        })
    }

    /// Where a spelling occurs in `s`, as written or as `s` reads decoded.
    fn find(&self, s: &str) -> Vec<Range<usize>> {
        let mut spans: Vec<Range<usize>> = self.whole.find_iter(s).map(|m| m.range()).collect();
        if s.contains(['%', '\\']) {
            let decoded = Decoded::of(s);
            for m in self.whole.find_iter(&decoded.bytes) {
                spans.push(decoded.source(m.range()));
            }
        }
        merged(s, spans)
    }

    /// Both pieces of each spelling cut in two: its head ending one string
    /// and its tail starting another.
    fn cut_in_two(&self, strings: &[&mut String]) -> Pieces {
        let mut pieces = Pieces::default();
        if strings.len() < 2 {
            return pieces;
        }
        // (spelling, bytes of it in the piece) -> the strings that end
        // with its head / start with its tail.
        let mut ends: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        let mut starts: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        let mut first = Vec::with_capacity(self.tails.reach);
        for (i, s) in strings.iter().enumerate() {
            let bytes = s.as_bytes();
            let last = &bytes[bytes.len().saturating_sub(self.heads.reach)..];
            for found in self.heads.ending(last) {
                ends.entry(found).or_default().push(i);
            }
            first.clear();
            first.extend(bytes.iter().take(self.tails.reach).rev());
            for found in self.tails.ending(&first) {
                starts.entry(found).or_default().push(i);
            }
        }
        let mut spans: HashMap<usize, Vec<Range<usize>>> = HashMap::new();
        // Spellings share heads and tails (padded base64 and unpadded): a
        // string holds one head however many spellings it ends.
        let mut heads = HashSet::new();
        // A piece counts when another string holds the other piece (a
        // string read after itself is no pair). Each side is marked in one
        // pass, never pair by pair: many strings on both sides cost their
        // number, not its square.
        let other = |strings: &[usize], me: usize| strings.iter().any(|&s| s != me);
        for ((spelling, head), enders) in &ends {
            let tail = self.lengths[*spelling] - head;
            let Some(starters) = starts.get(&(*spelling, tail)) else {
                continue;
            };
            for &i in enders.iter().filter(|&&i| other(starters, i)) {
                let end = strings[i].len();
                spans.entry(i).or_default().push(end - head..end);
                heads.insert(i);
            }
            for &j in starters.iter().filter(|&&j| other(enders, j)) {
                spans.entry(j).or_default().push(0..tail);
            }
        }
        pieces.found = heads.len();
        pieces.spans = spans
            .into_iter()
            .map(|(i, s)| (i, merged(strings[i], s)))
            .collect();
        pieces
    }
}

impl Prefixes {
    fn of<T: AsRef<[u8]>>(texts: &[T]) -> Option<Prefixes> {
        let mut patterns: Vec<&[u8]> = Vec::new();
        let mut of = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let text = text.as_ref();
            if text.len() > MAX_CUT_SPELLING {
                continue;
            }
            for len in 1..text.len() {
                patterns.push(&text[..len]);
                of.push((i, len));
            }
        }
        Some(Prefixes {
            automaton: matcher(&patterns, MatchKind::Standard)?,
            reach: patterns.iter().map(|p| p.len()).max().unwrap_or(0),
            of,
        })
    }

    /// (text, prefix length) of each prefix `bytes` ends with.
    fn ending<'a>(&'a self, bytes: &'a [u8]) -> impl Iterator<Item = (usize, usize)> + 'a {
        self.automaton
            .find_overlapping_iter(bytes)
            .filter(move |m| m.end() == bytes.len())
            .map(|m| self.of[m.pattern().as_usize()])
    }
}

/// An automaton for `patterns`, matched without regard to ASCII case.
fn matcher(patterns: &[&[u8]], kind: MatchKind) -> Option<AhoCorasick> {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .match_kind(kind)
        .build(patterns)
        .ok()
}

/// Both pieces of each spelling cut in two, by string.
#[derive(Default)]
struct Pieces {
    /// How many values were found cut (one per head).
    found: usize,
    /// Each string's pieces, sorted and apart.
    spans: Vec<(usize, Vec<Range<usize>>)>,
}

/// A string as it reads percent-decoded and JSON-unescaped, each decoded
/// byte knowing the bytes of the string it came from.
struct Decoded {
    bytes: Vec<u8>,
    from: Vec<Range<usize>>,
}

impl Decoded {
    fn of(s: &str) -> Decoded {
        let raw = s.as_bytes();
        let mut decoded = Decoded {
            bytes: Vec::with_capacity(raw.len()),
            from: Vec::with_capacity(raw.len()),
        };
        let mut at = 0;
        while at < raw.len() {
            let (bytes, used) = decode_one(&raw[at..]);
            for b in bytes.as_slice() {
                decoded.bytes.push(*b);
                decoded.from.push(at..at + used);
            }
            at += used;
        }
        decoded
    }

    /// The bytes of the string a decoded range came from.
    fn source(&self, range: Range<usize>) -> Range<usize> {
        match (
            self.from.get(range.start),
            self.from.get(range.end.saturating_sub(1)),
        ) {
            (Some(first), Some(last)) => first.start..last.end,
            _ => 0..0,
        }
    }
}

/// The bytes the escape at the start of `raw` stands for, and how many
/// bytes of `raw` it takes (one plain byte stands for itself).
fn decode_one(raw: &[u8]) -> (Utf8Bytes, usize) {
    let hex = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|t| u32::from_str_radix(t, 16).ok())
    };
    match raw {
        [b'%', a, b, ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
            match hex(&raw[1..3]).and_then(|v| u8::try_from(v).ok()) {
                Some(byte) => (Utf8Bytes::one(byte), 3),
                None => (Utf8Bytes::one(b'%'), 1),
            }
        }
        [b'\\', b'u', ..] if raw.len() >= 6 => match hex(&raw[2..6]).and_then(char::from_u32) {
            Some(c) => (Utf8Bytes::of(c), 6),
            None => (Utf8Bytes::one(b'\\'), 1),
        },
        [b'\\', escaped, ..] => {
            let byte = match escaped {
                b'/' | b'\\' | b'"' => *escaped,
                b'n' => b'\n',
                b't' => b'\t',
                b'r' => b'\r',
                b'b' => 0x08,
                b'f' => 0x0c,
                _ => return (Utf8Bytes::one(b'\\'), 1),
            };
            (Utf8Bytes::one(byte), 2)
        }
        [b, ..] => (Utf8Bytes::one(*b), 1),
        [] => (Utf8Bytes::default(), 1),
    }
}

/// Up to four bytes, on the stack.
#[derive(Default)]
struct Utf8Bytes {
    bytes: [u8; 4],
    len: usize,
}

impl Utf8Bytes {
    fn one(byte: u8) -> Utf8Bytes {
        Utf8Bytes {
            bytes: [byte, 0, 0, 0],
            len: 1,
        }
    }

    fn of(c: char) -> Utf8Bytes {
        let mut bytes = [0u8; 4];
        let len = c.encode_utf8(&mut bytes).len();
        Utf8Bytes { bytes, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `spans` sorted, overlapping ones joined, each widened to whole
/// characters of `s`.
fn merged(s: &str, mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    for span in &mut spans {
        while span.start > 0 && !s.is_char_boundary(span.start) {
            span.start -= 1;
        }
        while span.end < s.len() && !s.is_char_boundary(span.end) {
            span.end += 1;
        }
        span.end = span.end.min(s.len());
    }
    spans.retain(|span| span.start < span.end);
    spans.sort_by_key(|span| (span.start, span.end));
    let mut out: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match out.last_mut() {
            Some(last) if span.start < last.end => last.end = last.end.max(span.end),
            _ => out.push(span),
        }
    }
    out
}

/// Replaces each of `spans` (sorted, apart, on character boundaries) of `s`
/// with the mark.
fn splice(s: &mut String, spans: Vec<Range<usize>>) {
    if spans.is_empty() {
        return;
    }
    let mut out = String::with_capacity(s.len());
    let mut copied = 0;
    for span in spans {
        out.push_str(&s[copied..span.start]);
        out.push_str(MARK);
        copied = span.end;
    }
    out.push_str(&s[copied..]);
    *s = out;
}

/// Every string value of `value`, in the order it is written.
fn strings_of<'v>(value: &'v mut Value, out: &mut Vec<&'v mut String>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter_mut().for_each(|v| strings_of(v, out)),
        Value::Object(map) => map.values_mut().for_each(|v| strings_of(v, out)),
        _ => {}
    }
}

/// Redacts the object keys of `value` that hold a spelling (a key is read
/// alone: no piece of one is looked for); how many were found.
fn redact_keys(spellings: &Spellings, value: &mut Value) -> usize {
    match value {
        Value::Array(items) => items.iter_mut().map(|v| redact_keys(spellings, v)).sum(),
        Value::Object(map) => {
            let mut found = 0;
            if map.keys().any(|k| !spellings.find(k).is_empty()) {
                let entries = std::mem::take(map);
                for (mut k, v) in entries {
                    let spans = spellings.find(&k);
                    found += spans.len();
                    splice(&mut k, spans);
                    map.insert(k, v);
                }
            }
            found
                + map
                    .values_mut()
                    .map(|v| redact_keys(spellings, v))
                    .sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_spelling_of_a_credential_is_redacted() {
        let token = "s3cr3t-t0ken/with+chars";
        let credentials = Credentials::new(&[
            (
                "authorization".into(),
                SecretString::from(format!("Bearer {token}")),
            ),
            ("x-short".into(), SecretString::from("v1".to_owned())),
        ]);
        let encoded = STANDARD.encode(token);
        let mut value = json!({
            "error": format!("bad token {token}"),
            "echo": format!("Authorization: Bearer {token}"),
            "b64": encoded,
            "url": format!("https://x/?t={}", percent_encoding::utf8_percent_encode(token, percent_encoding::NON_ALPHANUMERIC)),
            "list": [URL_SAFE_NO_PAD.encode(token)],
            token: "as a key",
            "version": "v1",
        });
        assert_eq!(credentials.redact(&mut value), 6);
        let text = value.to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains(&encoded), "{text}");
        assert_eq!(value["version"], "v1", "short values are left alone");
        assert_eq!(
            value["echo"],
            format!("Authorization: {MARK}"),
            "the whole header value"
        );
    }
    const TOKEN: &str = "s3cr3t/t0ken+with=chars";

    fn bearer() -> Credentials {
        Credentials::new(&[(
            "authorization".into(),
            SecretString::from(format!("Bearer {TOKEN}")),
        )])
    }

    /// The string `text` becomes.
    fn redacted(credentials: &Credentials, text: &str) -> String {
        let mut value = json!(text);
        credentials.redact(&mut value);
        value.as_str().unwrap().to_owned()
    }

    #[test]
    fn percent_encoding_in_any_case_and_any_part_is_found() {
        let credentials = bearer();
        for (spelled, left) in [
            ("s3cr3t%2ft0ken%2bwith%3dchars", ""),
            ("s3cr3t%2Ft0ken+with=chars", ""),
            ("%73%33cr3t/t0ken%2Bwith=chars", ""),
            (
                "?t=s3cr3t%2ft0ken%2bwith%3dchars&x=1",
                "?t=[REDACTED:credential]&x=1",
            ),
        ] {
            let out = redacted(&credentials, spelled);
            let expected = if left.is_empty() { MARK } else { left };
            assert_eq!(out, expected, "{spelled}");
        }
    }

    #[test]
    fn hex_in_either_case_and_the_upper_cased_text_are_found() {
        let credentials = bearer();
        let hex: String = TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
        for spelled in [hex.clone(), hex.to_uppercase(), TOKEN.to_uppercase()] {
            assert_eq!(
                redacted(&credentials, &format!("x {spelled} y")),
                format!("x {MARK} y")
            );
        }
    }

    #[test]
    fn base64_of_a_longer_text_hides_no_credential_at_any_offset() {
        let credentials = bearer();
        for prefix in ["", "a", "ab", "abc", "abcd", "hello: "] {
            for suffix in ["", "!", "!!", " and more"] {
                let plain = format!("{prefix}{TOKEN}{suffix}");
                for engine in [&STANDARD, &URL_SAFE_NO_PAD] {
                    let encoded = engine.encode(&plain);
                    // The characters that hold only the token's bits.
                    let (start, end) = (
                        (prefix.len() * 8).div_ceil(6),
                        (prefix.len() + TOKEN.len()) * 8 / 6,
                    );
                    let out = redacted(&credentials, &encoded);
                    assert!(out.contains(MARK), "{plain}: {out}");
                    assert!(
                        !out.contains(&encoded[start..end]),
                        "{plain}: {out} still holds {}",
                        &encoded[start..end]
                    );
                }
            }
        }
    }

    #[test]
    fn json_escaped_slashes_are_found() {
        let credentials = bearer();
        let escaped = TOKEN.replace('/', "\\/");
        let out = redacted(&credentials, &format!(r#"{{"token":"{escaped}"}}"#));
        assert_eq!(out, format!(r#"{{"token":"{MARK}"}}"#));
    }

    #[test]
    fn a_credential_split_across_two_strings_is_redacted_in_both() {
        let credentials = bearer();
        let (head, tail) = TOKEN.split_at(9);
        let mut result = json!({"content": [
            {"type": "text", "text": format!("the key is {head}")},
            {"type": "text", "text": format!("{tail} (keep it)")},
        ]});
        assert_eq!(credentials.redact(&mut result), 1);
        assert_eq!(result["content"][0]["text"], format!("the key is {MARK}"));
        assert_eq!(result["content"][1]["text"], format!("{MARK} (keep it)"));
        // Two fields, whatever order a reader puts them in.
        let mut fields = json!({"a": tail, "z": format!("x{head}"), "n": "unrelated"});
        assert_eq!(credentials.redact(&mut fields), 1);
        assert_eq!(
            fields,
            json!({"a": MARK, "z": format!("x{MARK}"), "n": "unrelated"})
        );
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        let credentials = bearer();
        let mut value = json!({"content": [{"type": "text", "text": "s3cr3t"},
            {"type": "text", "text": "t0ken"}, {"type": "text", "text": "with = chars %2F \\/"}],
            "n": "SGVsbG8gd29ybGQ="});
        let before = value.clone();
        assert_eq!(credentials.redact(&mut value), 0);
        assert_eq!(value, before);
    }
}

//! The connection's own credentials, kept out of everything relayed from its
//! server: a server that echoes the bearer token or a header value in an
//! error or a result (a debug message, a reflected request) would otherwise
//! hand it to the agent. Every value is looked for raw, without an
//! `authorization` scheme word, in base64 (standard and URL-safe, padded or
//! not) and percent-encoded, in one Aho-Corasick pass per string.

use aho_corasick::AhoCorasick;
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
    spellings: Option<AhoCorasick>,
}

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
                if secret.chars().count() < MIN_SECRET_CHARS {
                    continue;
                }
                spellings.push(secret.to_owned());
                for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                    spellings.push(engine.encode(secret));
                }
                spellings.push(
                    percent_encoding::utf8_percent_encode(
                        secret,
                        percent_encoding::NON_ALPHANUMERIC,
                    )
                    .to_string(),
                );
            }
        }
        spellings.sort();
        spellings.dedup();
        // Longest first, so a value's base64 is replaced whole rather than
        // as the raw value it happens to contain.
        spellings.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let spellings = (!spellings.is_empty())
            .then(|| {
                AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostFirst)
                    .build(&spellings)
                    .ok()
            })
            .flatten();
        Credentials { spellings }
    }

    /// Replaces every spelling of a credential in every string (and object
    /// key) of `value`; returns how many were found.
    pub fn redact(&self, value: &mut Value) -> usize {
        let Some(spellings) = &self.spellings else {
            return 0;
        };
        redact_value(spellings, value)
    }
}

fn redact_value(spellings: &AhoCorasick, value: &mut Value) -> usize {
    match value {
        Value::String(s) => redact_str(spellings, s),
        Value::Array(items) => items.iter_mut().map(|v| redact_value(spellings, v)).sum(),
        Value::Object(map) => {
            let mut found = 0;
            if map.keys().any(|k| spellings.is_match(k)) {
                let entries = std::mem::take(map);
                for (mut k, v) in entries {
                    found += redact_str(spellings, &mut k);
                    map.insert(k, v);
                }
            }
            found
                + map
                    .values_mut()
                    .map(|v| redact_value(spellings, v))
                    .sum::<usize>()
        }
        _ => 0,
    }
}

fn redact_str(spellings: &AhoCorasick, s: &mut String) -> usize {
    if !spellings.is_match(s.as_str()) {
        return 0;
    }
    let found = spellings.find_iter(s.as_str()).count();
    *s = spellings.replace_all(s, &vec![MARK; spellings.patterns_len()]);
    found
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
}

//! Messages as the bytes that came: where an object's members lie in a
//! JSON text, and a text with a few of them replaced or added, the rest
//! left byte for byte as it was.
//!
//! Every function here takes a text the strict parser has already accepted
//! (`jsonrpc::parse`, `jsonrpc::parse_value`): valid UTF-8, valid JSON, no
//! duplicate or case-variant keys, within the depth bound. They find
//! positions only, and answer None for anything they do not read plainly
//! (a key written with an escape), so the caller takes the slow path of
//! building the message again; they never guess.

use std::borrow::Cow;
use std::ops::Range;

/// One member of an object: where its key (the text between the quotes)
/// and its value lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub key: Range<usize>,
    pub value: Range<usize>,
}

/// The members of the object whose text is `text[object]` (its braces
/// included), in order, and the position of its closing brace. None when
/// it is not an object, or a key holds an escape.
pub fn members(text: &[u8], object: Range<usize>) -> Option<(Vec<Member>, usize)> {
    let mut out = Vec::new();
    let close = each_member(text, object, |m| {
        out.push(m);
        false
    })?;
    Some((out, close))
}

/// The value of the member `key` of the object `text[object]`: read up to
/// that member only, without collecting the others.
pub fn member(text: &[u8], object: Range<usize>, key: &str) -> Option<Range<usize>> {
    let mut found = None;
    each_member(text, object, |m| {
        let hit = &text[m.key.clone()] == key.as_bytes();
        if hit {
            found = Some(m.value);
        }
        hit
    })?;
    found
}

/// Hands each member of the object `text[object]` to `stop` in order until
/// it answers true; then the position reached, else that of the closing
/// brace. None when it is not an object, or a key holds an escape.
fn each_member(
    text: &[u8],
    object: Range<usize>,
    mut stop: impl FnMut(Member) -> bool,
) -> Option<usize> {
    let end = object.end;
    let mut i = skip_space(text, object.start, end);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_space(text, i + 1, end);
    if text.get(i) == Some(&b'}') {
        return Some(i);
    }
    loop {
        if text.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(text, i, end)?;
        let key = i + 1..key_end - 1;
        if text[key.clone()].contains(&b'\\') {
            return None;
        }
        i = skip_space(text, key_end, end);
        if text.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_space(text, i + 1, end);
        let value_end = value_end(text, start, end)?;
        if stop(Member {
            key,
            value: start..value_end,
        }) {
            return Some(value_end);
        }
        i = skip_space(text, value_end, end);
        match text.get(i) {
            Some(b',') => i = skip_space(text, i + 1, end),
            Some(b'}') => return Some(i),
            _ => return None,
        }
    }
}

/// The whole of a text, without the white space around it.
pub fn whole(text: &[u8]) -> Range<usize> {
    let start = skip_space(text, 0, text.len());
    let mut end = text.len();
    while end > start && is_space(text[end - 1]) {
        end -= 1;
    }
    start..end
}

/// A text with some of its parts replaced: each edit a range of the text
/// and what goes there instead (an insertion is an empty range), borrowed
/// when it is text written once for many messages.
#[derive(Debug, Default)]
pub struct Splice<'w> {
    edits: Vec<(Range<usize>, Cow<'w, [u8]>)>,
}

impl<'w> Splice<'w> {
    /// `range` of the text becomes `with`.
    pub fn replace(&mut self, range: Range<usize>, with: impl Into<Cow<'w, [u8]>>) {
        self.edits.push((range, with.into()));
    }

    /// Members `"key": value` (each value a JSON text) added, in order, to
    /// the object whose members and closing brace [`members`] found.
    pub fn add_members(&mut self, members: &[Member], close: usize, added: &[(&str, &[u8])]) {
        let size: usize = added.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        let mut with = Vec::with_capacity(size);
        for (i, (key, value)) in added.iter().enumerate() {
            if i > 0 || !members.is_empty() {
                with.push(b',');
            }
            if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
                with.push(b'"');
                with.extend_from_slice(key.as_bytes());
                with.push(b'"');
            } else {
                // The key as JSON writes it, escaped (writing into a Vec
                // cannot fail).
                let _ = serde_json::to_writer(&mut with, key);
            }
            with.push(b':');
            with.extend_from_slice(value);
        }
        self.edits.push((close..close, Cow::Owned(with)));
    }

    /// Where `range` of the text (which no edit touches; an insertion at
    /// its start goes before it) lies once every edit is made.
    pub fn moved(&self, range: Range<usize>) -> Range<usize> {
        let mut at = range.start;
        for (edit, with) in &self.edits {
            if edit.end <= range.start {
                at = at + with.len() - edit.len();
            }
        }
        at..at + range.len()
    }

    /// The text with every edit made. Edits must not overlap; several
    /// insertions at one place keep the order they were made in.
    pub fn apply(mut self, text: &[u8]) -> Vec<u8> {
        self.edits.sort_by_key(|(r, _)| r.start);
        let added: usize = self.edits.iter().map(|(_, w)| w.len()).sum();
        let mut out = Vec::with_capacity(text.len() + added);
        let mut at = 0;
        for (range, with) in self.edits {
            debug_assert!(range.start >= at, "overlapping edits");
            out.extend_from_slice(&text[at..range.start]);
            out.extend_from_slice(&with);
            at = range.end;
        }
        out.extend_from_slice(&text[at..]);
        out
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_space(text: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && is_space(text[i]) {
        i += 1;
    }
    i
}

/// Past the closing quote of the string that opens at `start`.
fn string_end(text: &[u8], start: usize, end: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        let at = i + memchr::memchr2(b'"', b'\\', text.get(i..end)?)?;
        if text[at] == b'"' {
            return Some(at + 1);
        }
        i = at + 2; // an escape: the byte after the backslash is never the end
    }
}

/// Past the value that starts at `start`.
fn value_end(text: &[u8], start: usize, end: usize) -> Option<usize> {
    match text.get(start)? {
        b'"' => string_end(text, start, end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            while i < end {
                match text[i] {
                    b'"' => {
                        i = string_end(text, i, end)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let mut i = start;
            while i < end && !matches!(text[i], b',' | b'}' | b']') && !is_space(text[i]) {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn object(text: &str) -> Vec<(String, Value)> {
        let bytes = text.as_bytes();
        let (members, close) = members(bytes, whole(bytes)).unwrap();
        assert_eq!(bytes[close], b'}');
        members
            .into_iter()
            .map(|m| {
                let key = std::str::from_utf8(&bytes[m.key]).unwrap().to_owned();
                (key, serde_json::from_slice(&bytes[m.value]).unwrap())
            })
            .collect()
    }

    #[test]
    fn members_are_found_whatever_the_spacing_and_nesting() {
        let text = " {\"a\" : [1, {\"b\":\"}\\\"]\"}] ,\n\"id\":\"aip-7\",\"n\":-1.5e3,\"t\":true,\"o\":{} } ";
        assert_eq!(
            object(text),
            vec![
                ("a".into(), json!([1, {"b": "}\"]"}])),
                ("id".into(), json!("aip-7")),
                ("n".into(), json!(-1.5e3)),
                ("t".into(), json!(true)),
                ("o".into(), json!({})),
            ]
        );
        assert_eq!(object("{ }"), vec![]);
    }

    #[test]
    fn an_escaped_key_or_a_non_object_is_not_read() {
        let text = br#"{"\u0069d": 1}"#;
        assert_eq!(members(text, whole(text)), None);
        let text = b"[1, 2]";
        assert_eq!(members(text, whole(text)), None);
    }

    #[test]
    fn a_splice_replaces_and_adds_members_leaving_the_rest_as_it_was() {
        let text = br#"{"jsonrpc":"2.0", "id":"aip-3","result":{"x": 1 }}"#;
        let (top, _) = members(text, whole(text)).unwrap();
        let id = top.iter().find(|m| &text[m.key.clone()] == b"id").unwrap();
        let result = member(text, whole(text), "result").unwrap();
        let (inner, close) = members(text, result).unwrap();
        let mut splice = Splice::default();
        splice.replace(id.value.clone(), b"17".to_vec());
        splice.add_members(&inner, close, &[("k", b"[true]"), ("l", b"2")]);
        let out = splice.apply(text);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0", "id":17,"result":{"x": 1 ,"k":[true],"l":2}}"#
        );
        let empty = br#"{"r":{}}"#;
        let r = member(empty, whole(empty), "r").unwrap();
        let (inner, close) = members(empty, r).unwrap();
        let mut splice = Splice::default();
        splice.add_members(&inner, close, &[("k", b"1"), ("m\"", b"{}")]);
        assert_eq!(splice.apply(empty), br#"{"r":{"k":1,"m\"":{}}}"#.to_vec());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|n| json!(n)),
            "[ -~\\\\\"\u{00e9}\u{2028}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z}\\]\"{]{1,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Over any object, compact or pretty: the members found are the
        /// members serde_json reads, in order, and replacing one value
        /// gives the text serde_json would read as the changed object.
        #[test]
        fn members_agree_with_serde_json(
            map in prop::collection::btree_map("[a-z]{1,5}", arb_json(), 0..6),
            pretty in any::<bool>(),
            replaced in any::<prop::sample::Index>(),
        ) {
            let value = Value::Object(map.into_iter().collect());
            let text = if pretty {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            };
            let (found, close) = members(&text, whole(&text)).unwrap();
            prop_assert_eq!(text[close], b'}');
            let Value::Object(map) = &value else { unreachable!() };
            prop_assert_eq!(found.len(), map.len());
            for (m, (k, v)) in found.iter().zip(map) {
                prop_assert_eq!(&text[m.key.clone()], k.as_bytes());
                let read: Value = serde_json::from_slice(&text[m.value.clone()]).unwrap();
                prop_assert_eq!(&read, v);
            }
            if !found.is_empty() {
                let i = replaced.index(found.len());
                let mut splice = Splice::default();
                splice.replace(found[i].value.clone(), b"\"new\"".to_vec());
                let out: Value = serde_json::from_slice(&splice.apply(&text)).unwrap();
                let mut expected = map.clone();
                let key = std::str::from_utf8(&text[found[i].key.clone()]).unwrap();
                expected.insert(key.to_owned(), json!("new"));
                prop_assert_eq!(out, Value::Object(expected));
            }
        }
    }
}

//! Name normalization (spec §2): the form in which tool and method names are
//! compared. It is used for policy lookup only; the name a gateway forwards is
//! always the one the agent sent.

use std::borrow::Cow;

use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::UnicodeNormalization;

/// Normalizes a tool or method name: NFKC, lowercase, format/control and other
/// non-printable characters removed, leading and trailing whitespace trimmed.
///
/// Already-normal ASCII names (the overwhelming majority) are returned borrowed,
/// without allocating.
pub fn normalize_name(name: &str) -> Cow<'_, str> {
    if is_plain_ascii(name) {
        return Cow::Borrowed(name);
    }
    if name.is_ascii() {
        return Cow::Owned(normalize_ascii(name));
    }
    Cow::Owned(normalize_unicode(name))
}

/// Printable, non-space, lowercase ASCII: normalization is the identity.
fn is_plain_ascii(name: &str) -> bool {
    name.bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && !b.is_ascii_uppercase())
}

fn normalize_ascii(name: &str) -> String {
    let kept: String = name
        .chars()
        .filter(|c| !c.is_ascii_control())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    kept.trim().to_owned()
}

/// One round of the pipeline can expose work for another (removing a zero-width
/// character can bring a base letter next to a combining mark, lowercasing can
/// produce a sequence NFKC composes), so it runs until nothing changes. Three
/// rounds reach the fixed point for every input we know of; the bound keeps a
/// hostile input from looping.
fn normalize_unicode(name: &str) -> String {
    let mut current = one_round(name);
    for _ in 0..3 {
        let next = one_round(&current);
        if next == current {
            break;
        }
        current = next;
    }
    current
}

fn one_round(name: &str) -> String {
    let composed: String = name.nfkc().flat_map(char::to_lowercase).collect();
    let printable: String = composed.nfkc().filter(|&c| !is_invisible(c)).collect();
    printable.trim().to_owned()
}

/// Characters that carry no visible glyph of their own and so can hide inside a
/// name: controls, format characters (zero-width space, joiners, BOM, bidi
/// controls), line and paragraph separators, surrogates, private use and
/// unassigned code points.
fn is_invisible(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::Surrogate
            | GeneralCategory::PrivateUse
            | GeneralCategory::Unassigned
    )
}

#[cfg(test)]
mod tests {
    use super::normalize_name;

    #[test]
    fn plain_ascii_is_borrowed() {
        assert!(matches!(
            normalize_name("read_file"),
            std::borrow::Cow::Borrowed("read_file")
        ));
    }

    #[test]
    fn case_and_whitespace_fold() {
        assert_eq!(normalize_name("  READ_File\t"), "read_file");
        assert_eq!(normalize_name("TOOLS/CALL"), "tools/call");
    }

    #[test]
    fn fullwidth_ligature_and_superscript_fold() {
        assert_eq!(normalize_name("ｄｅｌｅｔｅ＿ｆｉｌｅ"), "delete_file");
        assert_eq!(normalize_name("\u{fb01}le_read"), "file_read");
        assert_eq!(normalize_name("tool\u{b2}"), "tool2");
    }

    #[test]
    fn invisible_characters_are_removed() {
        assert_eq!(normalize_name("delete\u{200b}file"), "deletefile");
        assert_eq!(normalize_name("exec\u{200c}command"), "execcommand");
        assert_eq!(normalize_name("\u{feff}safe_tool"), "safe_tool");
        assert_eq!(normalize_name("a\u{202e}b\u{2066}c"), "abc");
        assert_eq!(normalize_name("x\u{0}y\u{7f}"), "xy");
    }

    #[test]
    fn unicode_whitespace_is_trimmed_even_behind_invisibles() {
        assert_eq!(normalize_name("\u{2003}read_file\u{2003}"), "read_file");
        assert_eq!(normalize_name("\u{200b} read_file \u{feff}"), "read_file");
        assert_eq!(normalize_name("\u{3000}read_file"), "read_file");
    }

    #[test]
    fn cyrillic_lookalikes_stay_distinct() {
        assert_ne!(
            normalize_name("d\u{435}l\u{435}t\u{435}_fil\u{435}"),
            "delete_file"
        );
    }
}

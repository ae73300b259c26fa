//! Strict parsing: every smuggling shape is refused with the right code (and
//! the id when it can be known); what is accepted is forwarded canonically.

#![allow(clippy::unwrap_used)]

use aip_mcp::jsonrpc::{Kind, Limits, Refusal, parse};
use serde_json::{Value, json};

fn refuse(text: &str) -> (i64, Option<Value>, Refusal) {
    let r = parse(text.as_bytes(), Limits::default()).unwrap_err();
    (r.refusal.code(), r.id.clone(), r.refusal)
}

#[test]
fn accepts_and_reserializes_canonically() {
    let m = parse(br#" { "params": {"name": "t", "arguments": {"b": 1, "a": "\u0041"}}, "method": "tools/call", "id": 7, "jsonrpc": "2.0" } "#, Limits::default()).unwrap();
    assert_eq!(
        m.kind,
        Kind::Request {
            id: json!(7),
            method: "tools/call".into()
        }
    );
    assert_eq!(
        String::from_utf8(m.to_bytes()).unwrap(),
        r#"{"id":7,"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"a":"A","b":1},"name":"t"}}"#
    );
    let n = parse(
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(
        n.kind,
        Kind::Notification {
            method: "notifications/initialized".into()
        }
    );
    let r = parse(
        br#"{"jsonrpc":"2.0","id":"s1","result":{}}"#,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(r.kind, Kind::Response { id: json!("s1") });
}

#[test]
fn duplicate_keys_collide_after_unescaping_and_case_folding() {
    for (text, path, key) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#,
            "$",
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"a","Method":"b"}"#,
            "$",
            "Method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"a","\u006dethod":"b"}"#,
            "$",
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"a","METHOD":"b"}"#,
            "$",
            "METHOD",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{},"argumentſ":{"x":1}}}"#,
            "$.params",
            "argumentſ",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"path":"a","PATH":"b"}}}"#,
            "$.params.arguments",
            "PATH",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"list":[{"k":1,"K":2}]}}"#,
            "$.params.list[0]",
            "K",
        ),
    ] {
        let (code, id, refusal) = refuse(text);
        assert_eq!(code, -32700, "{text}");
        assert_eq!(
            refusal,
            Refusal::DuplicateKey {
                path: path.into(),
                key: key.into()
            },
            "{text}"
        );
        assert_eq!(id, Some(json!(1)), "the id is still known: {text}");
    }
    // A duplicated id cannot be echoed: which one would it be?
    let (code, id, _) = refuse(r#"{"jsonrpc":"2.0","id":1,"ID":2,"method":"m"}"#);
    assert_eq!((code, id), (-32700, None));
}

#[test]
fn non_json_numbers_and_unsafe_integers_are_refused() {
    for text in [
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":NaN}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":Infinity}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":-Infinity}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":1e400}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":0x10}}"#,
    ] {
        assert!(matches!(refuse(text).2, Refusal::Syntax { .. }), "{text}");
    }
    for number in [
        "9007199254740992",
        "-9007199254740992",
        "12345678901234567890123",
        "1e20",
        "18446744073709551615",
    ] {
        let text =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"x":[{number}]}}}}"#);
        assert_eq!(
            refuse(&text).2,
            Refusal::UnsafeNumber {
                path: "$.params.x[0]".into()
            },
            "{number}"
        );
    }
    for number in [
        "9007199254740991",
        "-9007199254740991",
        "1.5",
        "0.1",
        "-0",
        "1e15",
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"x":{number}}}}}"#);
        assert!(
            parse(text.as_bytes(), Limits::default()).is_ok(),
            "{number}"
        );
    }
}

#[test]
fn framing_problems_are_refused() {
    let (code, _, refusal) = refuse(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
    assert_eq!((code, refusal), (-32600, Refusal::Batch));
    let (code, id, _) =
        refuse(r#"{"jsonrpc":"2.0","id":1,"method":"ping"} {"jsonrpc":"2.0","id":2,"method":"x"}"#);
    assert_eq!(code, -32700);
    assert_eq!(id, None, "trailing bytes: which message's id?");
    assert!(
        parse(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n\t ",
            Limits::default()
        )
        .is_ok()
    );
    let mut bytes = br#"{"jsonrpc":"2.0","id":1,"method":"p"#.to_vec();
    bytes.extend_from_slice(&[0xff, b'"', b'}']);
    assert_eq!(refuse_bytes(&bytes), Refusal::InvalidUtf8 { offset: 35 });
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"x":"{}"}}}}"#,
        "a".repeat(100)
    );
    let r = parse(
        big.as_bytes(),
        Limits {
            max_bytes: 64,
            max_depth: 64,
        },
    )
    .unwrap_err();
    assert_eq!(
        r.refusal,
        Refusal::TooLarge {
            size: big.len(),
            limit: 64
        }
    );
    assert!(
        matches!(refuse("\u{feff}{}").2, Refusal::Syntax { .. }),
        "a BOM is not JSON"
    );
    assert!(matches!(
        refuse(r#"{"jsonrpc":"2.0","id":1,"method":"m",}"#).2,
        Refusal::Syntax { .. }
    ));
    assert!(
        matches!(
            refuse(r#"{"jsonrpc":"2.0","id":1,"method":"m\ud800"}"#).2,
            Refusal::Syntax { .. }
        ),
        "lone surrogate"
    );
}

fn refuse_bytes(bytes: &[u8]) -> Refusal {
    parse(bytes, Limits::default()).unwrap_err().refusal
}

#[test]
fn nesting_is_bounded() {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 8,
    };
    let nested = |n: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"x":{}1{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    assert!(parse(nested(6).as_bytes(), limits).is_ok());
    let r = parse(nested(7).as_bytes(), limits).unwrap_err();
    assert!(
        matches!(r.refusal, Refusal::TooDeep { limit: 8, .. }),
        "{:?}",
        r.refusal
    );
    assert_eq!(r.id, Some(json!(1)));
    // Far beyond serde_json's own recursion limit: still our refusal, no crash.
    let r = parse(nested(10_000).as_bytes(), Limits::default()).unwrap_err();
    assert_eq!(r.refusal.code(), -32700);
}

#[test]
fn json_rpc_shape_is_checked() {
    for (text, code) in [
        (r#"{"id":1,"method":"m"}"#, -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":5}"#, -32600),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","result":{}}"#,
            -32600,
        ),
        (r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1}"#, -32600),
        ("\"just a string\"", -32600),
    ] {
        assert_eq!(refuse(text).0, code, "{text}");
    }
    assert_eq!(
        refuse(r#"{"jsonrpc":"2.0","id":"abc","method":5}"#).1,
        Some(json!("abc"))
    );
}

/// A `notifications/...` method with an id is neither: one server would run
/// it as a request and answer, another drop it as a notification. Refused,
/// under its id, rather than forwarded as either.
#[test]
fn a_notification_that_carries_an_id_is_refused() {
    for text in [
        r#"{"jsonrpc":"2.0","id":5,"method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":"c","method":"notifications/cancelled","params":{"requestId":1}}"#,
    ] {
        let (code, id, refusal) = refuse(text);
        assert_eq!(code, -32600, "{text}");
        assert!(id.is_some(), "the refusal answers the id: {text}");
        assert!(refusal.to_string().contains("notification"), "{refusal}");
    }
    let note = parse(
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        Limits::default(),
    )
    .unwrap();
    assert!(matches!(note.kind, Kind::Notification { .. }));
}

/// Found by the differential test: without correctly rounded float parsing
/// (serde_json's `float_roundtrip`), this decodes one ULP away from what
/// Python and JavaScript read.
#[test]
fn floats_are_parsed_correctly_rounded() {
    let m = parse(
        br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":-2.8559254e-33}}"#,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(m.value["params"]["a"].as_f64(), Some(-2.8559254e-33));
    assert!(
        String::from_utf8(m.to_bytes())
            .unwrap()
            .contains("-2.8559254e-33")
    );
}

/// Go's `encoding/json` (and any decoder that matches keys without regard to
/// case) reads a lone `Arguments` as `arguments`: a key that folds to one the
/// gateway reads, under any decoder's folding, must be spelled exactly.
#[test]
fn keys_that_fold_to_a_key_the_gateway_reads_are_refused() {
    for (text, code, path, key, reads_as) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","Arguments":{"path":"/etc/shadow"}}}"#,
            -32602,
            "$.params",
            "Arguments",
            "arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","ARGUMENTS":{}}}"#,
            -32602,
            "$.params",
            "ARGUMENTS",
            "arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","argumentſ":{}}}"#,
            -32602,
            "$.params",
            "argumentſ",
            "arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"\u004eame":"t"}}"#,
            -32602,
            "$.params",
            "Name",
            "name",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"URİ":"file:///etc/shadow"}}"#,
            -32602,
            "$.params",
            "URİ",
            "uri",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call"}"#,
            -32600,
            "$",
            "Method",
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","PARAMS":{"name":"t"}}"#,
            -32600,
            "$",
            "PARAMS",
            "params",
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a","Result":{}}"#,
            -32600,
            "$",
            "Result",
            "result",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{},"_META":{}}}"#,
            -32602,
            "$.params",
            "_META",
            "_meta",
        ),
    ] {
        let (got, _, refusal) = refuse(text);
        assert_eq!(
            refusal,
            Refusal::ConfusableKey {
                path: path.into(),
                key: key.into(),
                reads_as: reads_as.into()
            },
            "{text}"
        );
        assert_eq!(got, code, "{text}");
    }
    // Keys nobody reads keep any spelling; arguments keep theirs (the policy
    // reads them exactly, and a lone variant is a missing argument to it).
    for text in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"Path":"a"},"Extra":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"Names":1},"Extras":2}"#,
    ] {
        assert!(parse(text.as_bytes(), Limits::default()).is_ok(), "{text}");
    }
}

/// Decoders fold differently: Go maps `İ` to `i` and `ı` to `I`, Unicode
/// simple folding maps the Kelvin sign to `k`, full folding maps `ß` to `ss`.
/// Two keys any of them reads as one are duplicates.
#[test]
fn duplicates_are_found_under_every_decoders_folding() {
    for (text, key) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":{"id":1,"İd":2}}}"#,
            "İd",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":{"id":1,"ıd":2}}}"#,
            "ıd",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":{"kind":1,"Kind":2}}}"#,
            "Kind",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":{"pass":1,"paß":2}}}"#,
            "paß",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":{"file":1,"ﬁle":2}}}"#,
            "ﬁle",
        ),
    ] {
        assert_eq!(
            refuse(text).2,
            Refusal::DuplicateKey {
                path: "$.params.x".into(),
                key: key.into()
            },
            "{text}"
        );
    }
}

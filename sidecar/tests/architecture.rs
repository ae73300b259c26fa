//! The shape of the gate, measured from its source and held by a ratchet:
//! each figure below may only go down, and when it does this test asks for
//! the new, lower figure to be written here. The goal (issue 31, "the gate
//! by types") is one pipeline behind one entry and components that own their
//! state: no `impl Gateway` outside gate/mod.rs, no component holding or
//! importing the gateway, no two gate files importing each other, the era
//! as an enum, and the transports calling only the entry and the session's
//! lifecycle.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Today's figures. Lower them as the gate improves; never raise them.
const CEILINGS: &[(&str, usize)] = &[
    ("gate files with an `impl Gateway` block", 1),
    ("holders of `Weak<Gateway>`", 0),
    ("eras written as `modern: bool`", 0),
    ("gate components importing `Gateway`", 0),
    ("pairs of gate components importing each other", 0),
    ("gateway methods the transports call", 5),
    ("gate components naming `Gateway`", 0),
];

fn sources(dir: &str) -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, code_only(&std::fs::read_to_string(&p).unwrap()))
        })
        .collect()
}

/// The text without comments (line comments and doc comments), so that
/// prose naming a type is not counted as a use of it.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The gate modules `text` (of a component) refers to through `super`.
fn super_references(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("super::") {
        rest = &rest[i + "super::".len()..];
        let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| {
                    let item = item.trim();
                    item.split("::").next().unwrap_or(item).trim().to_owned()
                })
                .collect()
        } else {
            vec![rest.chars().take_while(|c| is_ident(*c)).collect()]
        };
        found.extend(names.into_iter().filter(|n| modules.contains(n)));
    }
    found
}

/// Whether `text` imports the `Gateway` type from its parent.
fn imports_gateway(text: &str) -> bool {
    text.split("use super::").skip(1).any(|after| {
        let item = match after.strip_prefix('{') {
            Some(group) => &group[..group.find('}').unwrap_or(group.len())],
            None => after.split(';').next().unwrap_or(""),
        };
        item.split(',').any(|i| i.trim() == "Gateway")
    })
}

/// Whether `word` appears in `text` as a whole identifier.
fn names_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Names of methods called on something named `gateway` in `text`.
fn gateway_calls(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("gateway") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(is_ident) {
            continue;
        }
        let after = text[i + "gateway".len()..].trim_start();
        let Some(after) = after.strip_prefix('.') else {
            continue;
        };
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| is_ident(*c))
            .collect();
        let called = after.trim_start()[name.len()..]
            .trim_start()
            .starts_with('(');
        if called && !name.is_empty() && name != "clone" {
            found.insert(name);
        }
    }
    found
}

/// The lines of `files` containing `needle`, each with its file.
fn lines_with<'a>(
    files: impl Iterator<Item = (&'a String, &'a String)>,
    needle: &str,
) -> Vec<String> {
    files
        .flat_map(|(k, t)| {
            t.lines()
                .filter(|l| l.contains(needle))
                .map(move |l| format!("{k}: {}", l.trim()))
        })
        .collect()
}

fn measure() -> BTreeMap<&'static str, (usize, String)> {
    let gate = sources("gate");
    let agent = sources("agent");
    let modules: BTreeSet<String> = gate.keys().cloned().collect();
    let components: BTreeMap<&String, &String> = gate.iter().filter(|(k, _)| *k != "mod").collect();
    let mut figures = BTreeMap::new();

    let impl_files: Vec<&String> = gate
        .iter()
        .filter(|(_, t)| t.contains("impl Gateway {"))
        .map(|(k, _)| k)
        .collect();
    figures.insert(CEILINGS[0].0, (impl_files.len(), format!("{impl_files:?}")));

    let weak = lines_with(gate.iter(), "Weak<Gateway>");
    figures.insert(CEILINGS[1].0, (weak.len(), format!("{weak:?}")));

    let bools = lines_with(gate.iter().chain(agent.iter()), "modern: bool");
    figures.insert(CEILINGS[2].0, (bools.len(), format!("{bools:?}")));

    let importers: Vec<&String> = components
        .iter()
        .filter(|(_, t)| imports_gateway(t))
        .map(|(k, _)| *k)
        .collect();
    figures.insert(CEILINGS[3].0, (importers.len(), format!("{importers:?}")));

    let edges: BTreeMap<&String, BTreeSet<String>> = components
        .iter()
        .map(|(k, t)| (*k, super_references(t, &modules)))
        .collect();
    let mut pairs = BTreeSet::new();
    for (a, targets) in &edges {
        for b in targets {
            if edges.get(b).is_some_and(|back| back.contains(*a)) {
                let (x, y) = if *a < b { (*a, b) } else { (b, *a) };
                pairs.insert(format!("{x} <-> {y}"));
            }
        }
    }
    figures.insert(CEILINGS[4].0, (pairs.len(), format!("{pairs:?}")));

    let calls: BTreeSet<String> = agent.values().flat_map(|t| gateway_calls(t)).collect();
    figures.insert(CEILINGS[5].0, (calls.len(), format!("{calls:?}")));

    let naming: Vec<&String> = components
        .iter()
        .filter(|(_, t)| names_word(t, "Gateway"))
        .map(|(k, _)| *k)
        .collect();
    figures.insert(CEILINGS[6].0, (naming.len(), format!("{naming:?}")));
    figures
}

#[test]
fn the_gate_only_gets_simpler() {
    let figures = measure();
    let mut report = String::new();
    let mut failures = Vec::new();
    for (what, ceiling) in CEILINGS {
        let (got, which) = &figures[what];
        report.push_str(&format!("{what}: {got} (ceiling {ceiling}) {which}\n"));
        if got > ceiling {
            failures.push(format!("{what} went up: {got} > {ceiling}: {which}"));
        } else if got < ceiling {
            failures.push(format!(
                "{what} went down to {got}: write {got} as its ceiling in tests/architecture.rs"
            ));
        }
    }
    assert!(failures.is_empty(), "{}\n\n{report}", failures.join("\n"));
}

/// The transports reach the gate only through its one entry and the
/// lifecycle they own (the line limit stdio reads by, a session's stream,
/// its end, an agent that stopped sending), and no rule of an era is
/// written in them: the agent edge is the gate's, once for both.
#[test]
fn the_transports_reach_the_gate_only_through_its_entry() {
    let agent = sources("agent");
    let calls: BTreeSet<String> = agent.values().flat_map(|t| gateway_calls(t)).collect();
    let allowed: BTreeSet<String> = [
        "handle",
        "limits",
        "session_stream",
        "end_session",
        "withdraw",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    assert_eq!(calls, allowed);
    for rule in [
        "modern::",
        "claims_modern",
        "check_request",
        "param_headers",
        "era_of",
        "jsonrpc::parse",
    ] {
        let found = lines_with(agent.iter(), rule);
        assert!(found.is_empty(), "{rule} in the transports: {found:?}");
    }
}

#[test]
fn the_measures_see_what_they_count() {
    let modules: BTreeSet<String> = ["relay", "parked", "present"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let text =
        "use super::{Caller, Gateway, parked};\nuse super::present::x;\n// super::relay in prose\n";
    let refs = super_references(&code_only(text), &modules);
    assert_eq!(
        refs,
        BTreeSet::from(["parked".to_owned(), "present".to_owned()])
    );
    assert!(imports_gateway(text));
    assert!(!imports_gateway("use super::{Caller, GatewayOptions};"));
    assert!(names_word("impl Gateway {", "Gateway"));
    assert!(!names_word("GatewayOptions my_Gateway", "Gateway"));
    let calls = gateway_calls(
        "state.gateway.parse(x); self.gateway\n    .handle_message(a); gateway.clone(); my_gateway.no()",
    );
    assert_eq!(
        calls,
        BTreeSet::from(["handle_message".to_owned(), "parse".to_owned()])
    );
}

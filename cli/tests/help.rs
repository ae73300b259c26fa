//! Every flag of every binary the project ships says what it is for: each
//! binary's and each subcommand's `--help` is read, and an option whose
//! description is missing (or only its `[env]`/`[default]` notes) fails.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

const BINARIES: &[&str] = &[
    "aip",
    "aip-sidecar",
    "aip-operator",
    "kubectl-aip",
    "aip-fault-server",
];

fn binary(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/debug")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (make build)",
        path.display()
    );
    path
}

fn help(name: &str, subcommand: &[&str]) -> String {
    let out = Command::new(binary(name))
        .args(subcommand)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} {subcommand:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists (its `Commands:` section).
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Options without a description. In clap's long help each option sits on a
/// line of its own (`  -x, --flag <V>`), its description on the lines after,
/// indented further; a description that is only bracketed notes is none.
fn undescribed(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if !trimmed.starts_with('-') || indent > 6 {
            continue;
        }
        let flag = trimmed.split_whitespace().next().unwrap_or_default();
        if flag == "-h," || flag == "-V," || trimmed.starts_with("--help") {
            continue;
        }
        // Same-line description (short help) or the following lines.
        let inline = trimmed
            .split_once("  ")
            .map(|(_, rest)| rest.trim().to_owned())
            .unwrap_or_default();
        let mut description = inline;
        for next in &lines[i + 1..] {
            let t = next.trim_start();
            if t.is_empty()
                || next.len() - t.len() <= indent
                || t.starts_with('-') && next.len() - t.len() <= 6
            {
                break;
            }
            description.push(' ');
            description.push_str(t);
        }
        let words: String = description
            .split('[')
            .map(|part| part.split_once(']').map_or(part, |(_, after)| after))
            .collect();
        if words.trim().is_empty() {
            missing.push(trimmed.to_owned());
        }
    }
    missing
}

#[test]
fn every_flag_of_every_binary_has_help_text() {
    let mut missing = Vec::new();
    for name in BINARIES {
        let top = help(name, &[]);
        let mut texts = vec![(String::new(), top.clone())];
        for sub in subcommands(&top) {
            let text = help(name, &[&sub]);
            for nested in subcommands(&text) {
                texts.push((format!("{sub} {nested}"), help(name, &[&sub, &nested])));
            }
            texts.push((sub, text));
        }
        for (sub, text) in texts {
            missing.extend(
                undescribed(&text)
                    .into_iter()
                    .map(|flag| format!("{name} {sub}: {flag}")),
            );
        }
    }
    assert!(
        missing.is_empty(),
        "flags without help text:\n{}",
        missing.join("\n")
    );
}

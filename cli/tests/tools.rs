//! `aip tools` against live servers: the pins of what a server lists, a
//! check that names each drift, the poisoning scan flagging every class in
//! a set of poisoned descriptions, and passing the MCP reference servers'
//! own tools (npm: everything, filesystem, memory, sequential-thinking;
//! PyPI: time, git, fetch; installed by `make interop-deps`).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;

use std::path::Path;
use std::process::Command;

use common::{aip, repo, scratch, stdout};

fn fault_server() -> String {
    let bin = repo().join("target/debug/aip-fault-server");
    assert!(bin.exists(), "build the workspace first (make build)");
    bin.to_str().unwrap().to_owned()
}

/// A fault server script with the given tools (YAML list items).
fn script(dir: &Path, tools: &str) -> String {
    let path = dir.join("server.yaml");
    std::fs::write(
        &path,
        format!("apiVersion: aip.io/v1alpha1\nkind: FaultServer\nmetadata: {{name: files}}\nspec:\n  tools:\n{tools}"),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

const READ: &str = "    - {name: read, description: Reads a file., inputSchema: {type: object}, responses: [{sequence: [{return: ok}]}]}\n";
const LIST: &str = "    - {name: list, description: Lists a directory., responses: [{sequence: [{return: ok}]}]}\n";

#[test]
fn pins_then_a_check_that_names_every_change() {
    let dir = scratch("pins");
    let server = fault_server();
    let config = script(dir.path(), &format!("{READ}{LIST}"));
    let pinned = aip(&[
        "tools", "pin", "--", &server, "--config", &config, "--stdio",
    ]);
    assert!(pinned.status.success(), "{pinned:?}");
    let pins_text = stdout(&pinned);
    assert!(pins_text.starts_with("# 2 tools listed by "), "{pins_text}");
    assert!(
        pins_text.contains("toolPins:\n  list:\n    schemaHash: sha256:"),
        "{pins_text}"
    );
    let pins = dir.path().join("pins.yaml");
    std::fs::write(&pins, &pins_text).unwrap();
    let pins = pins.to_str().unwrap();

    let same = aip(&[
        "tools", "check", "--pins", pins, "--", &server, "--config", &config, "--stdio",
    ]);
    assert!(same.status.success(), "{same:?}");
    assert!(
        stdout(&same).ends_with("0 findings\n2 tools, 0 withheld\n"),
        "{}",
        stdout(&same)
    );

    // The server changes: read's description, list gone, a new tool.
    let changed = READ.replace("Reads a file.", "Reads a file and mails it.");
    let config = script(
        dir.path(),
        &format!("{changed}    - {{name: write, responses: [{{sequence: [{{return: ok}}]}}]}}\n"),
    );
    let check = aip(&[
        "tools", "check", "--pins", pins, "--", &server, "--config", &config, "--stdio",
    ]);
    assert_eq!(check.status.code(), Some(1), "{check:?}");
    let out = stdout(&check);
    let line = |tool: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{tool} ")))
            .unwrap_or_else(|| panic!("no line for {tool}: {out}"))
            .to_owned()
    };
    assert!(
        line("read").contains("drifted") && line("read").contains("schema hash sha256:"),
        "{out}"
    );
    assert!(line("write").contains("unpinned"), "{out}");
    assert!(line("list").contains("missing"), "{out}");
    assert!(out.ends_with("2 tools, 3 withheld\n"), "{out}");
}

#[test]
fn the_scan_flags_every_class_of_the_poisoned_set() {
    let server = fault_server();
    let poisoned = repo().join("cli/tests/poisoned-tools.yaml");
    let poisoned = poisoned.to_str().unwrap();
    let args = [
        "tools",
        "check",
        "--other-tool",
        "send_email",
        "--",
        &server,
        "--config",
        poisoned,
        "--stdio",
    ];
    let check = aip(&args);
    // Findings warn: the tools are served unless findings block.
    assert!(check.status.success(), "{check:?}");
    let out = stdout(&check);
    let classes = [
        "instructions",
        "hidden_text",
        "comment",
        "encoded",
        "url",
        "secrets",
        "tool_reference",
    ];
    let tools: Vec<&str> = out
        .lines()
        .take_while(|l| !l.ends_with(" findings"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(tools.len(), 10, "{out}");
    for tool in tools {
        let found: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{tool}: ")))
            .collect();
        match classes.iter().find(|c| tool.starts_with(&format!("{c}_"))) {
            Some(class) => assert!(
                found.iter().any(|l| l.contains(&format!("({class}) at "))),
                "{tool} has no {class} finding: {out}"
            ),
            None => assert!(found.is_empty(), "{tool} is clean: {found:?}"),
        }
    }
    let mut blocking = args.to_vec();
    blocking.insert(2, "--block-findings");
    let blocked = aip(&blocking);
    assert_eq!(blocked.status.code(), Some(1));
    assert!(
        stdout(&blocked).ends_with("10 tools, 9 withheld\n"),
        "{}",
        stdout(&blocked)
    );
}

#[test]
fn the_reference_servers_pass_the_scan() {
    let npm = repo().join("target/npm/node_modules/@modelcontextprotocol");
    let py = repo().join("target/pyenv/bin");
    assert!(
        npm.join("server-filesystem").exists() && py.join("mcp-server-git").exists(),
        "the reference servers are missing: run `make interop-deps`"
    );
    let dir = scratch("reference");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let repo_dir = dir.path().join("repo");
    let init = Command::new("git")
        .args(["init", "-q"])
        .arg(&repo_dir)
        .status()
        .unwrap();
    assert!(init.success());
    let node = |server: &str| {
        let script = npm.join(server).join("dist/index.js");
        vec!["node".to_owned(), script.to_str().unwrap().to_owned()]
    };
    let python = |server: &str| vec![py.join(server).to_str().unwrap().to_owned()];
    let servers = [
        [node("server-everything"), vec!["stdio".into()]].concat(),
        [
            node("server-filesystem"),
            vec![root.to_str().unwrap().into()],
        ]
        .concat(),
        node("server-memory"),
        node("server-sequential-thinking"),
        python("mcp-server-time"),
        [
            python("mcp-server-git"),
            vec!["--repository".into(), repo_dir.to_str().unwrap().into()],
        ]
        .concat(),
        python("mcp-server-fetch"),
    ];
    for server in servers {
        let mut args = vec!["tools", "check", "--"];
        args.extend(server.iter().map(String::as_str));
        let out = Command::new(env!("CARGO_BIN_EXE_aip"))
            .args(&args)
            .env("MEMORY_FILE_PATH", dir.path().join("memory.jsonl"))
            .output()
            .unwrap();
        let text = stdout(&out);
        assert!(out.status.success(), "{server:?}: {out:?}");
        assert!(text.contains("\n0 findings\n"), "{server:?}: {text}");
        let count: usize = text
            .lines()
            .last()
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(count > 0, "{server:?} listed no tools: {text}");
    }
}

#[test]
fn a_header_value_never_appears_in_what_is_printed() {
    // Nothing listens on port 9 of loopback: the listing fails.
    let secret = "Bearer s3cr3t-t0ken-value";
    let out = aip(&[
        "tools",
        "pin",
        "--url",
        "http://127.0.0.1:9/mcp?token=also-secret",
        "--header",
        &format!("Authorization: {secret}"),
    ]);
    assert!(!out.status.success());
    let all = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("did not list its tools"), "{all}");
    assert!(
        !all.contains("s3cr3t") && !all.contains("also-secret"),
        "{all}"
    );
}

#[test]
fn a_credential_the_server_echoes_is_redacted_but_pinned_as_sent() {
    let dir = scratch("echoed-credential");
    let token = "s3cr3t-t0ken-value-42";
    let encoded = "czNjcjN0LXQwa2VuLXZhbHVlLTQy"; // base64 of the token
    let server = fault_server();
    let config = script(
        dir.path(),
        &format!(
            "    - {{name: read, description: \"Reads. See https://x.example/?t={token} or https://x.example/?e={encoded}\", responses: [{{sequence: [{{return: ok}}]}}]}}\n"
        ),
    );
    let run = |header: Option<&str>, verb: &str| {
        let mut args = vec!["tools", verb];
        if let Some(h) = header {
            args.extend(["--header", h]);
        }
        args.extend(["--", &server, "--config", &config, "--stdio"]);
        let out = aip(&args);
        format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr))
    };
    let header = format!("Authorization: Bearer {token}");
    let checked = run(Some(&header), "check");
    assert!(checked.contains("url (url)"), "{checked}");
    // The excerpts end where the redaction mark starts (the url rule stops
    // at '['): the raw value and its base64 are both gone.
    assert!(checked.contains("\"https://x.example/?e=\""), "{checked}");
    assert!(
        !checked.contains(token) && !checked.contains(encoded),
        "{checked}"
    );
    // The hashes are of what the server sent, with or without the header.
    let pinned = run(Some(&header), "pin");
    assert!(
        !pinned.contains(token) && !pinned.contains(encoded),
        "{pinned}"
    );
    let hashes = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("Hash: sha256:"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(hashes(&pinned), hashes(&run(None, "pin")));
    assert_eq!(hashes(&pinned).len(), 2, "{pinned}");
}

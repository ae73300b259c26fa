//! Reading policy files and the environment they are compiled for.

use std::path::Path;

use aip_policy::{AgentPolicy, CompileOptions, Evaluator, PolicyErrors};
use anyhow::Context;

/// The file's text, or an error naming the file.
pub fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Parses by extension: `.json` as JSON (for JSON's own error positions),
/// anything else as YAML.
pub fn parse(path: &Path, text: &str) -> Result<AgentPolicy, PolicyErrors> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        AgentPolicy::from_json(text)
    } else {
        AgentPolicy::from_yaml(text)
    }
}

/// Compile options as the gateway would use them for this file: `~` is the
/// user's home and the file itself is protected.
pub fn options_for(path: Option<&Path>) -> CompileOptions {
    CompileOptions {
        home: home(),
        policy_path: path
            .and_then(|p| std::path::absolute(p).ok())
            .map(|p| p.display().to_string()),
        ..CompileOptions::default()
    }
}

pub fn home() -> Option<String> {
    std::env::var("HOME").ok().filter(|h| !h.is_empty())
}

/// Reads, validates and compiles a policy file. Errors are printed one per
/// line as `FILE: PATH: MESSAGE`.
pub fn evaluator(path: &Path) -> anyhow::Result<Result<(AgentPolicy, Evaluator), ()>> {
    let text = read(path)?;
    let compiled = parse(path, &text)
        .and_then(|p| Evaluator::compile(&p, &options_for(Some(path))).map(|e| (p, e)));
    Ok(compiled.map_err(|errors| print_errors(path, &errors)))
}

pub fn print_errors(path: &Path, errors: &PolicyErrors) {
    for e in &errors.0 {
        eprintln!("{}: {e}", path.display());
    }
}

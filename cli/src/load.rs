//! Reading policy files and the environment they are compiled for.

use std::path::Path;

use aip_policy::{CompileOptions, Evaluator, FieldError, PolicyErrors};
use anyhow::Context;
use serde_json::Value;

use crate::cluster::{self, PolicyFile};

/// The file's text, or an error naming the file.
pub fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Parses by extension (`.json` as JSON, for JSON's own error positions;
/// anything else as YAML) and validates either form of AgentPolicy: the
/// plain AIP document or the cluster object.
pub fn parse(path: &Path, text: &str) -> Result<PolicyFile, PolicyErrors> {
    let value = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        serde_json::from_str::<Value>(text).map_err(|e| {
            PolicyErrors(vec![FieldError {
                path: String::new(),
                message: format!(
                    "invalid JSON at line {} column {}: {e}",
                    e.line(),
                    e.column()
                ),
            }])
        })?
    } else {
        aip_policy::document::parse_yaml(text)?
    };
    cluster::validate(&value)
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

/// Reads, validates and compiles a policy file of either form. Errors are printed one per
/// line as `FILE: PATH: MESSAGE`.
pub fn evaluator(path: &Path) -> anyhow::Result<Result<(PolicyFile, Evaluator), ()>> {
    let text = read(path)?;
    let compiled = parse(path, &text).and_then(|file| {
        Evaluator::compile(&file.policy, &options_for(Some(path))).map(|e| (file, e))
    });
    Ok(compiled.map_err(|errors| print_errors(path, &errors)))
}

pub fn print_errors(path: &Path, errors: &PolicyErrors) {
    for e in &errors.0 {
        eprintln!("{}: {e}", path.display());
    }
}

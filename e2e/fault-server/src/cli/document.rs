//! The FaultCli document: which executables are mocked and what each
//! invocation of them answers, step by step. Same family as the FaultServer
//! document — the same apiVersion, unknown keys refused, first match wins,
//! finite sequences — and the same error style: every refusal names the
//! field path, and a document with any error never installs a shim.

use std::collections::BTreeSet;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::script::{
    API_VERSION, MAX_DELAY_MS, MAX_STEPS, ScriptError, compile_regex, deserialize_document, fail,
    parse_yaml,
};

pub const CLI_KIND: &str = "FaultCli";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    /// Required, so that "no mocks" is always said out loud: `[]` installs
    /// an empty shim directory, which also drops inherited ones from PATH.
    executables: Vec<Executable>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Executable {
    name: String,
    responses: Vec<Response>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Response {
    /// Kept as JSON values so that an unquoted `3` or `true` is refused with
    /// its path instead of silently becoming text.
    #[serde(default, rename = "match")]
    match_exact: Option<Vec<Value>>,
    #[serde(default)]
    match_regex: Option<Vec<Value>>,
    sequence: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    /// Required: a step never exits 0 by omission.
    exit_code: i64,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
}

/// A validated FaultCli document, ready to install and play.
#[derive(Debug)]
pub struct CliScript {
    pub name: String,
    /// Sorted by name.
    pub executables: Vec<MockedExecutable>,
}

#[derive(Debug)]
pub struct MockedExecutable {
    pub name: String,
    pub responses: Vec<ArgvResponse>,
}

#[derive(Debug)]
pub struct ArgvResponse {
    pub matcher: ArgvMatcher,
    pub steps: Vec<CliStep>,
}

/// Which argument vectors (after the executable's name) a response answers.
#[derive(Debug)]
pub enum ArgvMatcher {
    Any,
    /// Exactly these arguments, in this order.
    Exact(Vec<String>),
    /// As many arguments as regexes, each matching its own (unanchored).
    Regex(Vec<Regex>),
}

impl ArgvMatcher {
    pub fn matches(&self, argv: &[String]) -> bool {
        match self {
            ArgvMatcher::Any => true,
            ArgvMatcher::Exact(expected) => expected == argv,
            // Positional and of fixed length: an extra `--force` changes what
            // a command means, so it must not match a script written without it.
            ArgvMatcher::Regex(patterns) => {
                patterns.len() == argv.len()
                    && patterns.iter().zip(argv).all(|(re, arg)| re.is_match(arg))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliStep {
    pub exit_code: u8,
    pub stdout: String,
    pub stderr: String,
    pub delay_ms: u64,
    /// This step's own deadline, from the start of the invocation.
    pub deadline_ms: Option<u64>,
}

impl CliScript {
    /// Parses and validates a FaultCli YAML (or JSON) document.
    pub fn from_yaml(text: &str) -> Result<CliScript, ScriptError> {
        let value = parse_yaml(text)?;
        // The version and kind decide the schema: name them first, not a
        // field some other kind's document was right to have.
        for (key, expected) in [("apiVersion", API_VERSION), ("kind", CLI_KIND)] {
            if let Some(found) = value.get(key).and_then(Value::as_str)
                && found != expected
            {
                return fail(key, format!("must be {expected:?}, found {found:?}"));
            }
        }
        CliScript::validate(deserialize_document(&value)?)
    }

    fn validate(doc: Document) -> Result<CliScript, ScriptError> {
        if doc.api_version != API_VERSION {
            return fail(
                "apiVersion",
                format!("must be {API_VERSION:?}, found {:?}", doc.api_version),
            );
        }
        if doc.kind != CLI_KIND {
            return fail(
                "kind",
                format!("must be {CLI_KIND:?}, found {:?}", doc.kind),
            );
        }
        if doc.metadata.name.trim().is_empty() {
            return fail("metadata.name", "must not be empty");
        }
        let mut names = BTreeSet::new();
        let mut executables = Vec::with_capacity(doc.spec.executables.len());
        for (i, executable) in doc.spec.executables.into_iter().enumerate() {
            let path = format!("spec.executables[{i}]");
            check_name(&executable.name, &format!("{path}.name"))?;
            if !names.insert(executable.name.clone()) {
                return fail(
                    format!("{path}.name"),
                    format!("duplicate executable name {:?}", executable.name),
                );
            }
            executables.push(validate_executable(executable, &path)?);
        }
        executables.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(CliScript {
            name: doc.metadata.name,
            executables,
        })
    }

    pub fn executable(&self, name: &str) -> Option<&MockedExecutable> {
        self.executables
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.executables[i])
    }
}

/// A name becomes a file in the shim directory, found by PATH lookup.
fn check_name(name: &str, path: &str) -> Result<(), ScriptError> {
    if name.is_empty() {
        return fail(path, "must not be empty");
    }
    if name.contains('/') || name.contains('\0') {
        return fail(
            path,
            format!("{name:?} is not a command name (no '/' or NUL)"),
        );
    }
    if name.starts_with('.') {
        // `.` and `..` are not files, and the session lives in `.aip-fault/`.
        return fail(path, format!("{name:?} must not start with '.'"));
    }
    if name.chars().any(char::is_whitespace) {
        return fail(path, format!("{name:?} must not contain whitespace"));
    }
    Ok(())
}

fn validate_executable(
    executable: Executable,
    path: &str,
) -> Result<MockedExecutable, ScriptError> {
    if executable.responses.is_empty() {
        return fail(
            format!("{path}.responses"),
            "at least one response is required",
        );
    }
    let mut responses = Vec::with_capacity(executable.responses.len());
    for (r, response) in executable.responses.into_iter().enumerate() {
        let path = format!("{path}.responses[{r}]");
        let matcher = match (response.match_exact, response.match_regex) {
            (Some(_), Some(_)) => return fail(&path, "give either match or matchRegex, not both"),
            (Some(exact), None) => ArgvMatcher::Exact(strings(exact, &format!("{path}.match"))?),
            (None, Some(patterns)) => {
                let path = format!("{path}.matchRegex");
                if patterns.is_empty() {
                    return fail(
                        path,
                        "must have one regex per argument (use match: [] for no arguments)",
                    );
                }
                let compiled = strings(patterns, &path)?
                    .iter()
                    .enumerate()
                    .map(|(a, pattern)| compile_regex(pattern, &format!("{path}[{a}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                ArgvMatcher::Regex(compiled)
            }
            (None, None) => ArgvMatcher::Any,
        };
        let steps_path = format!("{path}.sequence");
        if response.sequence.is_empty() || response.sequence.len() > MAX_STEPS {
            return fail(
                steps_path,
                format!(
                    "must have 1..{MAX_STEPS} steps, found {}",
                    response.sequence.len()
                ),
            );
        }
        let steps = response
            .sequence
            .into_iter()
            .enumerate()
            .map(|(s, step)| validate_step(step, &format!("{steps_path}[{s}]")))
            .collect::<Result<Vec<_>, _>>()?;
        responses.push(ArgvResponse { matcher, steps });
    }
    Ok(MockedExecutable {
        name: executable.name,
        responses,
    })
}

/// Arguments are text: a YAML `3` or `true` must be quoted to say which text.
fn strings(values: Vec<Value>, path: &str) -> Result<Vec<String>, ScriptError> {
    values
        .into_iter()
        .enumerate()
        .map(|(a, value)| match value {
            Value::String(s) => Ok(s),
            other => fail(
                format!("{path}[{a}]"),
                format!("must be a string, found {other}; quote it (\"{other}\")"),
            ),
        })
        .collect()
}

fn validate_step(step: Step, path: &str) -> Result<CliStep, ScriptError> {
    let exit_code = u8::try_from(step.exit_code).or_else(|_| {
        fail(
            format!("{path}.exit_code"),
            format!("must be 0..255, found {}", step.exit_code),
        )
    })?;
    let delay_ms = step.delay_ms.unwrap_or(0);
    if delay_ms > MAX_DELAY_MS {
        return fail(
            format!("{path}.delay_ms"),
            format!("must be 0..{MAX_DELAY_MS}, found {delay_ms}"),
        );
    }
    if let Some(deadline) = step.deadline_ms
        && deadline > MAX_DELAY_MS
    {
        return fail(
            format!("{path}.deadline_ms"),
            format!("must be 0..{MAX_DELAY_MS}, found {deadline}"),
        );
    }
    Ok(CliStep {
        exit_code,
        stdout: step.stdout,
        stderr: step.stderr,
        delay_ms,
        deadline_ms: step.deadline_ms,
    })
}

//! `aip policy check | eval | convert | redact`.

use std::path::{Path, PathBuf};

use aip_policy::{Approval, Decision, Request, Verdict};
use anyhow::Context;
use serde_json::{Value, json};

use crate::cluster::{self, Binding};
use crate::load;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ApprovalArg {
    Approve,
    Deny,
    Timeout,
}

/// Validates every file; true when all are valid.
pub fn check(files: &[PathBuf]) -> anyhow::Result<bool> {
    let mut all_ok = true;
    for file in files {
        match load::evaluator(file)? {
            Ok((checked, evaluator)) => println!(
                "{}: ok (policy {:?}, mode {}, {}{})",
                file.display(),
                checked.policy.metadata.name,
                evaluator.mode().as_str(),
                evaluator.policy_hash().unwrap_or_default(),
                checked
                    .binding
                    .as_ref()
                    .map(binding_summary)
                    .unwrap_or_default()
            ),
            Err(()) => all_ok = false,
        }
    }
    Ok(all_ok)
}

/// What the cluster form binds: `; pods app=agent, connections fs,
/// approval timeout 120s`.
fn binding_summary(b: &Binding) -> String {
    let pods = if b.selector.is_empty() {
        "every pod of its namespace".to_owned()
    } else {
        format!("pods {}", b.selector)
    };
    let connections = if b.tool_connections.is_empty() {
        "no connections".to_owned()
    } else {
        format!("connections {}", b.tool_connections.join(","))
    };
    let timeout = match b.approval_timeout_seconds {
        Some(s) => format!("approval timeout {s}s"),
        None => format!(
            "approval timeout {}s (default)",
            cluster::DEFAULT_APPROVAL_TIMEOUT_SECONDS
        ),
    };
    let mut summary = format!("; {pods}, {connections}, {timeout}");
    if !b.allowed_service_accounts.is_empty() {
        summary.push_str(&format!(
            ", also decided by {}",
            b.allowed_service_accounts.join(",")
        ));
    }
    summary
}

pub fn eval(
    file: &Path,
    request: &str,
    approval: Option<ApprovalArg>,
    as_json: bool,
) -> anyhow::Result<bool> {
    let Ok((_, evaluator)) = load::evaluator(file)? else {
        return Ok(false);
    };
    let message: Value = serde_json::from_str(request).context("--request is not valid JSON")?;
    let request = Request::from_value(&message).context("--request is not a JSON-RPC message")?;
    let mut verdict = evaluator.evaluate(&request);
    if let Some(answer) = approval {
        verdict = verdict.resolve(match answer {
            ApprovalArg::Approve => Approval::Approved,
            ApprovalArg::Deny => Approval::Denied,
            ApprovalArg::Timeout => Approval::TimedOut,
        });
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&verdict_json(&verdict))?);
    } else {
        print_verdict(&verdict);
    }
    Ok(true)
}

fn verdict_json(v: &Verdict) -> Value {
    json!({
        "decision": v.decision.as_str(),
        "audit_decision": v.audit_decision(),
        "violation": v.violation,
        "mode": v.mode.as_str(),
        "reason": v.reason(),
        "failed_arg": v.failed_arg(),
        "failed_rule": v.failed_rule(),
        "error": v.error(),
        "response": v.response(),
    })
}

fn print_verdict(v: &Verdict) {
    println!("decision:  {}", v.decision);
    println!("violation: {}", v.violation);
    if v.violation && v.decision == Decision::Allow {
        println!("note:      monitor mode: forwarded, violation recorded");
    }
    if v.decision == Decision::Ask {
        println!("note:      held for human approval (use --approval approve|deny|timeout)");
    }
    if let Some(reason) = v.reason() {
        println!("reason:    {reason}");
    }
    if let Some(arg) = v.failed_arg() {
        println!("argument:  {arg}");
    }
    if let Some(rule) = v.failed_rule() {
        println!("rule:      {rule}");
    }
    match (v.response(), v.error()) {
        (Some(response), _) => println!("response:  {response}"),
        (None, Some(error)) => println!("error:     {}", json!(error)),
        (None, None) => {}
    }
}

pub fn convert(file: &Path, namespace: Option<&str>) -> anyhow::Result<bool> {
    let text = load::read(file)?;
    let policy = match load::parse(file, &text) {
        Ok(cluster::PolicyFile {
            binding: Some(_), ..
        }) => {
            eprintln!(
                "{}: already a cluster AgentPolicy (its spec binds pods and connections); convert takes a plain AIP document",
                file.display()
            );
            return Ok(false);
        }
        Ok(file) => file.policy,
        Err(errors) => {
            load::print_errors(file, &errors);
            return Ok(false);
        }
    };
    match policy.to_kubernetes(namespace) {
        Ok(k8s) => {
            print!("{}", serde_saphyr::to_string(&k8s)?);
            Ok(true)
        }
        Err(problem) => {
            eprintln!("{}: {problem}", file.display());
            Ok(false)
        }
    }
}

pub fn redact(file: &Path, result: Option<&str>, text: Option<&str>) -> anyhow::Result<bool> {
    let Ok((_, evaluator)) = load::evaluator(file)? else {
        return Ok(false);
    };
    let Some(redactor) = evaluator.redactor() else {
        eprintln!(
            "{}: the policy has no enabled DLP patterns; content passes unchanged",
            file.display()
        );
        print!("{}", result.or(text).unwrap_or_default());
        return Ok(true);
    };
    let (output, events) = match (result, text) {
        (Some(result), _) => {
            let mut value: Value =
                serde_json::from_str(result).context("--result is not valid JSON")?;
            let events = redactor.redact_tool_result(&mut value);
            (serde_json::to_string(&value)?, events)
        }
        (None, text) => {
            let r = redactor.redact(text.unwrap_or_default());
            (r.text.into_owned(), r.events)
        }
    };
    println!("{output}");
    for e in events {
        eprintln!("DLP_TRIGGERED rule={:?} count={}", e.rule, e.count);
    }
    Ok(true)
}

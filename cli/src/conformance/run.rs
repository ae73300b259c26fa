//! Runs one vector file.

use std::path::Path;

use aip_policy::{Approval, CompileOptions, Decision, Evaluator, Request, Verdict};
use serde_json::{Value, json};

use super::compare::{Mismatches, show, subset};
use super::report::{FileReport, TestReport};
use super::vector::{ExpectedEvent, Suite, Vector};
use crate::load;

pub fn file(path: &Path) -> FileReport {
    let suite = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read: {e}"))
        .and_then(|text| parse(&text));
    match suite {
        Ok(suite) => FileReport {
            path: path.to_owned(),
            name: suite.name,
            tests: suite.tests.iter().map(test).collect(),
            error: None,
        },
        Err(error) => FileReport {
            path: path.to_owned(),
            name: None,
            tests: Vec::new(),
            error: Some(error),
        },
    }
}

fn parse(text: &str) -> Result<Suite, String> {
    let value = aip_policy::document::parse_yaml(text).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| format!("not a vector file: {e}"))
}

fn test(vector: &Vector) -> TestReport {
    if let Some(why) = vector.unsupported() {
        return TestReport {
            id: vector.id.clone(),
            mismatches: Vec::new(),
            unsupported: Some(why),
        };
    }
    let mut m = Mismatches::default();
    let refuse = vector.expected.expects_invalid_policy();
    let clock = aip_policy::ManualClock::default();
    match evaluator(&vector.policy, &clock) {
        Ok(_) if refuse => m.fail("policy", "the policy to be refused", "it loaded"),
        Ok(evaluator) if is_response(vector) => dlp(&evaluator, vector, &mut m),
        Ok(evaluator) => request(&evaluator, &clock, vector, &mut m),
        Err(_) if refuse => {}
        Err(e) => m.fail("policy", "a policy that loads", e),
    }
    TestReport {
        id: vector.id.clone(),
        mismatches: m.0,
        unsupported: None,
    }
}

/// The vector's policy, its rate limits on `clock` (which only the runner
/// moves, so a vector's timing is exactly what it says).
fn evaluator(policy: &Value, clock: &aip_policy::ManualClock) -> Result<Evaluator, String> {
    let options = CompileOptions {
        home: load::home(),
        clock: aip_policy::RateClock::Manual(clock.clone()),
        ..CompileOptions::default()
    };
    let compiled = match policy {
        Value::Null => return Ok(Evaluator::deny_all()),
        Value::String(text) => Evaluator::from_yaml(text, &options),
        other => aip_policy::AgentPolicy::from_value(other)
            .and_then(|p| Evaluator::compile(&p, &options)),
    };
    compiled.map_err(|e| e.to_string().replace('\n', "; "))
}

fn is_response(vector: &Vector) -> bool {
    vector.input.kind.as_deref() == Some("response")
}

fn request(
    evaluator: &Evaluator,
    clock: &aip_policy::ManualClock,
    vector: &Vector,
    m: &mut Mismatches,
) {
    let input = &vector.input;
    let mut message = json!({
        "jsonrpc": "2.0",
        "id": input.request_id.clone().unwrap_or(json!(1)),
        "method": input.method.as_deref().unwrap_or("tools/call"),
    });
    if let Some(tool) = &input.tool {
        message["params"] =
            json!({"name": tool, "arguments": input.args.clone().unwrap_or(json!({}))});
    }
    let request = match Request::from_value(&message) {
        Ok(r) => r,
        Err(e) => return m.fail("input", "a JSON-RPC request", e),
    };
    // The previous calls are spread over the window, the last of them a
    // millisecond before this one: all within it.
    let previous = input.context.previous_calls.unwrap_or(0);
    let window = match input.context.window.as_deref().map(window) {
        None => std::time::Duration::ZERO,
        Some(Ok(w)) => w,
        Some(Err(e)) => return m.fail("input.context.window", "a duration like 1m or 30s", e),
    };
    let step = window
        .saturating_sub(std::time::Duration::from_millis(1))
        .checked_div(previous.max(1))
        .unwrap_or_default();
    for _ in 0..previous {
        evaluator.evaluate(&request);
        clock.advance(step);
    }
    let mut verdict = evaluator.evaluate(&request);
    if let Some(answer) = &input.context.user_response {
        match approval(answer) {
            Some(a) => verdict = verdict.resolve(a),
            None => return m.fail("context.user_response", "approve, deny or timeout", answer),
        }
    }
    compare_verdict(&verdict, vector, m);
}

/// `500ms`, `30s`, `1m`, `2h`.
fn window(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds = |s: u64| std::time::Duration::from_secs(n.saturating_mul(s));
    match unit {
        "ms" => Ok(std::time::Duration::from_millis(n)),
        "s" => Ok(seconds(1)),
        "m" => Ok(seconds(60)),
        "h" => Ok(seconds(3600)),
        other => Err(format!("unit {other:?} is not ms, s, m or h")),
    }
}

fn approval(answer: &str) -> Option<Approval> {
    match answer.to_ascii_lowercase().as_str() {
        "approve" | "approved" | "allow" | "yes" => Some(Approval::Approved),
        "deny" | "denied" | "no" => Some(Approval::Denied),
        "timeout" | "expired" => Some(Approval::TimedOut),
        _ => None,
    }
}

fn compare_verdict(v: &Verdict, vector: &Vector, m: &mut Mismatches) {
    let e = &vector.expected;
    let code = v.error().map(|e| e.code);
    if let Some(decision) = &e.decision {
        // Audit names (ALLOW_MONITOR, PROTECTED_PATH) are accepted too.
        let ok = decision == v.decision.as_str() || decision == v.audit_decision();
        m.check("decision", ok, decision, v.decision);
    }
    if let Some(expected) = &e.error_code {
        let actual = code.map_or(Value::Null, Value::from);
        m.check("error_code", subset(expected, &actual), expected, actual);
    }
    if let Some(violation) = e.violation {
        m.check(
            "violation",
            violation == v.violation,
            violation,
            v.violation,
        );
    }
    let error = v.error().map(|e| json!(e));
    if let Some(message) = &e.error_message {
        let actual = error
            .as_ref()
            .and_then(|e| e["message"].as_str())
            .unwrap_or("nothing");
        m.check("error_message", message == actual, message, actual);
    }
    if let Some(data) = &e.error_data {
        let actual = error.as_ref().map(|e| &e["data"]);
        m.check(
            "error_data",
            actual.is_some_and(|a| subset(data, a)),
            data,
            show(actual),
        );
    }
    if let Some(format) = &e.response_format {
        let actual = v.response();
        let ok = actual.as_ref().is_some_and(|a| subset(format, a));
        m.check("response_format", ok, format, show(actual.as_ref()));
    }
    if v.decision == Decision::Ask && e.decision.is_none() && e.error_code.is_none() {
        m.fail(
            "expected",
            "a decision or error_code to check",
            "none stated",
        );
    }
}

fn dlp(evaluator: &Evaluator, vector: &Vector, m: &mut Mismatches) {
    let content = vector.input.content.clone().unwrap_or(Value::Null);
    let (output, events) = match (evaluator.redactor(), content) {
        (None, content) => (content, Vec::new()),
        (Some(r), Value::String(text)) => {
            let out = r.redact(&text);
            (Value::String(out.text.into_owned()), out.events)
        }
        (Some(r), mut result) => {
            let events = r.redact_tool_result(&mut result);
            (result, events)
        }
    };
    let e = &vector.expected;
    let redacted = !events.is_empty();
    if let Some(expected) = e.redacted {
        m.check("redacted", expected == redacted, expected, redacted);
    }
    if let Some(expected) = &e.output {
        m.check("output", expected == &output, expected, &output);
    }
    if let Some(expected) = &e.dlp_events {
        let mut expected = expected.clone();
        let mut actual: Vec<ExpectedEvent> = events
            .into_iter()
            .map(|e| ExpectedEvent {
                rule: e.rule,
                count: e.count,
            })
            .collect();
        expected.sort();
        actual.sort();
        m.check(
            "dlp_events",
            expected == actual,
            json!(expected),
            json!(actual),
        );
    }
}

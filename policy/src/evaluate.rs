//! Message -> Verdict (spec §3): the method check for every message, then the
//! tool check for tools/call, then what the mode makes of a violation.

use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

use serde_json::{Map, Value};

pub use crate::approval::Approval;
use crate::approval::Withdrawal;
use crate::compile::{CompiledPolicy, CompiledRule, Evaluator, ToolEntry};
use crate::document::{Action, Mode};
use crate::errors::{RpcError, Subject, codes};
use crate::message::{Request, ToolCall};
use crate::normalize::normalize_name;

/// What the gateway should do with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward it.
    Allow,
    /// Answer with `Verdict::error`.
    Block,
    /// Hold it until a person decides (then `Verdict::resolve`).
    Ask,
    /// Answer with the rate-limit error.
    RateLimited,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "ALLOW",
            Decision::Block => "BLOCK",
            Decision::Ask => "ASK",
            Decision::RateLimited => "RATE_LIMITED",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which rule fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    MethodDenied,
    MethodNotAllowed,
    InvalidParams,
    NoPolicy,
    ToolBlocked,
    ToolNotAllowed,
    ArgumentMissing,
    ArgumentMismatch,
    UndeclaredArgument,
    RateLimited,
    ProtectedPath,
    ApprovalDenied,
    ApprovalTimeout,
    /// The ask ended undecided (not a person's decision), for this reason.
    ApprovalWithdrawn(Withdrawal),
    /// The tool's definition is not the one pinned (AIP v1alpha2
    /// `schema_hash`, or a connection's tool pins).
    SchemaMismatch,
}

impl Cause {
    /// Tool-rule violations are the ones monitor mode lets through; method
    /// denials, malformed calls, rate limits and protected paths are always
    /// enforced.
    fn relaxed_by_monitor(self) -> bool {
        matches!(
            self,
            Cause::ToolBlocked
                | Cause::ToolNotAllowed
                | Cause::ArgumentMissing
                | Cause::ArgumentMismatch
                | Cause::UndeclaredArgument
        )
    }
}

/// The outcome of evaluating one message. An ALLOW carries nothing else, so
/// the hot path builds and drops a few bytes; everything a violation explains
/// lives behind one allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub decision: Decision,
    /// A rule was triggered, whether or not the message was stopped.
    pub violation: bool,
    pub mode: Mode,
    pub cause: Option<Cause>,
    detail: Option<Box<Detail>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Detail {
    reason: Option<String>,
    failed_arg: Option<String>,
    failed_rule: Option<String>,
    error: Option<RpcError>,
    tool: Option<String>,
    id: Option<Value>,
}

impl Verdict {
    fn allow(mode: Mode) -> Verdict {
        Verdict {
            decision: Decision::Allow,
            violation: false,
            mode,
            cause: None,
            detail: None,
        }
    }

    fn detail(&self) -> Option<&Detail> {
        self.detail.as_deref()
    }

    /// Human-readable explanation, when a rule fired.
    pub fn reason(&self) -> Option<&str> {
        self.detail()?.reason.as_deref()
    }

    /// The argument that failed validation or named a protected path.
    pub fn failed_arg(&self) -> Option<&str> {
        self.detail()?.failed_arg.as_deref()
    }

    /// The rule that failed: the argument's regex, `strict_args`,
    /// `allowed_tools`, the protected path, ...
    pub fn failed_rule(&self) -> Option<&str> {
        self.detail()?.failed_rule.as_deref()
    }

    /// The error to answer with, when the message is stopped.
    pub fn error(&self) -> Option<&RpcError> {
        self.detail()?.error.as_ref()
    }

    /// The tool called, when a tools/call did not simply pass.
    pub fn tool(&self) -> Option<&str> {
        self.detail()?.tool.as_deref()
    }

    /// The request id to echo (None for notifications and plain ALLOWs).
    pub fn id(&self) -> Option<&Value> {
        self.detail()?.id.as_ref()
    }

    /// The complete JSON-RPC error response to send back, if any (never for a
    /// notification).
    pub fn response(&self) -> Option<Value> {
        Some(self.error()?.response(self.id()?))
    }

    /// The decision as audit lines name it: `ALLOW_MONITOR` for a violation
    /// monitor mode let through, `PROTECTED_PATH` for protected paths.
    pub fn audit_decision(&self) -> &'static str {
        match (self.decision, self.cause) {
            (Decision::Allow, Some(_)) if self.violation => "ALLOW_MONITOR",
            (Decision::Block, Some(Cause::ProtectedPath)) => "PROTECTED_PATH",
            (Decision::Block, Some(Cause::ApprovalDenied)) => "USER_DENIED",
            (Decision::Block, Some(Cause::ApprovalTimeout)) => "APPROVAL_TIMEOUT",
            (Decision::Block, Some(Cause::ApprovalWithdrawn(Withdrawal::GatewayShutdown))) => {
                "GATEWAY_SHUTDOWN"
            }
            (Decision::Block, Some(Cause::ApprovalWithdrawn(_))) => "APPROVAL_WITHDRAWN",
            (d, _) => d.as_str(),
        }
    }

    /// Applies how an ask ended to an ASK verdict: a person's approval lets
    /// it through; a person's denial is -32004, an expiry -32005 (AIP's
    /// codes), a withdrawal -32015 with `data.cause`, the gateway shutting
    /// down -32016. Other verdicts are returned unchanged.
    pub fn resolve(self, answer: Approval) -> Verdict {
        if self.decision != Decision::Ask {
            return self;
        }
        let (cause, code, reason) = match answer {
            Approval::Approved => {
                return Verdict {
                    decision: Decision::Allow,
                    ..self
                };
            }
            Approval::Denied => (Cause::ApprovalDenied, codes::USER_DENIED, "Approval denied"),
            Approval::TimedOut => (
                Cause::ApprovalTimeout,
                codes::APPROVAL_TIMEOUT,
                "No approval decision before the timeout",
            ),
            Approval::Withdrawn(w) => (
                Cause::ApprovalWithdrawn(w),
                if w == Withdrawal::GatewayShutdown {
                    codes::GATEWAY_SHUTTING_DOWN
                } else {
                    codes::APPROVAL_WITHDRAWN
                },
                w.sentence(),
            ),
        };
        let mut detail = self.detail.unwrap_or_default();
        let tool = Subject::Tool(detail.tool.clone().unwrap_or_default());
        detail.reason = Some(reason.to_owned());
        let mut error = RpcError::new(code, tool, reason);
        if let Cause::ApprovalWithdrawn(w) = cause {
            error = error.with_cause(w.as_str());
        }
        detail.error = Some(error);
        Verdict {
            decision: Decision::Block,
            cause: Some(cause),
            detail: Some(detail),
            ..self
        }
    }
}

impl Verdict {
    /// The tool's definition is withheld for `reason` (it no longer matches
    /// its pin): the call is refused with -32013 whatever the policy
    /// allowed or would ask, in every mode. A call the policy already
    /// refused keeps the policy's answer.
    pub fn withheld(self, id: Option<&Value>, tool: &str, reason: &str) -> Verdict {
        if !matches!(self.decision, Decision::Allow | Decision::Ask) {
            return self;
        }
        let subject = Subject::Tool(tool.to_owned());
        Verdict {
            decision: Decision::Block,
            violation: true,
            mode: self.mode,
            cause: Some(Cause::SchemaMismatch),
            detail: Some(Box::new(Detail {
                error: Some(RpcError::new(codes::SCHEMA_MISMATCH, subject, reason)),
                reason: Some(reason.to_owned()),
                failed_arg: None,
                failed_rule: Some("schema_hash".to_owned()),
                tool: Some(tool.to_owned()),
                id: id.cloned(),
            })),
        }
    }
}

static NO_ARGS: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);

/// A rule that fired, before the mode is applied.
struct Violation {
    cause: Cause,
    code: i64,
    reason: String,
    failed_arg: Option<String>,
    failed_rule: Option<String>,
}

impl Violation {
    fn new(cause: Cause, code: i64, reason: impl Into<String>) -> Violation {
        Violation {
            cause,
            code,
            reason: reason.into(),
            failed_arg: None,
            failed_rule: None,
        }
    }

    fn arg(mut self, arg: &str, rule: impl Into<String>) -> Violation {
        self.failed_arg = Some(arg.to_owned());
        self.failed_rule = Some(rule.into());
        self
    }

    fn rule(mut self, rule: impl Into<String>) -> Violation {
        self.failed_rule = Some(rule.into());
        self
    }
}

impl Evaluator {
    /// Evaluates one message from the agent.
    pub fn evaluate(&self, request: &Request<'_>) -> Verdict {
        let mode = self.mode();
        // tools/call is nearly every message; its gate answer is precomputed.
        let is_call = request.method == "tools/call";
        if !(is_call && self.methods.tools_call_allowed) {
            let method = normalize_name(request.method);
            if let Some(v) = self.check_method(&method) {
                return self.conclude(v, Subject::Method(request.method.to_owned()), request, mode);
            }
            if method == "resources/read" {
                return self.check_resource(request, mode);
            }
            if method != "tools/call" {
                return Verdict::allow(mode);
            }
        }
        let call = match ToolCall::from_params(request.params) {
            Ok(call) => call,
            Err(problem) => {
                let v = Violation::new(Cause::InvalidParams, codes::INVALID_PARAMS, problem);
                return self.conclude(v, Subject::Tool(String::new()), request, mode);
            }
        };
        let Some(policy) = &self.policy else {
            let v = Violation::new(Cause::NoPolicy, codes::FORBIDDEN, "No policy loaded");
            return self.conclude(v, Subject::Tool(call.name.to_owned()), request, mode);
        };
        match check_tool(policy, &call) {
            ToolOutcome::Allow => Verdict::allow(mode),
            ToolOutcome::Ask => Verdict {
                decision: Decision::Ask,
                detail: Some(Box::new(Detail {
                    tool: Some(call.name.to_owned()),
                    id: request.id.cloned(),
                    ..Detail::default()
                })),
                ..Verdict::allow(mode)
            },
            ToolOutcome::Violation(v) => {
                self.conclude(v, Subject::Tool(call.name.to_owned()), request, mode)
            }
        }
    }

    /// Evaluates a tools/call for `tool` with `arguments`, as if the agent had
    /// sent it with request id `id`.
    pub fn evaluate_call(&self, id: &Value, tool: &str, arguments: &Value) -> Verdict {
        let params = serde_json::json!({"name": tool, "arguments": arguments});
        self.evaluate(&Request {
            id: Some(id),
            method: "tools/call",
            params: Some(&params),
        })
    }

    /// `resources/read` names what it reads: its URI gets the protected-path
    /// check tool arguments get (always enforced, as for tools).
    fn check_resource(&self, request: &Request<'_>, mode: Mode) -> Verdict {
        let Some(policy) = &self.policy else {
            return Verdict::allow(mode);
        };
        let Some(params) = request.params.and_then(Value::as_object) else {
            return Verdict::allow(mode);
        };
        match policy.protected.find(params) {
            None => Verdict::allow(mode),
            Some(hit) => {
                let reason = format!("Parameter '{}' refers to a protected path", hit.argument);
                let v = Violation::new(Cause::ProtectedPath, codes::PROTECTED_PATH, reason)
                    .arg(&hit.argument, hit.protected);
                self.conclude(v, Subject::Method(request.method.to_owned()), request, mode)
            }
        }
    }

    fn check_method(&self, method: &str) -> Option<Violation> {
        let gate = &self.methods;
        if gate.denied.contains(method) {
            return Some(
                Violation::new(
                    Cause::MethodDenied,
                    codes::METHOD_NOT_ALLOWED,
                    "Method is in denied_methods",
                )
                .rule("denied_methods"),
            );
        }
        if gate.allow_all || gate.allowed.contains(method) {
            return None;
        }
        Some(
            Violation::new(
                Cause::MethodNotAllowed,
                codes::METHOD_NOT_ALLOWED,
                "Method not in allowed_methods",
            )
            .rule("allowed_methods"),
        )
    }

    /// Applies the mode to a violation and builds the verdict.
    #[cold]
    fn conclude(
        &self,
        v: Violation,
        subject: Subject,
        request: &Request<'_>,
        mode: Mode,
    ) -> Verdict {
        let relaxed = mode == Mode::Monitor && v.cause.relaxed_by_monitor();
        let decision = match v.cause {
            _ if relaxed => Decision::Allow,
            Cause::RateLimited => Decision::RateLimited,
            _ => Decision::Block,
        };
        let tool = match &subject {
            Subject::Tool(t) => Some(t.clone()),
            Subject::Method(_) => None,
        };
        Verdict {
            decision,
            violation: true,
            mode,
            cause: Some(v.cause),
            detail: Some(Box::new(Detail {
                error: (!relaxed).then(|| RpcError::new(v.code, subject, v.reason.clone())),
                reason: Some(v.reason),
                failed_arg: v.failed_arg,
                failed_rule: v.failed_rule,
                tool,
                id: request.id.cloned(),
            })),
        }
    }
}

enum ToolOutcome {
    Allow,
    Ask,
    Violation(Violation),
}

/// The tool check of spec §3.2, in its order.
fn check_tool(policy: &CompiledPolicy, call: &ToolCall<'_>) -> ToolOutcome {
    let entry = lookup_tool(policy, call.name);
    let rule = entry.and_then(|e| e.rule.as_ref());
    let args = call.arguments.unwrap_or(&NO_ARGS);

    if let Some(limiter) = rule.and_then(|r| r.limiter.as_ref())
        && !limiter.try_acquire()
    {
        let limit = limiter.limit.to_string();
        return ToolOutcome::Violation(
            Violation::new(
                Cause::RateLimited,
                codes::RATE_LIMITED,
                format!("Rate limit of {limit} exceeded"),
            )
            .rule(format!("rate_limit: {limit}")),
        );
    }
    if let Some(hit) = (!policy.protected.is_empty())
        .then(|| policy.protected.find(args))
        .flatten()
    {
        let reason = format!("Argument '{}' refers to a protected path", hit.argument);
        return ToolOutcome::Violation(
            Violation::new(Cause::ProtectedPath, codes::PROTECTED_PATH, reason)
                .arg(&hit.argument, hit.protected),
        );
    }
    let strict = rule
        .and_then(|r| r.strict_args)
        .unwrap_or(policy.strict_args_default);
    match rule.map(|r| r.action) {
        Some(Action::Block) => {
            return ToolOutcome::Violation(
                Violation::new(
                    Cause::ToolBlocked,
                    codes::FORBIDDEN,
                    "Tool is blocked by policy",
                )
                .rule("action: block"),
            );
        }
        Some(Action::Ask) => {
            return match check_args(rule, args, strict) {
                Some(v) => ToolOutcome::Violation(v),
                None => ToolOutcome::Ask,
            };
        }
        Some(Action::Allow) | None => {}
    }
    let admitted =
        entry.is_some_and(|e| e.listed) || rule.is_some_and(|r| r.action == Action::Allow);
    if !admitted {
        return ToolOutcome::Violation(
            Violation::new(
                Cause::ToolNotAllowed,
                codes::FORBIDDEN,
                "Tool not in allowed_tools list",
            )
            .rule("allowed_tools"),
        );
    }
    match check_args(rule, args, strict) {
        Some(v) => ToolOutcome::Violation(v),
        None => ToolOutcome::Allow,
    }
}

/// How a tool appears in tools/list: the tool-level part of the decision,
/// before any arguments are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Callable (subject to argument checks).
    Listed,
    /// Callable after a person approves each call.
    Ask,
    /// Blocked by a rule or absent from allowed_tools.
    Hidden,
}

impl Evaluator {
    /// The tool-level decision for listing. Monitor mode lists what enforce
    /// mode would hide (its calls pass as violations); no policy hides all.
    pub fn listing(&self, tool: &str) -> Listing {
        let Some(policy) = &self.policy else {
            return Listing::Hidden;
        };
        let entry = lookup_tool(policy, tool);
        let rule = entry.and_then(|e| e.rule.as_ref());
        let listing = match rule.map(|r| r.action) {
            Some(Action::Ask) => return Listing::Ask,
            Some(Action::Block) => Listing::Hidden,
            Some(Action::Allow) => Listing::Listed,
            None if entry.is_some_and(|e| e.listed) => Listing::Listed,
            None => Listing::Hidden,
        };
        if listing == Listing::Hidden && policy.mode == Mode::Monitor {
            return Listing::Listed;
        }
        listing
    }
}

/// Finds a tool's entry by its normalized name. Every key is already normal
/// and normalization is idempotent, so a raw name that is a key is its own
/// normal form: only a miss has to be normalized and tried again.
fn lookup_tool<'p>(policy: &'p CompiledPolicy, name: &str) -> Option<&'p ToolEntry> {
    if let Some(entry) = policy.tools.get(name) {
        return Some(entry);
    }
    match normalize_name(name) {
        Cow::Owned(normal) => policy.tools.get(normal.as_str()),
        Cow::Borrowed(_) => None,
    }
}

/// allow_args (every listed argument present and matching), then strict_args
/// (no argument outside allow_args).
fn check_args(
    rule: Option<&CompiledRule>,
    args: &Map<String, Value>,
    strict: bool,
) -> Option<Violation> {
    let declared = rule.map_or(&[][..], |r| r.args.as_slice());
    for arg in declared {
        let Some(value) = args.get(&arg.name) else {
            return Some(
                Violation::new(
                    Cause::ArgumentMissing,
                    codes::FORBIDDEN,
                    format!("Required argument '{}' is missing", arg.name),
                )
                .arg(&arg.name, arg.regex.pattern().to_owned()),
            );
        };
        let message = match arg.regex.build() {
            Ok(regex) if regex.is_match(&arg_string(value)) => continue,
            Ok(_) => format!("Argument '{}' does not match allow_args", arg.name),
            // Fail closed: a pattern that validated but cannot be built.
            Err(e) => format!("Argument '{}' cannot be checked: {e}", arg.name),
        };
        return Some(
            Violation::new(Cause::ArgumentMismatch, codes::FORBIDDEN, message)
                .arg(&arg.name, arg.regex.pattern().to_owned()),
        );
    }
    if strict
        && let Some(extra) = args
            .keys()
            .find(|k| !declared.iter().any(|a| &a.name == *k))
    {
        return Some(
            Violation::new(
                Cause::UndeclaredArgument,
                codes::FORBIDDEN,
                format!("Argument '{extra}' is not declared in allow_args (strict_args)"),
            )
            .arg(extra, "strict_args"),
        );
    }
    None
}

/// The string an argument value is matched as (spec §3.3): strings as is,
/// numbers in plain decimal (no exponent, integral floats without `.0`, big
/// integers exact), booleans `true`/`false`, null as empty, arrays and objects
/// as compact JSON with keys in sorted order.
pub fn arg_string(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        Value::Number(n) => Cow::Owned(number_string(n)),
        Value::Bool(b) => Cow::Borrowed(if *b { "true" } else { "false" }),
        Value::Null => Cow::Borrowed(""),
        Value::Array(_) | Value::Object(_) => {
            let mut out = String::new();
            compact_sorted(value, &mut out);
            Cow::Owned(out)
        }
    }
}

fn number_string(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let text = n.to_string();
    let digits = text.strip_prefix('-').unwrap_or(&text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return text; // an exact big integer (arbitrary-precision builds)
    }
    // Rust's float Display is the shortest round-trip decimal, never with an
    // exponent: 1e21 -> "1000000000000000000000", 1.0 -> "1".
    n.as_f64().map_or(text, |f| format!("{f}"))
}

/// Compact JSON with object keys sorted, independent of how serde_json was
/// built (`preserve_order` would otherwise change what a regex sees).
fn compact_sorted(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                compact_sorted(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                compact_sorted(&map[k], out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

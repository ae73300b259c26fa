//! Document -> Evaluator: everything that can be decided once is decided here,
//! so that evaluating a call is lookups and precompiled matches only.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::dlp::Redactor;
use crate::document::{Action, AgentPolicy, FieldError, Mode, PolicyErrors};
use crate::hash;
use crate::normalize::normalize_name;
use crate::paths::ProtectedPaths;
use crate::ratelimit::{Limiter, RateClock, RateLimit};
use crate::regexes::LazyRegex;

/// The default `allowed_methods` of spec §3.1, plus `notifications/cancelled`:
/// AIP names the cancellation notification `cancelled`, but MCP sends it as
/// `notifications/cancelled`, and refusing it would stop agents from
/// cancelling their own calls. Plus MCP 2026-07-28's counterparts of what
/// the list already allows: `server/discover` is its `initialize`,
/// `subscriptions/listen` the only way to hear the list-change and
/// resource-update notifications the list allows, and the tasks
/// extension's `tasks/get`, `tasks/update` and `tasks/cancel`, through
/// which an agent follows its own calls (an approval the gateway answered
/// with a task).
pub const DEFAULT_ALLOWED_METHODS: &[&str] = &[
    "initialize",
    "initialized",
    "ping",
    "tools/call",
    "tools/list",
    "completion/complete",
    "notifications/initialized",
    "notifications/progress",
    "notifications/message",
    "notifications/resources/updated",
    "notifications/resources/list_changed",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "cancelled",
    "notifications/cancelled",
    "server/discover",
    "subscriptions/listen",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// Environment the policy is compiled for.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// What `~` in protected paths and arguments stands for.
    pub home: Option<String>,
    /// The policy file's own absolute path, always protected (spec §3.2).
    pub policy_path: Option<String>,
    /// Time source for rate limits.
    pub clock: RateClock,
}

/// A compiled policy, ready to evaluate messages. Immutable and `Send + Sync`
/// (rate-limit buckets are atomic); share it behind an `Arc` and replace it
/// whole when the policy changes.
#[derive(Debug)]
pub struct Evaluator {
    pub(crate) methods: MethodGate,
    pub(crate) policy: Option<CompiledPolicy>,
}

#[derive(Debug)]
pub(crate) struct CompiledPolicy {
    pub name: String,
    pub mode: Mode,
    pub hash: String,
    pub tools: FxHashMap<Box<str>, ToolEntry>,
    pub strict_args_default: bool,
    pub protected: ProtectedPaths,
    pub redactor: Option<Redactor>,
}

impl CompiledPolicy {
    fn arg_regexes(&self) -> impl Iterator<Item = &Arc<LazyRegex>> {
        self.tools
            .values()
            .filter_map(|entry| entry.rule.as_ref())
            .flat_map(|rule| rule.args.iter().map(|arg| &arg.regex))
    }
}

#[derive(Debug, Default)]
pub(crate) struct ToolEntry {
    /// Named in allowed_tools.
    pub listed: bool,
    pub rule: Option<CompiledRule>,
}

#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub action: Action,
    /// Shared with the next compilation when it keeps the same limit, so
    /// a reload does not refill the bucket.
    pub limiter: Option<Arc<Limiter>>,
    pub strict_args: Option<bool>,
    /// In argument-name order, so the first failure reported is stable.
    pub args: Vec<ArgRule>,
    pub schema_hash: Option<String>,
}

#[derive(Debug)]
pub(crate) struct ArgRule {
    pub name: String,
    /// Shared by every rule with the same pattern, and with the next
    /// compilation, so a reload builds only the patterns it has not seen.
    pub regex: Arc<LazyRegex>,
}

#[derive(Debug)]
pub(crate) struct MethodGate {
    /// The gate's answer for the exact string `tools/call`.
    pub tools_call_allowed: bool,
    pub allow_all: bool,
    pub allowed: FxHashSet<Box<str>>,
    pub denied: FxHashSet<Box<str>>,
}

impl MethodGate {
    fn new<'a>(
        allowed: Option<impl IntoIterator<Item = &'a str>>,
        denied: &[String],
    ) -> MethodGate {
        // An empty list means "not set", as in the AIP reference: a policy
        // that admitted no method at all could not even initialize.
        let mut allowed: FxHashSet<Box<str>> = allowed
            .map(|list| list.into_iter().map(normalized).collect())
            .unwrap_or_default();
        if allowed.is_empty() {
            allowed = DEFAULT_ALLOWED_METHODS
                .iter()
                .copied()
                .map(normalized)
                .collect();
        }
        let denied: FxHashSet<Box<str>> = denied.iter().map(|m| normalized(m)).collect();
        let allow_all = allowed.contains("*");
        MethodGate {
            tools_call_allowed: !denied.contains("tools/call")
                && (allow_all || allowed.contains("tools/call")),
            allow_all,
            allowed,
            denied,
        }
    }
}

fn normalized(name: &str) -> Box<str> {
    normalize_name(name).into()
}

impl Evaluator {
    /// The evaluator for "no policy loaded": the default method list applies,
    /// and every tool call is blocked (fail closed).
    pub fn deny_all() -> Evaluator {
        Evaluator {
            methods: MethodGate::new(None::<Vec<&str>>, &[]),
            policy: None,
        }
    }

    /// Compiles a validated policy that replaces `previous`: a tool whose
    /// rule keeps the same rate limit keeps its bucket, so a configuration
    /// push that leaves the rule alone does not hand out a fresh burst.
    pub fn compile_after(
        policy: &AgentPolicy,
        options: &CompileOptions,
        previous: &Evaluator,
    ) -> Result<Evaluator, PolicyErrors> {
        let mut next = Evaluator::compile(policy, options)?;
        let (Some(new), Some(old)) = (next.policy.as_mut(), previous.policy.as_ref()) else {
            return Ok(next);
        };
        let built: FxHashMap<&str, &Arc<LazyRegex>> = old
            .arg_regexes()
            .map(|regex| (regex.pattern(), regex))
            .collect();
        for arg in new
            .tools
            .values_mut()
            .filter_map(|e| e.rule.as_mut())
            .flat_map(|r| &mut r.args)
        {
            if let Some(kept) = built.get(arg.regex.pattern()) {
                arg.regex = Arc::clone(kept);
            }
        }
        for (tool, entry) in &mut new.tools {
            let Some(limiter) = entry.rule.as_mut().and_then(|r| r.limiter.as_mut()) else {
                continue;
            };
            let kept = old
                .tools
                .get(tool)
                .and_then(|e| e.rule.as_ref())
                .and_then(|r| r.limiter.as_ref())
                .filter(|l| l.limit == limiter.limit);
            if let Some(kept) = kept {
                *limiter = kept.clone();
            }
        }
        Ok(next)
    }

    /// Compiles a validated policy.
    pub fn compile(
        policy: &AgentPolicy,
        options: &CompileOptions,
    ) -> Result<Evaluator, PolicyErrors> {
        let spec = &policy.spec;
        let mut errors = Vec::new();
        let mut tools: FxHashMap<Box<str>, ToolEntry> = FxHashMap::default();
        let mut patterns: FxHashMap<&str, Arc<LazyRegex>> = FxHashMap::default();
        for name in spec.allowed_tools.iter().flatten() {
            tools.entry(normalized(name)).or_default().listed = true;
        }
        for (i, rule) in spec.tool_rules.iter().flatten().enumerate() {
            let path = format!("spec.tool_rules[{i}]");
            let limiter = match rule.rate_limit.as_deref().map(RateLimit::parse) {
                None => None,
                Some(Ok(limit)) => Some(Arc::new(Limiter::new(limit, options.clock.clone()))),
                Some(Err(e)) => {
                    errors.push(field(&format!("{path}.rate_limit"), e.to_string()));
                    None
                }
            };
            let mut args = Vec::new();
            for (name, pattern) in rule.allow_args.iter().flatten() {
                let regex = match patterns.get(pattern.as_str()) {
                    Some(regex) => Ok(Arc::clone(regex)),
                    // Checked by the policy's validation, as a rule is
                    // that came from a document; parsed here otherwise.
                    None => policy.checked.get(pattern).map_or_else(
                        || LazyRegex::new(pattern).map(Arc::new),
                        |checked| Ok(Arc::clone(checked)),
                    ),
                };
                match regex {
                    Ok(regex) => {
                        patterns.insert(pattern, Arc::clone(&regex));
                        args.push(ArgRule {
                            name: name.clone(),
                            regex,
                        });
                    }
                    Err(e) => errors.push(field(&format!("{path}.allow_args.{name}"), e)),
                }
            }
            tools.entry(normalized(&rule.tool)).or_default().rule = Some(CompiledRule {
                action: rule.action(),
                limiter,
                strict_args: rule.strict_args,
                args,
                schema_hash: rule.schema_hash.clone(),
            });
        }
        let redactor = match &spec.dlp {
            None => None,
            Some(dlp) => Redactor::new(dlp).unwrap_or_else(|e| {
                errors.push(field("spec.dlp.patterns", e));
                None
            }),
        };
        if !errors.is_empty() {
            return Err(PolicyErrors(errors));
        }
        let protected = spec
            .protected_paths
            .iter()
            .flatten()
            .map(String::as_str)
            .chain(options.policy_path.as_deref());
        Ok(Evaluator {
            methods: MethodGate::new(
                spec.allowed_methods
                    .as_ref()
                    .map(|l| l.iter().map(String::as_str)),
                spec.denied_methods.as_deref().unwrap_or_default(),
            ),
            policy: Some(CompiledPolicy {
                name: policy.metadata.name.clone(),
                mode: spec.mode(),
                hash: hash::policy_hash(policy),
                tools,
                strict_args_default: spec.strict_args_default.unwrap_or(false),
                protected: ProtectedPaths::new(protected, options.home.as_deref()),
                redactor,
            }),
        })
    }

    /// Parses, validates and compiles a YAML or JSON policy text.
    pub fn from_yaml(text: &str, options: &CompileOptions) -> Result<Evaluator, PolicyErrors> {
        Evaluator::compile(&AgentPolicy::from_yaml(text)?, options)
    }

    /// The policy's name, or None when no policy is loaded.
    pub fn policy_name(&self) -> Option<&str> {
        self.policy.as_ref().map(|p| p.name.as_str())
    }

    /// The policy hash (`sha256:<hex>`), or None when no policy is loaded.
    pub fn policy_hash(&self) -> Option<&str> {
        self.policy.as_ref().map(|p| p.hash.as_str())
    }

    /// Enforce or monitor; a missing policy counts as enforce.
    pub fn mode(&self) -> Mode {
        self.policy.as_ref().map_or(Mode::Enforce, |p| p.mode)
    }

    /// The DLP redactor, when the policy has an enabled DLP block.
    pub fn redactor(&self) -> Option<&Redactor> {
        self.policy.as_ref().and_then(|p| p.redactor.as_ref())
    }

    /// Builds every argument regex now, so that no call pays for one; run
    /// it off the hot path after a (re)load. Calls made meanwhile build what
    /// they need themselves.
    pub fn build_regexes(&self) {
        for regex in self.policy.iter().flat_map(CompiledPolicy::arg_regexes) {
            let _ = regex.build();
        }
    }

    /// The pinned `schema_hash` for a tool (v1alpha2), looked up by its
    /// normalized name.
    pub fn schema_hash(&self, tool: &str) -> Option<&str> {
        let p = self.policy.as_ref()?;
        let entry = p.tools.get(normalize_name(tool).as_ref())?;
        entry.rule.as_ref()?.schema_hash.as_deref()
    }
}

fn field(path: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.to_owned(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{CompileOptions, Evaluator};

    #[test]
    fn evaluator_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Evaluator>();
    }

    fn policy(second: &str) -> String {
        format!(
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {{name: p}}\nspec:\n  tool_rules:\n    - tool: a\n      allow_args: {{x: '^[a-z]+$', y: '^[a-z]+$'}}\n    - tool: b\n      allow_args: {{z: '{second}'}}\n"
        )
    }

    fn regexes(e: &Evaluator) -> Vec<(String, usize)> {
        let mut all: Vec<_> = e
            .policy
            .iter()
            .flat_map(|p| p.arg_regexes())
            .map(|r| (r.pattern().to_owned(), Arc::as_ptr(r) as usize))
            .collect();
        all.sort();
        all
    }

    /// One pattern is built once: shared by the rules that name it, and by
    /// the next compilation that keeps it.
    #[test]
    fn a_pattern_is_built_once_across_rules_and_reloads() {
        let options = CompileOptions::default();
        let first = Evaluator::from_yaml(&policy("^[0-9]+$"), &options).unwrap();
        let mine = regexes(&first);
        assert_eq!(mine[1].1, mine[2].1, "{mine:?}");
        first.build_regexes();
        let doc = crate::AgentPolicy::from_yaml(&policy("^[0-7]+$")).unwrap();
        let next = Evaluator::compile_after(&doc, &options, &first).unwrap();
        let theirs = regexes(&next);
        assert_eq!(theirs[1].1, mine[1].1, "the kept pattern is the same regex");
        assert_ne!(theirs[0].1, mine[0].1, "the changed pattern is new");
    }

    /// A pattern is parsed once: the compiler takes what validation
    /// checked; a policy built without validation still compiles, each of
    /// its patterns checked then.
    #[test]
    fn the_compiler_takes_the_regexes_validation_checked() {
        let options = CompileOptions::default();
        let doc = crate::AgentPolicy::from_yaml(&policy("^[0-9]+$")).unwrap();
        let compiled = Evaluator::compile(&doc, &options).unwrap();
        for (pattern, at) in regexes(&compiled) {
            let checked = doc.checked.get(&pattern).expect("validation checked it");
            assert_eq!(Arc::as_ptr(checked) as usize, at, "{pattern}");
        }
        let mut unchecked = doc.clone();
        unchecked.checked = Default::default();
        let compiled = Evaluator::compile(&unchecked, &options).unwrap();
        assert_eq!(regexes(&compiled).len(), 3);
        let rules = unchecked.spec.tool_rules.as_mut().unwrap();
        let args = rules[1].allow_args.as_mut().unwrap();
        args.insert("z".into(), "(unclosed".into());
        let Err(refused) = Evaluator::compile(&unchecked, &options) else {
            panic!("a bad regex compiled");
        };
        assert!(refused.to_string().contains("allow_args.z"), "{refused}");
    }
}

//! The FaultServer document: what each tool answers, step by step. Parsing
//! refuses unknown keys; validation refuses every rule the reference page
//! lists. Either way the error names the field path, and a document with any
//! error never starts a server.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::era::Eras;

pub const API_VERSION: &str = "aip.io/v1alpha1";
pub const KIND: &str = "FaultServer";
pub const MAX_STEPS: usize = 100;
pub const MAX_DELAY_MS: u64 = 300_000;
pub const MAX_PENDING: u32 = 64;
/// Largest `oversize` payload a script may ask for.
pub const MAX_OVERSIZE_BYTES: usize = 64 * 1024 * 1024;
/// Longest freshness (`spec.caching.ttlMs`) a script may declare: a day.
pub const MAX_TTL_MS: u64 = 86_400_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Document {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    #[serde(default = "default_max_pending")]
    pub max_pending: u32,
    #[serde(default)]
    pub on_exhausted: OnExhausted,
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub require_bearer: Option<RequireBearer>,
    /// Requests must carry an access token (a JWT) this issuer signed for
    /// this audience, checked against the issuer's keys (JWKS).
    #[serde(default)]
    pub require_jwt: Option<RequireJwt>,
    /// Lists (tools, resources, prompts) are served this many items a page.
    #[serde(default)]
    pub page_size: Option<usize>,
    /// Static text resources, served by resources/list and resources/read.
    #[serde(default)]
    pub resources: Vec<Resource>,
    /// Static prompts of one user message, served by prompts/list and
    /// prompts/get.
    #[serde(default)]
    pub prompts: Vec<Prompt>,
    /// Which eras of MCP the server answers; `--era` overrides it.
    #[serde(default)]
    pub era: Option<Eras>,
    /// The cache hints on modern cacheable results.
    #[serde(default)]
    pub caching: Option<Caching>,
    /// What successive tools/list requests (a gateway's health checks) get.
    #[serde(default)]
    pub tools_list: Option<ToolsList>,
}

/// Scripted answers to tools/list, one step per request in either era;
/// past the last step every tools/list answers the listing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsList {
    pub sequence: Vec<ListStep>,
}

/// One scripted answer to tools/list. Exactly one outcome key is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListStep {
    /// Answer with the listing itself.
    #[serde(default)]
    pub list: Option<bool>,
    #[serde(default)]
    pub jsonrpc_error: Option<JsonRpcErrorStep>,
    #[serde(default)]
    pub http: Option<HttpStep>,
    #[serde(default)]
    pub drop: Option<bool>,
    #[serde(default)]
    pub stall_body: Option<StallBody>,
    #[serde(default)]
    pub raw_body: Option<String>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// `ttlMs` and `cacheScope` of modern cacheable results (server/discover,
/// the lists, resources/read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Caching {
    #[serde(default)]
    pub ttl_ms: u64,
    #[serde(default)]
    pub cache_scope: CacheScope,
}

impl Default for Caching {
    fn default() -> Caching {
        Caching {
            ttl_ms: 0,
            cache_scope: CacheScope::Private,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Public,
    #[default]
    Private,
}

impl CacheScope {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScope::Public => "public",
            CacheScope::Private => "private",
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    pub uri: String,
    pub name: String,
    pub text: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub text: String,
}

fn default_max_pending() -> u32 {
    MAX_PENDING
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    #[default]
    ToolError,
    JsonrpcError,
    Close,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequireBearer {
    pub sha256: String,
}

/// An OAuth resource server's check of its access tokens: signature by a
/// key of `jwksUrl`, `iss`, `aud` containing `audience`, `exp`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequireJwt {
    pub issuer: String,
    pub audience: String,
    pub jwks_url: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default = "object_schema")]
    pub input_schema: Value,
    pub responses: Vec<Response>,
    /// The "rug pull": once the tool has been called `afterCalls` times,
    /// `tools/list` describes it with `description` instead.
    #[serde(default)]
    pub rug_pull: Option<RugPull>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RugPull {
    pub after_calls: u32,
    pub description: String,
}

fn object_schema() -> Value {
    serde_json::json!({"type": "object"})
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Response {
    #[serde(default, rename = "match")]
    pub match_exact: Option<Value>,
    #[serde(default)]
    pub match_regex: Option<BTreeMap<String, String>>,
    pub sequence: Vec<Step>,
    /// Once the last step is played, start again from the first (a
    /// server that answers every run of an example), instead of failing
    /// as `onExhausted` says.
    #[serde(default)]
    pub repeat: bool,
}

/// One scripted answer. Exactly one outcome key is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Any JSON value, null included (`return: null` is a tool that returns
    /// null): present-but-null is kept apart from absent.
    #[serde(default, rename = "return", deserialize_with = "present")]
    pub return_value: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub jsonrpc_error: Option<JsonRpcErrorStep>,
    #[serde(default)]
    pub http: Option<HttpStep>,
    #[serde(default)]
    pub drop: Option<bool>,
    #[serde(default)]
    pub stall_body: Option<StallBody>,
    #[serde(default)]
    pub raw_body: Option<String>,
    #[serde(default)]
    pub oversize: Option<Oversize>,
    #[serde(default)]
    pub sse_close_after_event: Option<SseCloseAfterEvent>,
    /// 2026-07-28: ask the client for input (a multi-round-trip result).
    #[serde(default)]
    pub input_required: Option<InputRequiredStep>,
    /// 2026-07-28: the step is played only to a retry carrying exactly this
    /// `requestState` and these `inputResponses`.
    #[serde(default)]
    pub expect_retry: Option<ExpectRetry>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// An `input_required` result: the requests the client must answer and
/// the opaque state it must echo (at least one of the two).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InputRequiredStep {
    #[serde(default)]
    pub input_requests: Option<BTreeMap<String, InputRequest>>,
    #[serde(default)]
    pub request_state: Option<String>,
}

/// One request inside an `input_required` result.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

/// The methods an `input_required` result may ask the client to answer.
pub const INPUT_METHODS: &[&str] = &["elicitation/create", "sampling/createMessage", "roots/list"];

/// What the retry of an `input_required` call must carry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpectRetry {
    /// Echoed exactly; absent means the retry must carry none.
    #[serde(default)]
    pub request_state: Option<String>,
    /// Each named response must be present and equal (numbers by value);
    /// others the retry carries are ignored.
    #[serde(default)]
    pub input_responses: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRpcErrorStep {
    pub code: i64,
    pub message: String,
    #[serde(default)]
    pub data: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpStep {
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallBody {
    pub after_bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oversize {
    pub bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SseCloseAfterEvent {
    pub retry_ms: u64,
}

/// What a step does, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// tools/list only: the listing itself.
    List,
    Return(Value),
    Error(String),
    JsonRpcError {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    Http {
        status: u16,
        headers: BTreeMap<String, String>,
        body: Option<String>,
    },
    Drop,
    StallBody(usize),
    RawBody(String),
    Oversize(usize),
    SseCloseAfterEvent {
        retry_ms: u64,
    },
    /// `resultType: input_required` with these requests (an object of
    /// `{method, params?}` by key) and this state.
    InputRequired {
        input_requests: Option<Value>,
        request_state: Option<String>,
    },
}

impl Outcome {
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::List => "list",
            Outcome::Return(_) => "return",
            Outcome::Error(_) => "error",
            Outcome::JsonRpcError { .. } => "jsonrpc_error",
            Outcome::Http { .. } => "http",
            Outcome::Drop => "drop",
            Outcome::StallBody(_) => "stall_body",
            Outcome::RawBody(_) => "raw_body",
            Outcome::Oversize(_) => "oversize",
            Outcome::SseCloseAfterEvent { .. } => "sse_close_after_event",
            Outcome::InputRequired { .. } => "input_required",
        }
    }

    /// Step kinds that only mean something on the HTTP transport.
    pub fn http_only(&self) -> bool {
        matches!(
            self,
            Outcome::Http { .. } | Outcome::SseCloseAfterEvent { .. }
        )
    }
}

/// The transport a script will be played on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http,
}

/// A validated script, ready to play.
#[derive(Debug)]
pub struct Script {
    pub name: String,
    pub max_pending: usize,
    pub on_exhausted: OnExhausted,
    /// Sorted by name.
    pub tools: Vec<ScriptTool>,
    /// Lowercase hex SHA-256 of the bearer token required, if any.
    pub require_bearer: Option<String>,
    pub require_jwt: Option<RequireJwt>,
    /// Items per list page; None serves every list whole.
    pub page_size: Option<usize>,
    pub resources: Vec<Resource>,
    pub prompts: Vec<Prompt>,
    /// Which eras are answered (document default: both).
    pub era: Eras,
    pub caching: Caching,
    /// Scripted tools/list answers, in order (empty: always the listing).
    pub tools_list: Vec<ScriptStep>,
}

#[derive(Debug)]
pub struct ScriptTool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    pub responses: Vec<ScriptResponse>,
    pub rug_pull: Option<RugPull>,
}

#[derive(Debug)]
pub struct ScriptResponse {
    pub matcher: Matcher,
    pub steps: Vec<ScriptStep>,
    /// After the last step, the first again.
    pub repeat: bool,
}

#[derive(Debug)]
pub enum Matcher {
    Any,
    Exact(Value),
    Regex(Vec<(String, Regex)>),
}

impl Matcher {
    pub fn matches(&self, arguments: &Value) -> bool {
        match self {
            Matcher::Any => true,
            // Compared as the attempt log hashes them (RFC 8785 canonical
            // JSON): 2 and 2.0 are one number, as they are to JSON.
            Matcher::Exact(expected) => {
                expected == arguments || crate::log::canonical_eq(expected, arguments)
            }
            Matcher::Regex(fields) => fields.iter().all(|(field, re)| {
                arguments
                    .get(field)
                    .is_some_and(|v| re.is_match(&field_text(v)))
            }),
        }
    }
}

/// A field's text for matchRegex: strings as they are, anything else as
/// compact JSON.
fn field_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone)]
pub struct ScriptStep {
    pub outcome: Outcome,
    pub delay_ms: u64,
    /// Played only to a retry that carries what this names.
    pub expect_retry: Option<ExpectRetry>,
}

/// An invalid document: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ScriptError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

pub(crate) fn fail<T>(
    path: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, ScriptError> {
    Err(ScriptError {
        path: path.into(),
        message: message.into(),
    })
}

impl Script {
    /// Parses and validates a YAML (or JSON) document for `transport`.
    pub fn from_yaml(text: &str, transport: Transport) -> Result<Script, ScriptError> {
        Script::validate(deserialize_document(&parse_yaml(text)?)?, transport)
    }

    fn validate(doc: Document, transport: Transport) -> Result<Script, ScriptError> {
        if doc.api_version != API_VERSION {
            return fail(
                "apiVersion",
                format!("must be {API_VERSION:?}, found {:?}", doc.api_version),
            );
        }
        if doc.kind != KIND {
            return fail("kind", format!("must be {KIND:?}, found {:?}", doc.kind));
        }
        if doc.metadata.name.trim().is_empty() {
            return fail("metadata.name", "must not be empty");
        }
        let spec = doc.spec;
        if !(1..=MAX_PENDING).contains(&spec.max_pending) {
            return fail(
                "spec.maxPending",
                format!("must be 1..{MAX_PENDING}, found {}", spec.max_pending),
            );
        }
        if spec.tools.is_empty() {
            return fail("spec.tools", "at least one tool is required");
        }
        let require_bearer = match spec.require_bearer {
            None => None,
            Some(b) => {
                let ok = b.sha256.len() == 64 && b.sha256.bytes().all(|c| c.is_ascii_hexdigit());
                if !ok {
                    return fail(
                        "spec.requireBearer.sha256",
                        "must be 64 hex digits (the SHA-256 of the token)",
                    );
                }
                Some(b.sha256.to_ascii_lowercase())
            }
        };
        if let Some(jwt) = &spec.require_jwt {
            if require_bearer.is_some() {
                return fail(
                    "spec.requireJwt",
                    "give requireBearer or requireJwt, not both",
                );
            }
            for (field, value) in [("issuer", &jwt.issuer), ("jwksUrl", &jwt.jwks_url)] {
                if !value.starts_with("http://") && !value.starts_with("https://") {
                    return fail(
                        format!("spec.requireJwt.{field}"),
                        "must be an http:// or https:// URL",
                    );
                }
            }
            if jwt.audience.is_empty() {
                return fail("spec.requireJwt.audience", "must not be empty");
            }
        }
        let mut names = BTreeSet::new();
        let mut tools = Vec::with_capacity(spec.tools.len());
        for (i, tool) in spec.tools.into_iter().enumerate() {
            let path = format!("spec.tools[{i}]");
            if tool.name.trim().is_empty() {
                return fail(format!("{path}.name"), "must not be empty");
            }
            if !names.insert(tool.name.clone()) {
                return fail(
                    format!("{path}.name"),
                    format!("duplicate tool name {:?}", tool.name),
                );
            }
            tools.push(validate_tool(tool, &path, transport)?);
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        if spec.page_size == Some(0) {
            return fail("spec.pageSize", "must be at least 1");
        }
        let uris: BTreeSet<&str> = spec.resources.iter().map(|r| r.uri.as_str()).collect();
        if uris.len() != spec.resources.len() {
            return fail("spec.resources", "URIs must be unique");
        }
        let prompts: BTreeSet<&str> = spec.prompts.iter().map(|p| p.name.as_str()).collect();
        if prompts.len() != spec.prompts.len() {
            return fail("spec.prompts", "names must be unique");
        }
        let caching = spec.caching.unwrap_or_default();
        if caching.ttl_ms > MAX_TTL_MS {
            return fail(
                "spec.caching.ttlMs",
                format!("must be 0..{MAX_TTL_MS}, found {}", caching.ttl_ms),
            );
        }
        let tools_list = match spec.tools_list {
            None => Vec::new(),
            Some(list) => validate_list(list, transport)?,
        };
        Ok(Script {
            name: doc.metadata.name,
            max_pending: spec.max_pending as usize,
            on_exhausted: spec.on_exhausted,
            tools,
            require_bearer,
            require_jwt: spec.require_jwt,
            page_size: spec.page_size,
            resources: spec.resources,
            prompts: spec.prompts,
            era: spec.era.unwrap_or_default(),
            caching,
            tools_list,
        })
    }

    pub fn tool(&self, name: &str) -> Option<(usize, &ScriptTool)> {
        self.tools
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| (i, &self.tools[i]))
    }
}

/// A YAML (or JSON) document as a JSON value; booleans are only
/// `true`/`false`, so `yes` and `on` stay strings.
pub(crate) fn parse_yaml(text: &str) -> Result<Value, ScriptError> {
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| ScriptError {
        path: String::new(),
        message: format!("invalid YAML: {e}"),
    })
}

/// The document's `kind`, when it has a string one: which validator applies.
pub fn document_kind(text: &str) -> Option<String> {
    let value = parse_yaml(text).ok()?;
    value.get("kind")?.as_str().map(str::to_owned)
}

/// Deserializes a parsed document, naming the path of the first field that
/// does not fit (unknown keys included).
pub(crate) fn deserialize_document<T: serde::de::DeserializeOwned>(
    value: &Value,
) -> Result<T, ScriptError> {
    serde_path_to_error::deserialize(value).map_err(|e| ScriptError {
        path: e.path().to_string().trim_start_matches('.').to_owned(),
        message: e.into_inner().to_string(),
    })
}

/// A matcher's regex, bounded in size; the error names `path`.
pub(crate) fn compile_regex(pattern: &str, path: &str) -> Result<Regex, ScriptError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .or_else(|e| {
            let message = format!("bad regex: {}", e.to_string().replace('\n', " "));
            fail(path, message)
        })
}

fn validate_tool(tool: Tool, path: &str, transport: Transport) -> Result<ScriptTool, ScriptError> {
    if tool.responses.is_empty() {
        return fail(
            format!("{path}.responses"),
            "at least one response is required",
        );
    }
    let mut responses = Vec::with_capacity(tool.responses.len());
    for (r, response) in tool.responses.into_iter().enumerate() {
        let path = format!("{path}.responses[{r}]");
        let matcher = match (response.match_exact, response.match_regex) {
            (Some(_), Some(_)) => return fail(&path, "give either match or matchRegex, not both"),
            (Some(exact), None) => Matcher::Exact(exact),
            (None, Some(fields)) => Matcher::Regex(compile_fields(fields, &path)?),
            (None, None) => Matcher::Any,
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
            .map(|(s, step)| validate_step(step, &format!("{steps_path}[{s}]"), transport))
            .collect::<Result<Vec<_>, _>>()?;
        responses.push(ScriptResponse {
            matcher,
            steps,
            repeat: response.repeat,
        });
    }
    if let Some(rug) = &tool.rug_pull {
        if rug.after_calls == 0 {
            return fail(
                format!("{path}.rugPull.afterCalls"),
                "must be at least 1 (a tool described one way from the start needs no rug pull)",
            );
        }
        if rug.description.is_empty() {
            return fail(format!("{path}.rugPull.description"), "must not be empty");
        }
    }
    Ok(ScriptTool {
        name: tool.name,
        description: tool.description,
        input_schema: tool.input_schema,
        responses,
        rug_pull: tool.rug_pull,
    })
}

fn compile_fields(
    fields: BTreeMap<String, String>,
    path: &str,
) -> Result<Vec<(String, Regex)>, ScriptError> {
    if fields.is_empty() {
        return fail(format!("{path}.matchRegex"), "must name at least one field");
    }
    fields
        .into_iter()
        .map(|(field, pattern)| {
            let re = compile_regex(&pattern, &format!("{path}.matchRegex.{field}"))?;
            Ok((field, re))
        })
        .collect()
}

fn validate_step(step: Step, path: &str, transport: Transport) -> Result<ScriptStep, ScriptError> {
    let delay_ms = step.delay_ms.unwrap_or(0);
    if delay_ms > MAX_DELAY_MS {
        return fail(
            format!("{path}.delay_ms"),
            format!("must be 0..{MAX_DELAY_MS}, found {delay_ms}"),
        );
    }
    let mut outcomes: Vec<(&str, Outcome)> = Vec::new();
    if let Some(v) = step.return_value {
        outcomes.push(("return", Outcome::Return(v)));
    }
    if let Some(e) = step.error {
        if e.trim().is_empty() {
            return fail(format!("{path}.error"), "must not be empty");
        }
        outcomes.push(("error", Outcome::Error(e)));
    }
    if let Some(e) = step.jsonrpc_error {
        if e.message.trim().is_empty() {
            return fail(format!("{path}.jsonrpc_error.message"), "must not be empty");
        }
        outcomes.push((
            "jsonrpc_error",
            Outcome::JsonRpcError {
                code: e.code,
                message: e.message,
                data: e.data,
            },
        ));
    }
    if let Some(h) = step.http {
        if !(100..=599).contains(&h.status) {
            return fail(
                format!("{path}.http.status"),
                format!("must be 100..599, found {}", h.status),
            );
        }
        outcomes.push((
            "http",
            Outcome::Http {
                status: h.status,
                headers: h.headers,
                body: h.body,
            },
        ));
    }
    if let Some(d) = step.drop {
        if !d {
            return fail(format!("{path}.drop"), "must be true (omit it otherwise)");
        }
        outcomes.push(("drop", Outcome::Drop));
    }
    if let Some(s) = step.stall_body {
        outcomes.push(("stall_body", Outcome::StallBody(s.after_bytes)));
    }
    if let Some(r) = step.raw_body {
        outcomes.push(("raw_body", Outcome::RawBody(r)));
    }
    if let Some(o) = step.oversize {
        if o.bytes == 0 || o.bytes > MAX_OVERSIZE_BYTES {
            return fail(
                format!("{path}.oversize.bytes"),
                format!("must be 1..{MAX_OVERSIZE_BYTES}, found {}", o.bytes),
            );
        }
        outcomes.push(("oversize", Outcome::Oversize(o.bytes)));
    }
    if let Some(s) = step.sse_close_after_event {
        outcomes.push((
            "sse_close_after_event",
            Outcome::SseCloseAfterEvent {
                retry_ms: s.retry_ms,
            },
        ));
    }
    if let Some(i) = step.input_required {
        let outcome = validate_input_required(i, &format!("{path}.input_required"))?;
        outcomes.push(("input_required", outcome));
    }
    let outcome = match outcomes.len() {
        0 => {
            return fail(
                path,
                "a step needs exactly one outcome (return, error, jsonrpc_error, http, drop, stall_body, raw_body, oversize, sse_close_after_event, input_required)",
            );
        }
        1 => outcomes.remove(0),
        _ => {
            let keys: Vec<&str> = outcomes.iter().map(|(k, _)| *k).collect();
            return fail(
                path,
                format!(
                    "a step has exactly one outcome, found {}",
                    keys.join(" and ")
                ),
            );
        }
    };
    if transport == Transport::Stdio && outcome.1.http_only() {
        return fail(
            format!("{path}.{}", outcome.0),
            "only the HTTP transport can play this step",
        );
    }
    if let Some(expect) = &step.expect_retry
        && expect.request_state.as_deref().is_some_and(str::is_empty)
    {
        return fail(
            format!("{path}.expect_retry.requestState"),
            "must not be empty (omit it to expect no requestState)",
        );
    }
    Ok(ScriptStep {
        outcome: outcome.1,
        delay_ms,
        expect_retry: step.expect_retry,
    })
}

fn validate_input_required(step: InputRequiredStep, path: &str) -> Result<Outcome, ScriptError> {
    if step.input_requests.as_ref().is_none_or(BTreeMap::is_empty) && step.request_state.is_none() {
        return fail(
            path,
            "needs inputRequests (at least one), requestState, or both",
        );
    }
    if step.request_state.as_deref().is_some_and(str::is_empty) {
        return fail(format!("{path}.requestState"), "must not be empty");
    }
    let mut requests = serde_json::Map::new();
    for (key, request) in step.input_requests.into_iter().flatten() {
        let at = format!("{path}.inputRequests.{key}");
        if !INPUT_METHODS.contains(&request.method.as_str()) {
            return fail(
                format!("{at}.method"),
                format!(
                    "must be {}, found {:?}",
                    INPUT_METHODS.join(", "),
                    request.method
                ),
            );
        }
        let mut wire = serde_json::json!({"method": request.method});
        match request.params {
            None => {}
            Some(params @ Value::Object(_)) => wire["params"] = params,
            Some(_) => return fail(format!("{at}.params"), "must be an object"),
        }
        requests.insert(key, wire);
    }
    Ok(Outcome::InputRequired {
        input_requests: (!requests.is_empty()).then_some(Value::Object(requests)),
        request_state: step.request_state,
    })
}

fn validate_list(list: ToolsList, transport: Transport) -> Result<Vec<ScriptStep>, ScriptError> {
    let path = "spec.toolsList.sequence";
    if list.sequence.is_empty() || list.sequence.len() > MAX_STEPS {
        return fail(
            path,
            format!(
                "must have 1..{MAX_STEPS} steps, found {}",
                list.sequence.len()
            ),
        );
    }
    (list.sequence.into_iter().enumerate())
        .map(|(s, step)| validate_list_step(step, &format!("{path}[{s}]"), transport))
        .collect()
}

/// A tools/list step: `list: true` or one of the failure outcomes a tool
/// step has, validated as a tool step's are.
fn validate_list_step(
    step: ListStep,
    path: &str,
    transport: Transport,
) -> Result<ScriptStep, ScriptError> {
    let keys: Vec<&str> = [
        ("list", step.list.is_some()),
        ("jsonrpc_error", step.jsonrpc_error.is_some()),
        ("http", step.http.is_some()),
        ("drop", step.drop.is_some()),
        ("stall_body", step.stall_body.is_some()),
        ("raw_body", step.raw_body.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    match keys.as_slice() {
        [] => fail(
            path,
            "a step needs exactly one outcome (list, jsonrpc_error, http, drop, stall_body, raw_body)",
        ),
        ["list"] => {
            if step.list == Some(false) {
                return fail(format!("{path}.list"), "must be true (omit it otherwise)");
            }
            let delay_ms = step.delay_ms.unwrap_or(0);
            if delay_ms > MAX_DELAY_MS {
                return fail(
                    format!("{path}.delay_ms"),
                    format!("must be 0..{MAX_DELAY_MS}, found {delay_ms}"),
                );
            }
            Ok(ScriptStep {
                outcome: Outcome::List,
                delay_ms,
                expect_retry: None,
            })
        }
        [_] => {
            let failure = Step {
                jsonrpc_error: step.jsonrpc_error,
                http: step.http,
                drop: step.drop,
                stall_body: step.stall_body,
                raw_body: step.raw_body,
                delay_ms: step.delay_ms,
                ..Step::default()
            };
            validate_step(failure, path, transport)
        }
        _ => fail(
            path,
            format!(
                "a step has exactly one outcome, found {}",
                keys.join(" and ")
            ),
        ),
    }
}

/// Some(Value::Null) for an explicit null, None (via `default`) when absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

//! AgentPolicy: the AIP policy spec verbatim (snake_case, as AIP files write
//! it) plus the Kubernetes binding fields (camelCase, as Kubernetes writes
//! them): which pods it governs, which ToolConnections it grants, and how
//! approvals work. The schema here catches shape mistakes at apply time; the
//! admission webhook and the controller run aip-policy's full validation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A policy for AI agents' MCP tool calls, enforced by the aip sidecar in
/// every pod it selects.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "aip.io",
    version = "v1alpha1",
    kind = "AgentPolicy",
    doc = "An AIP AgentPolicy bound to pods: which MCP tools the agents in them may call, and how.",
    plural = "agentpolicies",
    shortname = "agp",
    category = "aip",
    namespaced,
    status = "AgentPolicyStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.mode","description":"enforce or monitor"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Synced","type":"string","jsonPath":".status.synced","description":"governed sidecars running the current policy hash"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct AgentPolicySpec {
    /// enforce (the default) blocks what the policy forbids; monitor only
    /// records what would have been blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,

    /// Tool names the agent may call (matched after NFKC normalization and
    /// case folding). Absent: every tool not blocked by a rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,

    /// MCP methods the agent may use; absent: the AIP default set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_methods: Option<Vec<String>>,

    /// MCP methods that are always refused, even if allowed above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_methods: Option<Vec<String>>,

    /// Paths no tool argument may name (files, directories, globs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_paths: Option<Vec<String>>,

    /// Whether a rule's allow_args refuses arguments it does not list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_args_default: Option<bool>,

    /// Per-tool rules: action, rate limit, argument patterns, schema pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_rules: Option<Vec<ToolRule>>,

    /// Data-loss prevention: patterns redacted from responses and refused in
    /// requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlp: Option<Dlp>,

    /// The pods this policy governs, in its own namespace. Absent or empty
    /// ({}): every pod of the namespace that runs the aip sidecar. A pod
    /// selected by two policies gets neither (every tool call is refused).
    #[serde(
        default,
        rename = "podSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_selector: Option<LabelSelector>,

    /// Names of the ToolConnections (in this namespace) whose tools the
    /// governed agents may reach.
    #[serde(
        default,
        rename = "toolConnections",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_connections: Vec<String>,

    /// How calls held by an `ask` rule are decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalSettings>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Enforce,
    Monitor,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Block,
    Ask,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ToolRule {
    /// The tool this rule applies to (matched like allowed_tools).
    pub tool: String,
    /// allow (the default), block, or ask a human first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Calls allowed per period, e.g. "10/minute".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Refuse arguments that allow_args does not list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_args: Option<bool>,
    /// Argument name to an RE2 pattern its value must match in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_args: Option<BTreeMap<String, String>>,
    /// sha256:... of the tool's input schema; calls are refused if the
    /// server's schema changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_hash: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Dlp {
    /// A present dlp block is on unless this is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Also look inside base64, hex and URL-encoded text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detect_encoding: Option<bool>,
    /// Also redact a stdio server's stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_stderr: Option<bool>,
    /// What to look for: each a name and an RE2 pattern.
    pub patterns: Vec<DlpPattern>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct DlpPattern {
    /// Shown in place of the match: [REDACTED:name].
    pub name: String,
    /// An RE2 regular expression.
    pub regex: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalSettings {
    /// How long a held call waits for a decision before it is answered as
    /// expired (seconds; default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<u32>,
    /// Service accounts of the pod's own namespace that may nevertheless
    /// decide (by name). Others of that namespace never may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_service_accounts: Vec<String>,
}

/// What the operator last concluded about this policy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPolicyStatus {
    /// Accepted (the policy validates), Ready (every governed pod runs it)
    /// and Conflict (a pod is also selected by another policy). Keyed by
    /// type: other controllers may add conditions of their own, which the
    /// operator's status writes leave alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// sha256:... of the accepted policy, as `aip policy hash` prints it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    /// The mode in force: enforce or monitor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Pods this policy governs.
    #[serde(default)]
    pub governed_pods: u32,
    /// Governed pods whose sidecar acknowledged the current policy hash.
    #[serde(default)]
    pub synced_pods: u32,
    /// Governed pods whose gateway runs behind a proven egress lock (their
    /// namespace has an EgressLock, and the pod's lock check passed).
    #[serde(default)]
    pub locked_pods: u32,
    /// synced/governed, e.g. "12/12".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced: Option<String>,
    /// Governed pods running without the aip-sidecar gateway (not injected,
    /// and no sidecar of theirs ever connected): their tool calls are not
    /// governed. The first 20 by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods_without_sidecar: Vec<String>,
}

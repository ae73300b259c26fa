//! ToolConnection: a remote MCP server the governed agents may reach, with
//! credentials from Secrets of its own namespace. Shaped like the sidecar's
//! standalone ToolConnection documents, with Secrets where those read
//! environment variables and files.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const DEFAULT_TIMEOUT_SECONDS: u32 = 10;
pub const MAX_TIMEOUT_SECONDS: u32 = 60;
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1_000_000;
pub const DEFAULT_HEALTH_INTERVAL_SECONDS: u32 = 30;
pub const DEFAULT_HEALTH_TIMEOUT_SECONDS: u32 = 5;

/// A remote MCP server (Streamable HTTP) and how to reach it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "aip.io",
    version = "v1alpha1",
    kind = "ToolConnection",
    doc = "A remote MCP server that governed agents may reach through their aip sidecar.",
    plural = "toolconnections",
    shortname = "tconn",
    category = "aip",
    namespaced,
    status = "ToolConnectionStatus",
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.url"}"#,
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health.state"}"#,
    printcolumn = r#"{"name":"Tools","type":"integer","jsonPath":".status.toolCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.tls) || self.url.startsWith('https://')", "message": "tls applies to https:// URLs only"},
    {"rule": "!has(self.toolTrust) || self.toolTrust != 'Listed' || !has(self.toolPins) || size(self.toolPins) == 0", "message": "toolTrust Listed serves every tool as listed, so toolPins would be ignored: remove one of them"},
    {"rule": "!has(self.toolTrust) || self.toolTrust != 'FirstUse' || !has(self.toolPins) || size(self.toolPins) == 0", "message": "toolTrust FirstUse pins what the server first lists and keeps the pins in status, so toolPins would compete with them: remove one of them"},
    {"rule": "!has(self.auth) || !has(self.bearerToken)", "message": "auth puts its access token in the Authorization header, which bearerToken sets too: remove one of them"}
]))]
pub struct ToolConnectionSpec {
    /// The server's MCP endpoint (http:// or https://). Redirects are never
    /// followed.
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,

    /// Headers sent with every request, values from Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderSpec>,

    /// Shortcut for an `Authorization: Bearer <token>` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<ValueSpec>,

    /// How to verify an https:// server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Per-call timeout in seconds (default 10, at most 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<u32>,

    /// Largest response accepted from the server, in bytes (default
    /// 1000000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024))]
    pub max_response_bytes: Option<u64>,

    /// How often and how patiently the operator probes the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,

    /// Prepended to the server's tool names as agents see them, e.g.
    /// "github_".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.-]*$"))]
    pub tool_prefix: Option<String>,

    /// Client capabilities offered to the server. None unless opted in:
    /// with one, the server's requests of that kind reach the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_capabilities: Option<ClientCapabilities>,

    /// Tools pinned by fingerprint, by the name the server lists them
    /// under: only these are served, each while its definition still
    /// matches (docs/tool-pins.md; `aip tools pin` writes them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_pins: BTreeMap<String, ToolPin>,

    /// Listed: every tool as listed (the default without toolPins);
    /// Pinned: only pinned tools, each as pinned (the default with them);
    /// FirstUse: the first tools the operator lists are accepted and kept
    /// in status.tools; a later change or a new tool is withheld until a
    /// person accepts it (`kubectl aip tools accept`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_trust: Option<ToolTrust>,

    /// What a finding of the poisoning scan does: Warn (logged, the
    /// default), Block (the tool is withheld) or Off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_scan: Option<ToolScan>,

    /// Access tokens from the server's authorization server instead of a
    /// static credential: the gateway is an OAuth client
    /// (docs/upstream-auth.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
}

/// How the gateway gets access tokens for the server: one grant.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "[has(self.clientCredentials), has(self.jwtBearer), has(self.tokenExchange)].filter(x, x).size() == 1", "message": "give exactly one of clientCredentials, jwtBearer and tokenExchange"},
    {"rule": "!has(self.clientCredentials) || [has(self.clientCredentials.clientSecret), has(self.clientCredentials.privateKey), has(self.clientCredentials.serviceAccountToken)].filter(x, x).size() == 1", "message": "clientCredentials: give exactly one of clientSecret, privateKey and serviceAccountToken"},
    {"rule": "!has(self.clientCredentials) || (!has(self.clientCredentials.audience) && !has(self.clientCredentials.subjectIssuer))", "message": "clientCredentials: audience and subjectIssuer apply to tokenExchange only"},
    {"rule": "!has(self.jwtBearer) || (has(self.jwtBearer.serviceAccountToken) && !(has(self.jwtBearer.clientSecret) && has(self.jwtBearer.privateKey)))", "message": "jwtBearer: serviceAccountToken is the grant; give at most one of clientSecret and privateKey (neither: a public client)"},
    {"rule": "!has(self.jwtBearer) || (!has(self.jwtBearer.audience) && !has(self.jwtBearer.subjectIssuer))", "message": "jwtBearer: audience and subjectIssuer apply to tokenExchange only"},
    {"rule": "!has(self.tokenExchange) || (has(self.tokenExchange.serviceAccountToken) && !(has(self.tokenExchange.clientSecret) && has(self.tokenExchange.privateKey)))", "message": "tokenExchange: serviceAccountToken is the subject token; give at most one of clientSecret and privateKey (neither: a public client)"}
]))]
pub struct AuthSpec {
    /// The client credentials grant (RFC 6749 section 4.4): the client's
    /// own authentication is the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_credentials: Option<GrantSpec>,
    /// The JWT bearer grant (RFC 7523 section 2.1): the pod's projected
    /// ServiceAccount token is the grant (workload identity federation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_bearer: Option<GrantSpec>,
    /// Token exchange (RFC 8693): the pod's projected ServiceAccount token
    /// is the subject token, exchanged for an access token for the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_exchange: Option<GrantSpec>,
}

/// Which grant an AuthSpec names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantKind {
    ClientCredentials,
    JwtBearer,
    TokenExchange,
}

impl GrantKind {
    /// The field's name under spec.auth.
    pub fn field(self) -> &'static str {
        match self {
            GrantKind::ClientCredentials => "clientCredentials",
            GrantKind::JwtBearer => "jwtBearer",
            GrantKind::TokenExchange => "tokenExchange",
        }
    }
}

impl AuthSpec {
    /// The grant given (the API server's rules allow exactly one; the
    /// first is taken if a stored object has more).
    pub fn grant(&self) -> Option<(GrantKind, &GrantSpec)> {
        [
            (GrantKind::ClientCredentials, &self.client_credentials),
            (GrantKind::JwtBearer, &self.jwt_bearer),
            (GrantKind::TokenExchange, &self.token_exchange),
        ]
        .into_iter()
        .find_map(|(kind, spec)| spec.as_ref().map(|s| (kind, s)))
    }
}

/// One grant, the gateway the OAuth client.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.issuer) || !has(self.tokenEndpoint)", "message": "give issuer (its token endpoint is discovered) or tokenEndpoint, not both (neither: both are found from the server's own metadata, RFC 9728)"},
    {"rule": "!has(self.clientAuthMethod) || has(self.clientSecret)", "message": "clientAuthMethod applies to clientSecret only"}
]))]
pub struct GrantSpec {
    /// The authorization server: its token endpoint is found in its
    /// metadata (RFC 8414, then OpenID Connect discovery). Without issuer
    /// and tokenEndpoint, the server's own protected resource metadata
    /// (RFC 9728) names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub issuer: Option<String>,
    /// The token endpoint itself, instead of issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub token_endpoint: Option<String>,
    /// The gateway's client id at the authorization server.
    #[schemars(length(min = 1))]
    pub client_id: String,
    /// The client secret, from a Secret...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<ValueSpec>,
    /// ...sent as client_secret_basic (the default) or client_secret_post.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth_method: Option<ClientAuthMethod>,
    /// Or a PEM private key (RSA or P-256), from a Secret: the gateway
    /// signs its own client assertions (private_key_jwt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<ValueSpec>,
    /// The key id (kid) its assertions name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The agent pod's own ServiceAccount token, projected by the kubelet
    /// into the sidecar only. Under clientCredentials it is the client
    /// assertion (federated client authentication, RFC 7523 section 2.2:
    /// no secret at all); under jwtBearer the grant's assertion; under
    /// tokenExchange the subject token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountTokenSpec>,
    /// Scopes to ask for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The RFC 8707 resource tokens are asked for (default: url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// false: resource is not sent, for an authorization server that
    /// mishandles RFC 8707 (Keycloak 26.7's experimental resource
    /// indicators fail every grant without a refresh token); the token's
    /// audience is then the server's choice (an audience mapper, say).
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_resource: Option<bool>,
    /// tokenExchange only: the RFC 8693 audience asked for (a client id
    /// at the authorization server, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub audience: Option<String>,
    /// tokenExchange only: who issued the subject token, as the
    /// authorization server names it (Keycloak: the identity provider's
    /// alias), sent as subject_issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub subject_issuer: Option<String>,
}

/// The projected ServiceAccount token a connection authenticates with.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountTokenSpec {
    /// The token's audience: what the authorization server expects of a
    /// client assertion (Keycloak: the realm's issuer URL).
    #[schemars(length(min = 1))]
    pub audience: String,
    /// Its lifetime; the kubelet renews it at 80% (default 3600, at least
    /// 600, as the kubelet requires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 86400))]
    pub expiration_seconds: Option<u32>,
}

impl ServiceAccountTokenSpec {
    pub const DEFAULT_EXPIRATION_SECONDS: u32 = 3600;

    /// Where the token is, relative to the sidecar's token directory: one
    /// file per audience.
    pub fn path(&self) -> String {
        // A stable file name whatever characters the audience holds.
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.audience.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("upstream/{hex}")
    }
}

/// How a client secret is sent.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMethod {
    ClientSecretBasic,
    ClientSecretPost,
}

/// A tool's pinned fingerprints (`sha256:` and 64 lower-case hex digits).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolPin {
    /// Of the tool's name, description and inputSchema (AIP's schema_hash).
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub schema_hash: String,
    /// Of its title, outputSchema and annotations; not pinned when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub metadata_hash: Option<String>,
}

/// How a connection trusts its tools.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ToolTrust {
    Listed,
    Pinned,
    FirstUse,
}

/// What a poisoning-scan finding does.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ToolScan {
    Warn,
    Block,
    Off,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderSpec {
    /// The header's name; the gateway's own (Mcp-Session-Id,
    /// MCP-Protocol-Version, Content-Type, Content-Length, Host) are refused.
    #[schemars(regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub name: String,
    /// Where the header's value comes from.
    pub value_from: ValueSource,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValueSpec {
    /// Where the value comes from.
    pub value_from: ValueSource,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValueSource {
    /// A key of a Secret in the ToolConnection's namespace. The author must
    /// be allowed to read it (checked at admission).
    pub secret_key_ref: SecretKeyRef,
}

#[derive(
    Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key within the Secret's data.
    pub key: String,
    /// Accepted only so that a reference to another namespace is refused
    /// with a reason: Secrets are read from the ToolConnection's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A Secret key holding the PEM CA bundle to trust instead of the
    /// built-in web roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// Verify the certificate for this name instead of the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// Seconds between probes (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub interval_seconds: Option<u32>,
    /// Deadline of one probe in seconds (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<u32>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ClientCapabilities {
    /// The server may ask the agent's model for a completion
    /// (sampling/createMessage).
    #[serde(default)]
    pub sampling: bool,
    /// The server may ask the agent's user for input (elicitation/create).
    #[serde(default)]
    pub elicitation: bool,
    /// The server may ask for the agent's roots (roots/list).
    #[serde(default)]
    pub roots: bool,
}

impl ToolConnectionSpec {
    /// Every Secret key this connection reads, in spec order.
    pub fn secret_refs(&self) -> Vec<(String, &SecretKeyRef)> {
        let mut out: Vec<(String, &SecretKeyRef)> = self
            .headers
            .iter()
            .enumerate()
            .map(|(i, h)| {
                (
                    format!("spec.headers[{i}].valueFrom.secretKeyRef"),
                    &h.value_from.secret_key_ref,
                )
            })
            .collect();
        if let Some(b) = &self.bearer_token {
            out.push((
                "spec.bearerToken.valueFrom.secretKeyRef".to_owned(),
                &b.value_from.secret_key_ref,
            ));
        }
        if let Some(ca) = self.tls.as_ref().and_then(|t| t.ca_secret_ref.as_ref()) {
            out.push(("spec.tls.caSecretRef".to_owned(), ca));
        }
        if let Some((kind, g)) = self.auth.as_ref().and_then(AuthSpec::grant) {
            for (field, v) in [
                ("clientSecret", &g.client_secret),
                ("privateKey", &g.private_key),
            ] {
                if let Some(v) = v {
                    out.push((
                        format!("spec.auth.{}.{field}.valueFrom.secretKeyRef", kind.field()),
                        &v.value_from.secret_key_ref,
                    ));
                }
            }
        }
        out
    }
}

/// Health as the operator's probes and the sidecars' calls show it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HealthState {
    #[default]
    Unchecked,
    Healthy,
    /// The probe fails while sidecars report successful calls.
    Degraded,
    Unreachable,
    NeedsCredentials,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Unchecked, Healthy, Degraded, Unreachable or NeedsCredentials.
    pub state: HealthState,
    /// Why, in words (never a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The HTTP status of the last failing exchange, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The scope a 403 `insufficient_scope` challenge asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_scope: Option<String>,
    /// When the state was last checked (by a probe or a sidecar's report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_time: Option<Time>,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// One tool of the server, as the operator last listed it and as it is
/// judged: by its pin, by the acceptance recorded here (toolTrust
/// FirstUse), and by the poisoning scan.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredTool {
    /// The name as the server lists it.
    pub name: String,
    /// sha256:... of its name, description and inputSchema (what a
    /// rule's schema_hash and toolPins pin). Empty when the server no
    /// longer lists the tool.
    pub schema_hash: String,
    /// sha256:... of its title, outputSchema and annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_hash: Option<String>,
    /// Served, or why agents do not see it: Drifted, New, Unpinned,
    /// Flagged (the scan found something and toolScan is Block) or
    /// Unlisted (accepted once, no longer listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ToolState>,
    /// Why a withheld tool is withheld.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the operator first listed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<Time>,
    /// The definition as listed (canonical JSON, credentials redacted),
    /// kept while the tool is withheld: what `kubectl aip tools` compares
    /// with the accepted one. Absent when larger than 16 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
    /// The definition a person (or first use) accepted; under toolTrust
    /// FirstUse the tool is served while it matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<AcceptedTool>,
    /// What the poisoning scan found in the listed definition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<ToolFinding>,
}

/// The state of one tool, as agents are served it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ToolState {
    Served,
    Drifted,
    New,
    Unpinned,
    Flagged,
    Unlisted,
}

/// An accepted definition: its fingerprints, who accepted it and when
/// (stamped by the operator's webhook), and its text for later diffs.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedTool {
    /// The schema hash accepted: the tool is served while it lists so.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub schema_hash: String,
    /// The metadata hash accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub metadata_hash: Option<String>,
    /// The user who accepted, or the operator's service account for the
    /// first listing under toolTrust FirstUse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When it was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// The accepted definition (canonical JSON, credentials redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
}

/// One finding of the poisoning scan.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolFinding {
    /// The rule (policy/src/tools/poisoning.yaml).
    pub rule: String,
    /// Its class: instructions, hidden_text, comment, encoded, url,
    /// secrets or tool_reference.
    pub class: String,
    /// A JSON pointer into the definition.
    pub field: String,
    /// Where in that text the match starts (a byte offset).
    #[serde(default)]
    pub at: u64,
    /// The matched text (invisible characters written <U+XXXX>).
    pub excerpt: String,
}

/// What the operator last saw of the server: its health and its tools.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolConnectionStatus {
    /// What the operator's probes and the sidecars' calls show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// The tools the last successful probe listed (and, under toolTrust
    /// FirstUse, accepted ones it no longer lists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<DiscoveredTool>,
    /// How many tools the last successful probe listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<u32>,
    /// CredentialsResolved and Healthy. Keyed by type, as on AgentPolicy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

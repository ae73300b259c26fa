//! Who may accept a changed tool, and the record of who did
//! (docs/tool-pins.md). A person accepts by writing `accepted` on one
//! entry of a ToolConnection's `status.tools` (`kubectl aip tools accept`);
//! the operator writes everything else there.
//!
//! Validating (`/validate`, `toolconnections/status`): anyone but the
//! operator may change only the `accepted` of tools the connection withholds
//! (Drifted or New) under toolTrust FirstUse, only to the fingerprints the
//! operator listed, never removing one; service accounts of the
//! connection's own namespace (where the server and its agents may run)
//! may not accept at all. Mutating (`/mutate`): each new acceptance is
//! stamped with `by` (the authenticated user), `at` and the listed
//! definition.

use aip_api::ToolConnection;
use aip_api::tool_connection::{DiscoveredTool, ToolState, ToolTrust};
use k8s_openapi::jiff::Timestamp;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;

/// Why a write to a ToolConnection's status is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the request carries no object")]
    NoObject,
    #[error("not a ToolConnection: {0}")]
    NotAToolConnection(String),
    #[error(
        "only the operator writes a ToolConnection's status; others may only accept a withheld tool (status.tools[].accepted), and {user} changed {what}"
    )]
    NotAnAcceptance { user: String, what: String },
    #[error(
        "toolconnection {name} does not trust on first use (spec.toolTrust is {trust}): its tools are held to spec.toolPins; pin the new definition there (aip tools pin prints it)"
    )]
    NotFirstUse { name: String, trust: String },
    #[error("tool {tool} is {state:?}: only a Drifted or New tool can be accepted")]
    NotWithheld { tool: String, state: ToolState },
    #[error("an acceptance cannot be removed (tool {tool}); a person accepts, nothing revokes")]
    Removed { tool: String },
    #[error(
        "tool {tool} must be accepted as the operator listed it: schema hash {listed}, not {given}"
    )]
    NotAsListed {
        tool: String,
        listed: String,
        given: String,
    },
    #[error(
        "{user} is a service account of namespace {namespace}, where the connection's server and agents may run; it cannot accept tools"
    )]
    NamespaceServiceAccount { user: String, namespace: String },
}

/// The verdict on a write to a ToolConnection's status.
pub fn validate(operator: &str, request: &AdmissionRequest<DynamicObject>) -> Result<(), Refusal> {
    let user = request.user_info.username.clone().unwrap_or_default();
    if user == operator {
        return Ok(());
    }
    let new = parse(request.object.as_ref())?;
    let old = parse(request.old_object.as_ref())?;
    let before = old.status.clone().unwrap_or_default();
    let after = new.status.clone().unwrap_or_default();
    let not_acceptance = |what: &str| Refusal::NotAnAcceptance {
        user: user.clone(),
        what: what.to_owned(),
    };
    // Everything but the acceptances stays as the operator wrote it.
    let strip = |tools: &[DiscoveredTool]| -> Vec<DiscoveredTool> {
        tools
            .iter()
            .map(|t| DiscoveredTool {
                accepted: None,
                ..t.clone()
            })
            .collect()
    };
    if strip(&before.tools) != strip(&after.tools) {
        return Err(not_acceptance("status.tools beyond accepted"));
    }
    let unchanged = aip_api::tool_connection::ToolConnectionStatus {
        tools: Vec::new(),
        ..after.clone()
    } == aip_api::tool_connection::ToolConnectionStatus {
        tools: Vec::new(),
        ..before.clone()
    };
    if !unchanged {
        return Err(not_acceptance("status beyond status.tools"));
    }
    let changed: Vec<(&DiscoveredTool, &DiscoveredTool)> = before
        .tools
        .iter()
        .zip(&after.tools)
        .filter(|(b, a)| b.accepted != a.accepted)
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    if user.starts_with(&format!("system:serviceaccount:{namespace}:")) {
        return Err(Refusal::NamespaceServiceAccount { user, namespace });
    }
    if old.spec.tool_trust != Some(ToolTrust::FirstUse) {
        return Err(Refusal::NotFirstUse {
            name: request.name.clone(),
            trust: old
                .spec
                .tool_trust
                .map_or_else(|| "not set".to_owned(), |t| format!("{t:?}")),
        });
    }
    for (was, is) in changed {
        let Some(accepted) = &is.accepted else {
            return Err(Refusal::Removed {
                tool: was.name.clone(),
            });
        };
        let state = was.state.unwrap_or(ToolState::Served);
        if !matches!(state, ToolState::Drifted | ToolState::New) {
            return Err(Refusal::NotWithheld {
                tool: was.name.clone(),
                state,
            });
        }
        if accepted.schema_hash != was.schema_hash || accepted.metadata_hash != was.metadata_hash {
            return Err(Refusal::NotAsListed {
                tool: was.name.clone(),
                listed: was.schema_hash.clone(),
                given: accepted.schema_hash.clone(),
            });
        }
        if accepted.by.as_deref() != Some(user.as_str()) {
            return Err(not_acceptance(
                "accepted.by (the webhook records who accepts)",
            ));
        }
    }
    Ok(())
}

/// The JSON patch that records who accepted each newly accepted tool, when,
/// and what its definition was.
pub fn stamp(
    operator: &str,
    request: &AdmissionRequest<DynamicObject>,
) -> Option<json_patch::Patch> {
    let user = request.user_info.username.clone().unwrap_or_default();
    if request.sub_resource.as_deref() != Some("status") || user == operator {
        return None;
    }
    let new = parse(request.object.as_ref()).ok()?;
    let old = parse(request.old_object.as_ref()).ok()?;
    let before = old.status.unwrap_or_default().tools;
    let after = new.status.unwrap_or_default().tools;
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut ops = Vec::new();
    for (i, tool) in after.iter().enumerate() {
        let was = before.iter().find(|b| b.name == tool.name);
        let Some(accepted) = &tool.accepted else {
            continue;
        };
        if was.and_then(|w| w.accepted.as_ref()) == Some(accepted) {
            continue;
        }
        let at = format!("/status/tools/{i}/accepted");
        ops.push(serde_json::json!({"op": "add", "path": format!("{at}/by"), "value": user}));
        ops.push(serde_json::json!({"op": "add", "path": format!("{at}/at"), "value": now}));
        let definition = was.and_then(|w| w.definition.clone());
        match definition {
            Some(d) => ops.push(
                serde_json::json!({"op": "add", "path": format!("{at}/definition"), "value": d}),
            ),
            None if accepted.definition.is_some() => {
                ops.push(serde_json::json!({"op": "remove", "path": format!("{at}/definition")}));
            }
            None => {}
        }
    }
    if ops.is_empty() {
        return None;
    }
    serde_json::from_value(serde_json::Value::Array(ops)).ok()
}

fn parse(object: Option<&DynamicObject>) -> Result<ToolConnection, Refusal> {
    let object = object.ok_or(Refusal::NoObject)?;
    let value =
        serde_json::to_value(object).map_err(|e| Refusal::NotAToolConnection(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| Refusal::NotAToolConnection(e.to_string()))
}

//! `aip approvals`: list and decide the asks a standalone gateway holds, over
//! its admin port, with the operator's token.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

#[derive(clap::Args)]
pub struct Target {
    /// The gateway's admin address.
    #[arg(long, env = "AIP_ADMIN", default_value = "http://127.0.0.1:8809")]
    admin: String,
    /// The file holding the approval token (printed by aip-sidecar at start).
    #[arg(long, env = "AIP_APPROVAL_TOKEN_FILE")]
    token_file: PathBuf,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Pending asks, oldest first.
    List {
        #[command(flatten)]
        target: Target,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release the one call waiting on ID.
    Approve {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Refuse the call waiting on ID (the agent gets -32004 User denied).
    Deny {
        id: String,
        #[command(flatten)]
        target: Target,
    },
}

pub fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::List { target, json } => list(&target, json),
        Command::Approve { id, target } => decide(&target, &id, "approve"),
        Command::Deny { id, target } => decide(&target, &id, "deny"),
    }
}

fn token(target: &Target) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&target.token_file)
        .with_context(|| format!("cannot read the token file {}", target.token_file.display()))?;
    Ok(text.trim().to_owned())
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn list(target: &Target, as_json: bool) -> anyhow::Result<bool> {
    let url = format!("{}/approvals", target.admin.trim_end_matches('/'));
    let mut response = agent()
        .get(&url)
        .header("authorization", &format!("Bearer {}", token(target)?))
        .call()
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string()?;
    anyhow::ensure!(
        status == 200,
        "{url} answered HTTP {status}: {}",
        body.trim()
    );
    let value: Value = serde_json::from_str(&body).context("the gateway's answer is not JSON")?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(true);
    }
    let pending = value["pending"].as_array().cloned().unwrap_or_default();
    if pending.is_empty() {
        println!("no pending approvals");
        return Ok(true);
    }
    println!(
        "{:<20} {:<24} {:<14} {:<26} ARGUMENTS",
        "ID", "TOOL", "CONNECTION", "EXPIRES"
    );
    for p in pending {
        let text = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
        println!(
            "{:<20} {:<24} {:<14} {:<26} {}",
            text("id"),
            text("tool"),
            text("connection"),
            text("expires"),
            p["arguments"]
        );
    }
    Ok(true)
}

fn decide(target: &Target, id: &str, decision: &str) -> anyhow::Result<bool> {
    let url = format!("{}/approvals/{id}", target.admin.trim_end_matches('/'));
    let mut response = agent()
        .post(&url)
        .header("authorization", &format!("Bearer {}", token(target)?))
        .header("content-type", "application/json")
        .send(json!({ "decision": decision }).to_string())
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string()?;
    if status == 200 {
        let past = if decision == "approve" {
            "approved"
        } else {
            "denied"
        };
        println!("{past} {id}");
        return Ok(true);
    }
    let reason = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.trim().to_owned());
    eprintln!("aip: {id}: {reason} (HTTP {status})");
    Ok(false)
}

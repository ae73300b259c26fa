//! The `aip approvals` CLI (the real binary) against a gateway's admin port
//! holding a real pending ask.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use aip_policy::Approval;
use aip_sidecar::admin::{self, Admin};
use aip_sidecar::config::Config;
use aip_sidecar::gate::{Gateway, GatewayOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Runs `aip` off the runtime's threads (the admin server lives on them).
async fn aip(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || Command::new(aip_binary()).args(&args).output().unwrap())
        .await
        .unwrap()
}

fn aip_binary() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/aip");
    assert!(bin.exists(), "build the workspace first (make build)");
    bin
}

fn args(words: &[&str], target: &[String]) -> Vec<String> {
    words
        .iter()
        .map(|w| (*w).to_owned())
        .chain(target.iter().cloned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_approve_and_deny_through_the_admin_port() {
    let shutdown = CancellationToken::new();
    let (_tx, config) = tokio::sync::watch::channel(Arc::new(Config::empty()));
    let audit = aip_sidecar::audit::Audit::new(Box::new(std::io::sink()));
    let gateway = Gateway::new(config, audit, GatewayOptions::default(), shutdown.clone());
    let approvals = gateway.approvals.clone();
    let admin = Arc::new(Admin {
        gateway,
        approval_token: Some(secrecy::SecretString::from("t0ken".to_owned())),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(admin::serve(
        admin,
        listener,
        admin::Surface::Admin,
        shutdown.clone(),
    ));
    let tmp = tempfile::Builder::new()
        .prefix("aip-cli-approvals-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let dir = tmp.path();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "t0ken\n").unwrap();
    let target: Vec<String> = [
        "--admin",
        url.as_str(),
        "--token-file",
        token_file.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();

    let mut changes = approvals.subscribe();
    for (verb, expected) in [("approve", Approval::Approved), ("deny", Approval::Denied)] {
        let a = approvals.clone();
        let waiting = tokio::spawn(async move {
            let held = aip_sidecar::approvals::Ask {
                tool: "up_deploy".to_owned(),
                connection: "up".to_owned(),
                arguments: json!({"env": "prod"}),
                arguments_hash: aip_policy::hash::arguments_hash(&json!({"env": "prod"})),
                ended: Default::default(),
            };
            a.ask(held, Duration::from_secs(60)).await
        });
        while approvals.list().is_empty() {
            tokio::time::timeout(Duration::from_secs(10), changes.changed())
                .await
                .unwrap()
                .unwrap();
        }
        let listed = aip(args(&["approvals", "list"], &target)).await;
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(
            listed.status.success(),
            "{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        assert!(
            text.contains("up_deploy") && text.contains(r#"{"env":"prod"}"#),
            "{text}"
        );
        let id = approvals.list()[0].id.clone();
        let decided = aip(args(&["approvals", verb, &id], &target)).await;
        assert!(decided.status.success());
        assert!(
            String::from_utf8_lossy(&decided.stdout).starts_with(if verb == "approve" {
                "approved"
            } else {
                "denied"
            })
        );
        assert_eq!(waiting.await.unwrap().approval, expected);
        // Deciding again finds nothing: one ask, one decision.
        let again = aip(args(&["approvals", verb, &id], &target)).await;
        assert_eq!(again.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&again.stderr).contains("no pending approval"),
            "{}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
    // A wrong token is refused.
    std::fs::write(&token_file, "wrong\n").unwrap();
    let refused = aip(args(&["approvals", "list"], &target)).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("HTTP 401"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    shutdown.cancel();
}

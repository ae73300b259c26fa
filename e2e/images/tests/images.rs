//! The images `make images` builds, run as a container runtime runs them:
//! each archive's root filesystem unpacked, its entrypoint started from it
//! as the image's user with nothing writable — `--version` from all three,
//! the fault server answering a tools/call, the sidecar ready on its admin
//! port and forwarding a call to the fault server's image by host name
//! (glibc's resolver in the image reading the mounted /etc/hosts). And the
//! names: the chart's defaults and the Dockerfile are what `make images`
//! produces.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use aip_images::{IMAGES, Image, PATIENCE, repo};
use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = "ghcr.io/aip-k8s";

/// The test's own directory under cargo's target/tmp, removed when it
/// drops (each `Image` removes what it unpacked first).
fn scratch(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("images-{test}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

#[test]
fn every_image_is_its_binary_as_user_65532_with_labels_and_no_shell() {
    let dir = scratch("config");
    for name in IMAGES {
        let image = Image::open(name, dir.path());
        assert_eq!(image.tags, [format!("{REPOSITORY}/{name}:{VERSION}")]);
        assert_eq!(
            (&image.config["os"], &image.config["architecture"]),
            (&json!("linux"), &json!("amd64"))
        );
        let config = &image.config["config"];
        assert_eq!(config["User"], "65532:65532", "{name}");
        assert_eq!(image.entrypoint(), [format!("/usr/local/bin/{name}")]);
        assert_eq!(
            config.get("Cmd"),
            None,
            "{name}: no command to pass to a shell"
        );
        assert_eq!(config["WorkingDir"], "/", "{name}");
        assert_eq!(image.label("org.opencontainers.image.title"), Some(name));
        assert_eq!(
            image.label("org.opencontainers.image.version"),
            Some(VERSION)
        );
        assert_eq!(
            image.label("org.opencontainers.image.source"),
            Some("https://github.com/aip-k8s/aip")
        );
        assert_eq!(
            image.label("org.opencontainers.image.licenses"),
            Some("Apache-2.0 AND LGPL-2.1-or-later AND GPL-3.0-or-later WITH GCC-exception-3.1"),
            "{name}: ours, glibc's and libgcc's"
        );
        assert!(
            image
                .label("org.opencontainers.image.revision")
                .is_some_and(|r| r.len() >= 40),
            "{name}: {:?}",
            image.label("org.opencontainers.image.revision")
        );

        // Only the entrypoint and shared libraries are executable: no shell,
        // no package manager, nothing else to run.
        let executables: Vec<&str> = image
            .entries
            .iter()
            .filter(|e| e.mode.starts_with('-') && e.mode.contains('x'))
            .map(|e| e.path.as_str())
            .collect();
        let binary = format!("usr/local/bin/{name}");
        assert!(executables.contains(&binary.as_str()), "{executables:?}");
        for path in &executables {
            assert!(
                *path == binary || path.contains(".so"),
                "{name}: {path} is executable"
            );
        }
        for shell in ["bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh"] {
            assert!(!image.rootfs.join(shell).exists(), "{name}: {shell}");
        }
        // Everything belongs to root and is writable by no one else: the
        // user can write nowhere, so a read-only root filesystem changes
        // nothing.
        for entry in &image.entries {
            assert_eq!(entry.owner, "0/0", "{name}: {entry:?}");
            let bits = entry.mode.as_bytes();
            if !entry.mode.starts_with('l') {
                assert!(
                    bits[5] != b'w' && bits[8] != b'w',
                    "{name}: {entry:?} is writable by others"
                );
            }
        }
        let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).unwrap();
        assert!(
            passwd.contains("nonroot:x:65532:65532:"),
            "{name}: {passwd}"
        );
        let nsswitch = std::fs::read_to_string(image.rootfs.join("etc/nsswitch.conf")).unwrap();
        assert!(nsswitch.contains("hosts: files dns"), "{nsswitch}");
    }
}

#[test]
fn every_entrypoint_runs_as_the_image_user_and_prints_its_version() {
    let dir = scratch("version");
    for name in IMAGES {
        let image = Image::open(name, dir.path());
        let out = image.command(&["--version"]).output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {VERSION}\n")
        );
    }
}

const FILES: &str = "apiVersion: aip.io/v1alpha1
kind: FaultServer
metadata: {name: files}
spec:
  tools:
    - name: read_file
      description: Read a file.
      inputSchema: {type: object, properties: {path: {type: string}}}
      responses:
        - sequence:
            - return: {path: /data/report.txt, text: quarterly numbers}
    - name: delete_file
      description: Delete a file.
      responses: [{sequence: [{return: deleted}]}]
";

/// The fault server's image serving FILES over HTTP on a loopback port;
/// returns it (keep it alive) and its URL.
fn files_server(image: &Image) -> (aip_images::Running, String) {
    image.mount_file("/etc/aip/faults.yaml", FILES);
    let mut server = image.start(&["--config", "/etc/aip/faults.yaml", "--http", "127.0.0.1:0"]);
    let line = server.line_containing("listening on http://");
    let url = line
        .split("listening on ")
        .nth(1)
        .unwrap()
        .trim()
        .to_owned();
    (server, url)
}

/// An MCP client over Streamable HTTP: initialize, then calls in its
/// session.
struct Client {
    url: String,
    session: String,
    agent: ureq::Agent,
}

impl Client {
    fn connect(url: &str) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(PATIENCE))
            .build()
            .into();
        let mut client = Client {
            url: url.to_owned(),
            session: String::new(),
            agent,
        };
        let (answer, session) =
            client.post(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "images-test", "version": "1"}}}));
        assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
        client.session = session.expect("the server names a session");
        client.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    fn call(&self, id: u64, tool: &str, arguments: Value) -> Value {
        self.post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": arguments}}))
            .0
    }

    fn tools(&self) -> Vec<String> {
        let (answer, _) = self.post(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}));
        answer["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// The answer (JSON, or the last SSE event's data; null for a
    /// notification's 202) and the session id header.
    fn post(&self, message: &Value) -> (Value, Option<String>) {
        let mut request = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if !self.session.is_empty() {
            request = request.header("mcp-session-id", &self.session);
        }
        let mut response = request.send(message.to_string()).unwrap();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status().as_u16();
        let sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let body = response.body_mut().read_to_string().unwrap();
        assert!(matches!(status, 200 | 202), "HTTP {status}: {body}");
        let text = if sse {
            body.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .next_back()
                .unwrap_or_default()
                .trim()
                .to_owned()
        } else {
            body
        };
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        };
        (value, session)
    }
}

#[test]
fn fault_server_image_answers_a_tools_call() {
    let dir = scratch("fault-server");
    let image = Image::open("aip-fault-server", dir.path());
    let (_server, url) = files_server(&image);
    let client = Client::connect(&url);
    let answer = client.call(1, "read_file", json!({"path": "/data/report.txt"}));
    assert_eq!(
        answer["result"]["structuredContent"],
        json!({"path": "/data/report.txt", "text": "quarterly numbers"}),
        "{answer}"
    );
}

#[test]
fn sidecar_image_is_ready_and_forwards_to_the_fault_server_image_by_host_name() {
    let dir = scratch("sidecar");
    let files = Image::open("aip-fault-server", dir.path());
    let (_server, files_url) = files_server(&files);
    let port = files_url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp");

    let sidecar = Image::open("aip-sidecar", dir.path());
    // What Kubernetes would mount: the kubelet's /etc/hosts (here naming
    // the file server, so the name goes through glibc's resolver in the
    // image), a configuration, a Secret with the approval token.
    sidecar.mount_file(
        "/etc/hosts",
        "127.0.0.1\tlocalhost\n127.0.0.1\tfiles.internal.test\n",
    );
    sidecar.mount_file(
        "/etc/aip/gateway.yaml",
        &format!(
            "apiVersion: aip.io/v1alpha1
kind: AgentPolicy
metadata: {{name: files-reader}}
spec:
  allowed_tools: [fs_read_file, fs_delete_file]
  tool_rules:
    - {{tool: fs_delete_file, action: block}}
---
apiVersion: aip.io/v1alpha1
kind: ToolConnection
metadata: {{name: files}}
spec:
  url: http://files.internal.test:{port}/mcp
  toolPrefix: fs_
  timeoutSeconds: 5
"
        ),
    );
    sidecar.mount_file("/etc/aip/approval-token", "images-test-token\n");
    let mut gateway = sidecar.start(&[
        "run",
        "--config",
        "/etc/aip/gateway.yaml",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--approval-token-file",
        "/etc/aip/approval-token",
    ]);
    let line = gateway.line_containing("agents at http://");
    let agents = line
        .split("agents at ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let admin = line
        .split("admin at ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();

    let mut ready = ureq::get(&format!("{admin}/readyz")).call().unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.body_mut().read_to_string().unwrap(), "ready\n");

    let client = Client::connect(&agents);
    // The catalog arrives once the gateway has listed the connection's
    // tools; each listing is an answer, not a timer.
    let deadline = std::time::Instant::now() + PATIENCE;
    while !client.tools().contains(&"fs_read_file".to_owned()) {
        assert!(
            std::time::Instant::now() < deadline,
            "fs_read_file never listed"
        );
    }
    let answer = client.call(1, "fs_read_file", json!({"path": "/data/report.txt"}));
    assert_eq!(
        answer["result"]["structuredContent"],
        json!({"path": "/data/report.txt", "text": "quarterly numbers"}),
        "{answer}"
    );
    let refused = client.call(2, "fs_delete_file", json!({"path": "/data/report.txt"}));
    assert_eq!(refused["error"]["code"], -32001, "{refused}");
}

#[test]
fn chart_and_dockerfile_name_the_images_make_images_builds() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let chart = read("charts/aip/Chart.yaml");
    assert!(
        chart
            .lines()
            .any(|l| l == format!("appVersion: \"{VERSION}\"")),
        "the chart's appVersion (its default image tag) is {VERSION}:\n{chart}"
    );
    let values = read("charts/aip/values.yaml");
    for name in ["aip-operator", "aip-sidecar", "aip-cni"] {
        assert!(
            values
                .lines()
                .any(|l| l.trim() == format!("repository: {REPOSITORY}/{name}")),
            "values.yaml names {REPOSITORY}/{name}"
        );
    }
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l == format!("ARG VERSION={VERSION}")),
        "the Dockerfile's VERSION is {VERSION}"
    );
    for name in IMAGES {
        assert!(dockerfile.contains(&format!(" AS {name}\n")), "{name}");
        assert!(
            dockerfile.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{name}\"]")),
            "{name}"
        );
    }
    assert!(dockerfile.contains("USER 65532:65532"));
}

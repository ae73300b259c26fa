//! The real kubectl, as a platform engineer runs it, and a temporary
//! directory for its kubeconfigs.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Clone)]
pub struct Kubectl {
    pub kubeconfig: PathBuf,
    /// What `wait`, `get` and `decide` look in.
    pub namespace: String,
}

impl Kubectl {
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        self.run_with_path(args, stdin, std::env::var_os("PATH").unwrap_or_default())
    }

    /// `kubectl aip ARGS`: kubectl finds the kubectl-aip plugin on PATH,
    /// here beside the workspace's other binaries.
    pub fn aip(&self, args: &[&str]) -> (bool, String, String) {
        let plugin = Path::new(env!("CARGO_BIN_EXE_aip-operator")).with_file_name("kubectl-aip");
        assert!(
            plugin.exists(),
            "{} is missing: build the workspace first (`make build`)",
            plugin.display()
        );
        let mut path = std::ffi::OsString::from(plugin.parent().unwrap());
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let args: Vec<&str> = ["aip"].into_iter().chain(args.iter().copied()).collect();
        self.run_with_path(&args, None, path)
    }

    fn run_with_path(
        &self,
        args: &[&str],
        stdin: Option<&str>,
        path: std::ffi::OsString,
    ) -> (bool, String, String) {
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl on PATH (make kubectl puts one in target/bin)");
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The same user in namespace `ns`.
    pub fn in_namespace(&self, ns: &str) -> Kubectl {
        Kubectl {
            kubeconfig: self.kubeconfig.clone(),
            namespace: ns.to_owned(),
        }
    }

    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin);
        assert!(ok, "kubectl {args:?} failed:\n{out}{err}");
        out
    }

    pub fn apply(&self, yaml: &str) -> String {
        self.ok(&["apply", "-f", "-"], Some(yaml))
    }

    /// `kubectl wait` for a JSONPath value (kubectl watches; no polling here).
    pub fn wait(&self, object: &str, jsonpath: &str, value: &str) {
        self.wait_within(object, jsonpath, value, std::time::Duration::from_secs(30));
    }

    /// The same, for as long as `patience` (a status the sidecars' reports
    /// write, every 30 s, needs longer).
    pub fn wait_within(
        &self,
        object: &str,
        jsonpath: &str,
        value: &str,
        patience: std::time::Duration,
    ) {
        let condition = format!("--for=jsonpath={jsonpath}={value}");
        let timeout = format!("--timeout={}s", patience.as_secs());
        self.ok(
            &["wait", "-n", &self.namespace, object, &condition, &timeout],
            None,
        );
    }

    pub fn get(&self, object: &str, jsonpath: &str) -> String {
        self.ok(
            &[
                "get",
                "-n",
                &self.namespace,
                object,
                "-o",
                &format!("jsonpath={jsonpath}"),
            ],
            None,
        )
    }
}

/// A directory of the test's own under cargo's target/tmp (so that a run
/// that is killed leaves nothing outside target/), removed when it drops.
pub struct TempDir(tempfile::TempDir);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

pub fn tempdir() -> TempDir {
    TempDir(
        tempfile::Builder::new()
            .prefix("aip-operator-test-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap(),
    )
}

impl Kubectl {
    /// `kubectl patch --subresource=status` of an ApprovalRequest's decision
    /// (`extra` adds fields to the status, e.g. `,"reason":"..."`); whether it
    /// was accepted, and what kubectl said.
    pub fn decide(&self, name: &str, decision: &str, extra: &str) -> (bool, String) {
        let patch = format!("{{\"status\":{{\"decision\":\"{decision}\"{extra}}}}}");
        let object = format!("approvalrequest/{name}");
        let (ok, out, err) = self.run(
            &[
                "patch",
                "-n",
                &self.namespace,
                &object,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ],
            None,
        );
        (ok, format!("{out}{err}"))
    }
}

/// A Validating- or MutatingWebhookConfiguration (`kind`) with one webhook
/// at `url`, trusting `ca_pem`, for CREATE and UPDATE of `resources` in
/// aip.io/v1alpha1 in `namespaces` only (so that tests sharing a control
/// plane do not meet each other's webhooks); failurePolicy Fail.
pub fn webhook_configuration(
    kind: &str,
    name: &str,
    url: &str,
    ca_pem: &str,
    resources: &str,
    namespaces: &[&str],
) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let namespaces = serde_json::json!(namespaces);
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: {kind}WebhookConfiguration
metadata: {{name: {name}}}
webhooks:
  - name: {name}.aip.io
    clientConfig: {{url: '{url}', caBundle: {ca}}}
    rules: [{{operations: [CREATE, UPDATE], apiGroups: [aip.io], apiVersions: [v1alpha1], resources: [{resources}]}}]
    namespaceSelector: {{matchExpressions: [{{key: kubernetes.io/metadata.name, operator: In, values: {namespaces}}}]}}
    sideEffects: None
    admissionReviewVersions: [v1]
    failurePolicy: Fail
"
    )
}

//! The real kubectl against the fake API server, as platform teams and
//! approvers type it: apply (client-side and server-side) of a CRD and its
//! custom resources, get, jsonpath, status patches, wait, get -w, delete —
//! and a token nobody issued refused.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aip_fake_apiserver::{ADMIN_TOKEN, Options, Running};

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.io}
spec:
  group: example.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      additionalPrinterColumns:
        - {name: Size, type: integer, jsonPath: .spec.size}
        - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type==\"Ready\")].status'}
        - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, properties: {size: {type: integer}}}
            status: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

struct Kubectl {
    dir: PathBuf,
}

impl Kubectl {
    fn new(running: &Running, token: &str, name: &str) -> Kubectl {
        let dir = std::env::temp_dir().join(format!("aip-kubectl-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kubeconfig"), running.kubeconfig(token)).unwrap();
        Kubectl { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir) // no cache shared with other runs
            .current_dir(&self.dir);
        c
    }

    /// Runs kubectl; (succeeded, stdout + stderr).
    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = self
            .command(args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl must be installed to run this test: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args);
        assert!(ok, "kubectl {args:?} failed:\n{text}");
        text
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_crds_and_custom_resources() {
    // A platform engineer from the token file, made cluster-admin by RBAC.
    let tokens =
        aip_fake_apiserver::Tokens::parse("platform-token,platform,3001,\"platform-team\"\n")
            .unwrap();
    let running = aip_fake_apiserver::start(Options {
        tokens,
        ..Options::default()
    })
    .await
    .unwrap();
    let bootstrap = Kubectl::new(&running, ADMIN_TOKEN, "bootstrap");
    let binding = bootstrap.file(
        "binding.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: platform-admins}
subjects: [{kind: Group, name: platform-team, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: cluster-admin, apiGroup: rbac.authorization.k8s.io}
",
    );
    let k = Kubectl::new(&running, "platform-token", "platform");
    let crd = k.file("crd.yaml", CRD);
    tokio::task::spawn_blocking(move || {
        let (ok, text) = k.run(&["get", "crds"]);
        assert!(!ok && text.contains("Forbidden"), "nothing before the binding: {text}");
        bootstrap.ok(&["apply", "-f", &binding]);
        let _ = std::fs::remove_dir_all(&bootstrap.dir);
        assert!(k.ok(&["apply", "-f", &crd]).contains("created"));
        k.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.io",
            "--timeout=10s",
        ]);
        let widget = k.file(
            "w.yaml",
            "apiVersion: example.io/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n",
        );
        assert!(
            k.ok(&["apply", "-f", &widget])
                .contains("widget.example.io/w1 created")
        );
        assert_eq!(
            k.ok(&["get", "wd", "w1", "-o", "jsonpath={.spec.size}"]),
            "3"
        );
        let bigger = k.file(
            "w2.yaml",
            "apiVersion: example.io/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 5}\n",
        );
        // Client-side apply owns spec.size: a server-side apply changing it
        // conflicts, as on a real cluster, until it forces.
        let (ok, text) = k.run(&["apply", "--server-side", "-f", &bigger]);
        assert!(!ok);
        assert!(
            text.contains(r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using example.io/v1: .spec.size"#),
            "{text}"
        );
        let forced = k.ok(&["apply", "--server-side", "--force-conflicts", "-f", &bigger]);
        assert!(forced.contains("serverside-applied"), "{forced}");
        let managers = k.ok(&["get", "widget", "w1", "-o", "jsonpath={.metadata.managedFields[*].manager}"]);
        assert!(managers.contains("kubectl"), "{managers}");
        assert_eq!(
            k.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.size}"]),
            "5"
        );
        let table = k.ok(&["get", "widgets"]);
        let mut lines = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        assert_eq!(
            lines.next().unwrap(),
            ["NAME", "SIZE", "READY", "AGE"],
            "{table}"
        );
        assert_eq!(lines.next().unwrap()[..2], ["w1", "5"], "{table}");

        // A watch sees the status change that `wait` waits for.
        let mut watch = k
            .command(&[
                "get",
                "widgets",
                "-w",
                "-o",
                "jsonpath={.metadata.name} {.status.conditions[0].status}{\"\\n\"}",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
        assert_eq!(
            lines.next().unwrap().unwrap().trim(),
            "w1",
            "the current object first"
        );
        k.ok(&[
            "patch",
            "widget",
            "w1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
        ]);
        assert_eq!(
            lines.next().unwrap().unwrap(),
            "w1 True",
            "the watch saw the change"
        );
        let _ = watch.kill();
        let _ = watch.wait();
        k.ok(&[
            "wait",
            "--for=condition=Ready",
            "widget/w1",
            "--timeout=10s",
        ]);
        assert_eq!(
            k.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.size}"]),
            "5",
            "a status patch leaves spec alone"
        );

        assert!(k.ok(&["delete", "widget", "w1"]).contains("deleted"));
        let (found, text) = k.run(&["get", "widget", "w1"]);
        assert!(!found && text.contains("NotFound"), "{text}");
        let _ = std::fs::remove_dir_all(&k.dir);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_nobody_issued_is_refused() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let k = Kubectl::new(&running, "forged-token", "forged");
    let (ok, text) = tokio::task::spawn_blocking(move || {
        let out = k.run(&["get", "namespaces", "--request-timeout=10s"]);
        let _ = std::fs::remove_dir_all(&k.dir);
        out
    })
    .await
    .unwrap();
    assert!(!ok, "{text}");
    assert!(
        text.contains("Unauthorized") || text.contains("provide credentials"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_allows_what_roles_grant_and_forbids_the_rest() {
    let tokens = aip_fake_apiserver::Tokens::parse("alice-token,alice,1001,\"team-a\"\n").unwrap();
    let running = aip_fake_apiserver::start(Options {
        tokens,
        ..Options::default()
    })
    .await
    .unwrap();
    let admin = Kubectl::new(&running, ADMIN_TOKEN, "rbac-admin");
    let alice = Kubectl::new(&running, "alice-token", "rbac-alice");
    let grants = admin.file(
        "rbac.yaml",
        "apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
data: {mode: enabled}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: read-config, namespace: team-a}
rules:
  - {apiGroups: [\"\"], resources: [configmaps], verbs: [get, list, watch]}
  - {apiGroups: [\"\"], resources: [secrets], verbs: [get, list, watch], resourceNames: [allowed]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: team-a-reads, namespace: team-a}
subjects: [{kind: Group, name: team-a, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: read-config, apiGroup: rbac.authorization.k8s.io}
",
    );
    tokio::task::spawn_blocking(move || {
        admin.ok(&["apply", "-f", &grants]);
        assert_eq!(alice.ok(&["get", "cm", "settings", "-n", "team-a", "-o", "jsonpath={.data.mode}"]), "enabled");
        let (ok, text) = alice.run(&["delete", "cm", "settings", "-n", "team-a"]);
        assert!(!ok);
        assert!(text.contains(r#"Error from server (Forbidden): configmaps "settings" is forbidden: User "alice" cannot delete resource "configmaps" in API group "" in the namespace "team-a""#), "{text}");
        let (ok, text) = alice.run(&["get", "cm", "-n", "default"]);
        assert!(!ok && text.contains(r#"User "alice" cannot list resource "configmaps" in API group "" in the namespace "default""#), "{text}");
        let (ok, text) = alice.run(&["get", "cm", "-A"]);
        assert!(!ok && text.contains("at the cluster scope"), "{text}");
        let (ok, text) = alice.run(&["get", "secret", "other", "-n", "team-a"]);
        assert!(!ok && text.contains("Forbidden"), "resourceNames limit the grant: {text}");
        let (_, text) = alice.run(&["get", "secret", "allowed", "-n", "team-a"]);
        assert!(text.contains("NotFound"), "the named secret may be read (it just does not exist): {text}");
        // A list of exactly the named object is authorized as that name...
        let (ok, text) = alice.run(&["get", "secrets", "-n", "team-a", "--field-selector", "metadata.name=allowed"]);
        assert!(ok, "{text}");
        // ...a list of everything is not.
        let (ok, text) = alice.run(&["get", "secrets", "-n", "team-a"]);
        assert!(!ok && text.contains("cannot list resource \"secrets\""), "{text}");
        let _ = std::fs::remove_dir_all(&admin.dir);
        let _ = std::fs::remove_dir_all(&alice.dir);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_schemas_default_prune_and_validate() {
    let running = aip_fake_apiserver::start(Options::default()).await.unwrap();
    let k = Kubectl::new(&running, ADMIN_TOKEN, "schema");
    let crd = k.file(
        "crd.yaml",
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.io}
spec:
  group: example.io
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1, maximum: 10}
                mode: {type: string, enum: [fast, safe], default: safe}
",
    );
    let gadget = |k: &Kubectl, name: &str, spec: &str| {
        k.file(
            name,
            &format!(
                "apiVersion: example.io/v1\nkind: Gadget\nmetadata: {{name: g}}\nspec: {spec}\n"
            ),
        )
    };
    tokio::task::spawn_blocking(move || {
        k.ok(&["apply", "-f", &crd]);
        k.ok(&["wait", "--for=condition=Established", "crd/gadgets.example.io"]);
        let (ok, text) = k.run(&["apply", "-f", &gadget(&k, "bad.yaml", "{size: 11}")]);
        assert!(!ok);
        assert!(
            text.contains(r#"Gadget.example.io "g" is invalid: spec.size: Invalid value: 11: should be less than or equal to 10"#),
            "{text}"
        );
        let (ok, text) = k.run(&["apply", "-f", &gadget(&k, "unknown.yaml", "{size: 2, color: red}")]);
        assert!(!ok && text.contains(r#"strict decoding error: unknown field "spec.color""#), "{text}");
        k.ok(&["apply", "--validate=false", "-f", &gadget(&k, "lenient.yaml", "{size: 2, color: red}")]);
        assert_eq!(k.ok(&["get", "gadget", "g", "-o", "jsonpath={.spec}"]), r#"{"mode":"safe","size":2}"#, "defaulted and pruned");
        let _ = std::fs::remove_dir_all(&k.dir);
    })
    .await
    .unwrap();
}

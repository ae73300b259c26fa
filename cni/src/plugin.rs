//! The CNI protocol (containernetworking/cni SPEC.md) as a chained plugin
//! speaks it: the operation in `CNI_COMMAND`, the sandbox's network
//! namespace in `CNI_NETNS`, the pod in `CNI_ARGS`, the configuration with
//! the previous plugin's result on stdin; the result (that previous result,
//! unchanged: this plugin adds no interface) or an error object on stdout.
//!
//! What it decides, and nothing else (looking the pod up and programming
//! its namespace are behind [`Pods`] and [`Program`]):
//! - a pod without [`aip_api::egress_lock::LOCK_ANNOTATION`] passes
//!   untouched, and so does any pod when its lookup fails: a broken plugin
//!   never fails a pod that is not governed. A governed pod whose lookup
//!   failed is caught by its own validation container, which fails unless
//!   the lock refuses it (fail closed in the pod, not on the node);
//! - a governed pod whose rules cannot be programmed fails its ADD: the
//!   kubelet retries the sandbox and shows the message in the pod's events;
//! - DEL and CHECK succeed: the rules live in the pod's network namespace
//!   and go with it.

use std::collections::BTreeMap;

use aip_api::egress_lock::{LOCK_ANNOTATION, Lock};
use serde_json::{Value, json};

/// The versions of the specification this plugin speaks.
pub const VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// An error as the specification's error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    fn new(code: u32, msg: &str, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.to_owned(),
            details: details.into(),
        }
    }

    /// The object printed on stdout.
    pub fn to_json(&self, version: &str) -> Value {
        json!({"cniVersion": version, "code": self.code, "msg": self.msg, "details": self.details})
    }
}

/// Error codes of the specification, and this plugin's own (100 and up).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENVIRONMENT: u32 = 4;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const LOCK_ANNOTATION: u32 = 100;
    pub const PROGRAMMING: u32 = 101;
}

/// The configuration this plugin reads from its entry in the list.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    #[serde(default)]
    pub cni_version: String,
    /// The kubeconfig the installer wrote (the DaemonSet's identity, which
    /// may read pods).
    #[serde(default)]
    pub kubeconfig: Option<String>,
    #[serde(default)]
    pub prev_result: Option<Value>,
}

/// How the plugin finds a pod's lock.
pub trait Pods {
    /// The pod's [`LOCK_ANNOTATION`], if it has one.
    fn lock_annotation(&self, namespace: &str, name: &str) -> Result<Option<String>, String>;
}

/// How the plugin programs a network namespace.
pub trait Program {
    fn lock(&self, netns: &str, lock: &Lock) -> Result<(), String>;
}

/// What one invocation printed and whether it succeeded.
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub stdout: Option<Value>,
    pub ok: bool,
    /// One line for the runtime's log (stderr): what was done and why.
    pub said: Option<String>,
}

/// Runs one invocation: `env` is the CNI_ variables, `stdin` the
/// configuration.
pub fn run(
    env: &BTreeMap<String, String>,
    stdin: &[u8],
    pods: &dyn Pods,
    program: &dyn Program,
) -> Answer {
    let command = env.get("CNI_COMMAND").map(String::as_str).unwrap_or("");
    if command == "VERSION" {
        return Answer {
            stdout: Some(json!({"cniVersion": "1.1.0", "supportedVersions": VERSIONS})),
            ok: true,
            said: None,
        };
    }
    let config: Config = match serde_json::from_slice(stdin) {
        Ok(c) => c,
        Err(e) => {
            return failed(
                "1.0.0",
                CniError::new(
                    code::DECODE,
                    "cannot decode the network configuration",
                    e.to_string(),
                ),
            );
        }
    };
    let version = if config.cni_version.is_empty() {
        "1.0.0".to_owned()
    } else {
        config.cni_version.clone()
    };
    if !VERSIONS.contains(&version.as_str()) {
        return failed(
            &version,
            CniError::new(
                code::INCOMPATIBLE_VERSION,
                "incompatible CNI version",
                format!("aip-cni speaks {}", VERSIONS.join(", ")),
            ),
        );
    }
    match command {
        "ADD" => add(env, config, &version, pods, program),
        "DEL" | "CHECK" | "GC" | "STATUS" => Answer {
            stdout: None,
            ok: true,
            said: None,
        },
        other => failed(
            &version,
            CniError::new(
                code::INVALID_ENVIRONMENT,
                "unknown CNI_COMMAND",
                format!("{other:?} (expected ADD, DEL, CHECK, VERSION, GC or STATUS)"),
            ),
        ),
    }
}

fn add(
    env: &BTreeMap<String, String>,
    config: Config,
    version: &str,
    pods: &dyn Pods,
    program: &dyn Program,
) -> Answer {
    let Some(previous) = config.prev_result else {
        return failed(
            version,
            CniError::new(
                code::INVALID_CONFIG,
                "aip-cni is a chained plugin",
                "it must follow the plugin that creates the pod's interface in a .conflist (no prevResult)",
            ),
        );
    };
    let pass = |said: Option<String>| Answer {
        stdout: Some(previous.clone()),
        ok: true,
        said,
    };
    let args = cni_args(env.get("CNI_ARGS").map(String::as_str).unwrap_or(""));
    let (Some(namespace), Some(name)) = (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME"))
    else {
        return pass(None);
    };
    let annotation = match pods.lock_annotation(namespace, name) {
        Ok(Some(text)) => text,
        Ok(None) => return pass(None),
        Err(e) => {
            return pass(Some(format!(
                "aip-cni: cannot look up pod {namespace}/{name} ({e}); left unlocked: if it is governed, its validation container stops it"
            )));
        }
    };
    let lock: Lock = match serde_json::from_str(&annotation) {
        Ok(lock) => lock,
        Err(e) => {
            return failed(
                version,
                CniError::new(
                    code::LOCK_ANNOTATION,
                    "the pod's egress lock cannot be read",
                    format!("annotation {LOCK_ANNOTATION} of pod {namespace}/{name}: {e}"),
                ),
            );
        }
    };
    let Some(netns) = env.get("CNI_NETNS").filter(|n| !n.is_empty()) else {
        return failed(
            version,
            CniError::new(
                code::INVALID_ENVIRONMENT,
                "no CNI_NETNS",
                format!(
                    "pod {namespace}/{name} is to be locked, and the runtime gave no network namespace"
                ),
            ),
        );
    };
    match program.lock(netns, &lock) {
        Ok(()) => pass(Some(format!(
            "aip-cni: locked the egress of pod {namespace}/{name} (rules {})",
            lock.digest()
        ))),
        Err(e) => failed(
            version,
            CniError::new(
                code::PROGRAMMING,
                "cannot lock the pod's egress",
                format!("pod {namespace}/{name}: {e}"),
            ),
        ),
    }
}

fn failed(version: &str, error: CniError) -> Answer {
    Answer {
        said: Some(format!("aip-cni: {error}")),
        stdout: Some(error.to_json(version)),
        ok: false,
    }
}

/// `K=V;K=V` as a map (a pair without `=` is skipped).
pub fn cni_args(text: &str) -> BTreeMap<String, String> {
    text.split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::RefCell;

    use super::*;

    struct Fixed(Result<Option<String>, String>);
    impl Pods for Fixed {
        fn lock_annotation(&self, _: &str, _: &str) -> Result<Option<String>, String> {
            self.0.clone()
        }
    }

    #[derive(Default)]
    struct Recorded(RefCell<Vec<(String, Lock)>>, Option<String>);
    impl Program for Recorded {
        fn lock(&self, netns: &str, lock: &Lock) -> Result<(), String> {
            self.0.borrow_mut().push((netns.to_owned(), lock.clone()));
            self.1.clone().map_or(Ok(()), Err)
        }
    }

    fn env(command: &str) -> BTreeMap<String, String> {
        [
            ("CNI_COMMAND", command),
            ("CNI_NETNS", "/var/run/netns/cni-1"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=agents;K8S_POD_NAME=agent-1",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    const PREVIOUS: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.224.0.5/24"}]}"#;

    fn config() -> Vec<u8> {
        format!(r#"{{"cniVersion":"1.0.0","name":"k8s","type":"aip-cni","prevResult":{PREVIOUS}}}"#)
            .into_bytes()
    }

    const LOCK: &str = r#"{"sidecarUid":1337,"dns":["10.96.0.10"],"allow":[]}"#;

    #[test]
    fn a_governed_pod_is_locked_and_the_previous_result_passes_on() {
        let program = Recorded::default();
        let answer = run(
            &env("ADD"),
            &config(),
            &Fixed(Ok(Some(LOCK.into()))),
            &program,
        );
        assert!(answer.ok);
        assert_eq!(
            answer.stdout.unwrap(),
            serde_json::from_str::<Value>(PREVIOUS).unwrap()
        );
        let done = program.0.borrow();
        assert_eq!(done[0].0, "/var/run/netns/cni-1");
        assert_eq!(done[0].1.sidecar_uid, 1337);
    }

    #[test]
    fn a_pod_that_is_not_governed_or_cannot_be_looked_up_passes_untouched() {
        for pods in [Fixed(Ok(None)), Fixed(Err("connection refused".into()))] {
            let program = Recorded::default();
            let answer = run(&env("ADD"), &config(), &pods, &program);
            assert!(answer.ok, "{answer:?}");
            assert!(program.0.borrow().is_empty());
        }
    }

    #[test]
    fn a_lock_that_cannot_be_read_or_programmed_fails_the_sandbox_naming_the_pod() {
        let answer = run(
            &env("ADD"),
            &config(),
            &Fixed(Ok(Some("{".into()))),
            &Recorded::default(),
        );
        assert!(!answer.ok);
        let said = answer.stdout.unwrap();
        assert_eq!(said["code"], code::LOCK_ANNOTATION);
        assert!(
            said["details"]
                .as_str()
                .unwrap()
                .contains("aip.io/egress-lock of pod agents/agent-1")
        );

        let broken = Recorded(
            RefCell::default(),
            Some("iptables-restore: not found".into()),
        );
        let answer = run(
            &env("ADD"),
            &config(),
            &Fixed(Ok(Some(LOCK.into()))),
            &broken,
        );
        assert!(!answer.ok);
        assert_eq!(answer.stdout.unwrap()["code"], code::PROGRAMMING);
    }

    #[test]
    fn del_and_check_succeed_and_version_lists_the_spec_versions() {
        for command in ["DEL", "CHECK"] {
            let answer = run(
                &env(command),
                &config(),
                &Fixed(Err("unused".into())),
                &Recorded::default(),
            );
            assert_eq!(
                answer,
                Answer {
                    stdout: None,
                    ok: true,
                    said: None
                }
            );
        }
        let answer = run(&env("VERSION"), b"", &Fixed(Ok(None)), &Recorded::default());
        assert_eq!(answer.stdout.unwrap()["supportedVersions"][3], "1.0.0");
    }

    #[test]
    fn a_standalone_use_or_an_unknown_version_is_refused() {
        let alone = br#"{"cniVersion":"1.0.0","name":"k8s","type":"aip-cni"}"#;
        let answer = run(&env("ADD"), alone, &Fixed(Ok(None)), &Recorded::default());
        assert_eq!(answer.stdout.unwrap()["code"], code::INVALID_CONFIG);
        let future = br#"{"cniVersion":"9.0.0","name":"k8s","type":"aip-cni","prevResult":{}}"#;
        let answer = run(&env("ADD"), future, &Fixed(Ok(None)), &Recorded::default());
        assert_eq!(answer.stdout.unwrap()["code"], code::INCOMPATIBLE_VERSION);
    }
}

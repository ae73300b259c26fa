//! The resource types the server serves: the built-in kinds this project
//! uses, and whatever installed CustomResourceDefinitions add.

use serde_json::{Value, json};

/// One servable resource type at one group/version.
#[derive(Debug, Clone, PartialEq)]
pub struct Kind {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    /// Lowercase plural, as in the URL.
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource (status writes there only).
    pub status: bool,
    /// Create-only review kinds (TokenReview, SubjectAccessReview): never
    /// stored, answered at once.
    pub review: bool,
    /// Printer columns for `kubectl get` (CRDs), as in the CRD.
    pub columns: Vec<Value>,
    /// The CRD's structural schema for this version, if any.
    pub schema: Option<Value>,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The key objects of this type are stored under (all versions of a
    /// group share storage).
    pub fn resource(&self) -> Resource {
        Resource {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    fn verbs(&self) -> Vec<&'static str> {
        if self.review {
            vec!["create"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }

    /// This kind in an APIResourceList.
    pub fn discovery(&self) -> Vec<Value> {
        let mut out = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs(),
            "shortNames": self.short_names,
            "categories": self.categories,
        })];
        if self.status {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.plural == "serviceaccounts" {
            out.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
        out
    }
}

/// Where objects live: a group and a plural, across versions.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resource {
    pub group: String,
    pub plural: String,
}

fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
) -> Kind {
    Kind {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
        categories: Vec::new(),
        status: false,
        review: false,
        columns: Vec::new(),
        schema: None,
    }
}

/// The built-in kinds served.
pub fn builtins() -> Vec<Kind> {
    let mut kinds = vec![
        builtin("", "v1", "namespaces", "Namespace", false, &["ns"]),
        builtin("", "v1", "secrets", "Secret", true, &[]),
        builtin("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
        builtin("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"]),
        builtin("", "v1", "pods", "Pod", true, &["po"]),
        builtin("", "v1", "events", "Event", true, &["ev"]),
        builtin("events.k8s.io", "v1", "events", "Event", true, &["ev"]),
        builtin("coordination.k8s.io", "v1", "leases", "Lease", true, &[]),
        // Stored only (no controllers act on them): enough for a Helm
        // chart's manifests to install with kubectl.
        builtin("", "v1", "services", "Service", true, &["svc"]),
        builtin("apps", "v1", "deployments", "Deployment", true, &["deploy"]),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
        ),
        builtin(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            &[],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            &[],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
        ),
        builtin(
            "authentication.k8s.io",
            "v1",
            "tokenreviews",
            "TokenReview",
            false,
            &[],
        ),
        builtin(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
            false,
            &[],
        ),
    ];
    for k in &mut kinds {
        k.status = matches!(
            (k.group.as_str(), k.plural.as_str()),
            ("", "pods") | ("", "namespaces") | ("apiextensions.k8s.io", _)
        );
        k.review = k.plural.ends_with("reviews");
    }
    kinds
}

/// The kinds a CustomResourceDefinition object defines (one per served
/// version), or why it defines none.
pub fn from_crd(crd: &Value) -> Result<Vec<Kind>, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let text = |path: &str| {
        spec.pointer(path)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("spec{}: required", path.replace('/', ".")))
    };
    let group = text("/group")?;
    let plural = text("/names/plural")?;
    let kind = text("/names/kind")?;
    let singular = text("/names/singular").unwrap_or_else(|_| kind.to_ascii_lowercase());
    let namespaced = match text("/scope")?.as_str() {
        "Namespaced" => true,
        "Cluster" => false,
        other => {
            return Err(format!(
                "spec.scope: must be Namespaced or Cluster, found {other:?}"
            ));
        }
    };
    let strings = |path: &str| crate::values::strings(spec.pointer(path));
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions: required")?;
    let mut kinds = Vec::new();
    for v in versions {
        if v.get("served") == Some(&Value::Bool(false)) {
            continue;
        }
        let version = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("spec.versions[].name: required")?;
        kinds.push(Kind {
            group: group.clone(),
            version: version.to_owned(),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: strings("/names/shortNames"),
            categories: strings("/names/categories"),
            status: v.pointer("/subresources/status").is_some(),
            review: false,
            columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
        });
    }
    Ok(kinds)
}

//! `kubectl aip grant CONNECTION`: lets the operator read exactly the
//! Secrets one ToolConnection names, with a Role limited by resourceNames
//! and a RoleBinding to the operator's service account. The operator holds
//! no Secret access of its own. Kubernetes refuses to create a Role
//! granting more than its author holds, so only someone who may read those
//! Secrets can grant them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aip_api::ToolConnection;
use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, ResourceAttributes, SubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use crate::approvals::Target;

const MANAGER: &str = "kubectl-aip";
/// How long `grant` waits for the API server's authorizer to see the new
/// binding (its RBAC cache follows writes within moments, more under load).
const CONFIRM_WITHIN: Duration = Duration::from_secs(15);

/// `--operator NAMESPACE/NAME` split in two.
pub fn operator_account(operator: &str) -> anyhow::Result<(&str, &str)> {
    operator
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| {
            anyhow::anyhow!("--operator must be NAMESPACE/SERVICEACCOUNT, found {operator:?}")
        })
}

/// Writes the Role and RoleBinding for `connection`; what was granted.
pub async fn grant(target: &Target, connection: &str, operator: &str) -> anyhow::Result<String> {
    let (sa_namespace, sa_name) = operator_account(operator)?;
    let ns = target.namespace();
    let connections: Api<ToolConnection> = Api::namespaced(target.client(), ns);
    let tc = connections
        .get(connection)
        .await
        .map_err(|e| target.server_error(e))?;
    let secrets: BTreeSet<String> = tc
        .spec
        .secret_refs()
        .into_iter()
        .map(|(_, r)| r.name.clone())
        .collect();
    if secrets.is_empty() {
        return Ok(format!(
            "toolconnection {connection} names no Secret: nothing to grant"
        ));
    }
    let name = format!("aip-credentials-{connection}");
    let meta = || ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.to_owned()),
        labels: Some(
            [
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    MANAGER.to_owned(),
                ),
                ("aip.io/toolconnection".to_owned(), connection.to_owned()),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".to_owned()]),
            // list and watch by name: the operator watches each Secret.
            verbs: vec!["get".to_owned(), "list".to_owned(), "watch".to_owned()],
            resource_names: Some(secrets.iter().cloned().collect()),
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: sa_name.to_owned(),
            namespace: Some(sa_namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    let apply = PatchParams::apply(MANAGER).force();
    Api::<Role>::namespaced(target.client(), ns)
        .patch(&name, &apply, &Patch::Apply(&role))
        .await
        .map_err(|e| target.server_error(e))?;
    Api::<RoleBinding>::namespaced(target.client(), ns)
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .map_err(|e| target.server_error(e))?;
    let user = format!("system:serviceaccount:{sa_namespace}:{sa_name}");
    let confirmed = confirm(target, &user, &secrets).await?;
    Ok(format!(
        "role.rbac.authorization.k8s.io/{name} granted: {operator} may read Secret(s) {} in namespace {ns}{confirmed}",
        secrets.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Asks the API server until it says `user` may get every Secret, so that
/// what `grant` prints is true when it returns. Someone who may not ask
/// (no `create` on localsubjectaccessreviews) is told it is unconfirmed.
async fn confirm(
    target: &Target,
    user: &str,
    secrets: &BTreeSet<String>,
) -> anyhow::Result<&'static str> {
    let ns = target.namespace();
    let reviews: Api<LocalSubjectAccessReview> = Api::namespaced(target.client(), ns);
    let deadline = Instant::now() + CONFIRM_WITHIN;
    let mut pause = Duration::from_millis(50);
    for secret in secrets {
        let review = LocalSubjectAccessReview {
            metadata: ObjectMeta {
                namespace: Some(ns.to_owned()),
                ..ObjectMeta::default()
            },
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(ns.to_owned()),
                    verb: Some("get".to_owned()),
                    resource: Some("secrets".to_owned()),
                    name: Some(secret.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            status: None,
        };
        loop {
            let allowed = match reviews.create(&Default::default(), &review).await {
                Ok(answer) => answer.status.is_some_and(|s| s.allowed),
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    return Ok(" (not confirmed: you may not create localsubjectaccessreviews)");
                }
                Err(e) => return Err(target.server_error(e)),
            };
            if allowed {
                break;
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the Role and RoleBinding are written, but after {}s the API server still says {user} may not get Secret {secret} in namespace {ns}",
                    CONFIRM_WITHIN.as_secs()
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
    Ok("")
}

//! The people in the project's stories. On the local control plane each
//! is a static bearer token (`--token-auth-file`); on any other cluster the
//! administrator's credentials impersonate them. Neither grants anything
//! beyond what the groups are bound to: tests bind the roles they need
//! (the chart's `aip-approver` to `approvers`, say).

/// A test identity. Its name, uid and groups are the same on every cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum User {
    /// The cluster administrator: group `system:masters`, which no RBAC
    /// rule can restrict.
    Admin,
    /// An approver: group `approvers`.
    Alice,
    /// A platform engineer who writes ToolConnections and policies:
    /// group `platform`.
    Bob,
    /// Nobody in particular: no groups beyond `system:authenticated`.
    Carol,
    /// Someone who may only look: group `viewers`.
    Victor,
}

impl User {
    pub const ALL: [User; 5] = [
        User::Admin,
        User::Alice,
        User::Bob,
        User::Carol,
        User::Victor,
    ];

    /// The user name the API server reports (`userInfo.username`). On a
    /// cluster reached through `AIP_TEST_KUBECONFIG` the administrator is
    /// whoever that kubeconfig's credentials belong to.
    pub fn name(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::Alice => "alice",
            User::Bob => "bob",
            User::Carol => "carol",
            User::Victor => "victor",
        }
    }

    pub fn uid(self) -> &'static str {
        match self {
            User::Admin => "u-admin",
            User::Alice => "u-alice",
            User::Bob => "u-bob",
            User::Carol => "u-carol",
            User::Victor => "u-victor",
        }
    }

    /// The groups given to the user (the API server adds
    /// `system:authenticated` to every one).
    pub fn groups(self) -> &'static [&'static str] {
        match self {
            User::Admin => &["system:masters"],
            User::Alice => &["approvers"],
            User::Bob => &["platform"],
            User::Carol => &[],
            User::Victor => &["viewers"],
        }
    }
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One line of a `--token-auth-file`: `token,user,uid,"group1,group2"`.
/// A user without groups has no fourth column: kube-apiserver reads `""`
/// as one group named "".
pub(crate) fn token_file_line(user: User, token: &str) -> String {
    let (name, uid) = (user.name(), user.uid());
    match user.groups() {
        [] => format!("{token},{name},{uid}\n"),
        groups => format!("{token},{name},{uid},\"{}\"\n", groups.join(",")),
    }
}

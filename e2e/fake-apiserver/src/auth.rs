//! Authentication: bearer tokens from a static token file, as
//! kube-apiserver's `--token-auth-file` reads it
//! (`token,user,uid,"group1,group2"` per line).

use std::collections::{BTreeMap, HashMap};

use crate::status::ApiError;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// What the authenticator adds: for a pod-bound service-account token,
    /// `authentication.kubernetes.io/pod-name` and `.../pod-uid`.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// token -> user.
#[derive(Debug, Clone, Default)]
pub struct Tokens(HashMap<String, User>);

impl Tokens {
    /// Parses a token file's text; every bad line is named.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = split_csv(line);
            if fields.len() < 3 {
                return Err(format!("line {}: want token,user,uid[,\"groups\"]", i + 1));
            }
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let user = User {
                name: fields[1].clone(),
                uid: fields[2].clone(),
                groups,
                extra: BTreeMap::new(),
            };
            users.insert(fields[0].clone(), user);
        }
        Ok(Tokens(users))
    }

    /// Every (token, user).
    pub fn iter(&self) -> impl Iterator<Item = (&String, &User)> {
        self.0.iter()
    }

    pub fn insert(&mut self, token: &str, user: User) {
        self.0.insert(token.to_owned(), user);
    }

    /// The user a bearer token belongs to; 401 for anything else.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<User, ApiError> {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(ApiError::unauthorized)?;
        let mut user = self
            .0
            .get(token.trim())
            .cloned()
            .ok_or_else(ApiError::unauthorized)?;
        if !user.groups.iter().any(|g| g == "system:authenticated") {
            user.groups.push("system:authenticated".into());
        }
        Ok(user)
    }
}

/// Splits one CSV line, honouring double quotes.
fn split_csv(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn token_file_lines() {
        let t = Tokens::parse(
            "# users\nadmin-token,admin,1,\"system:masters\"\nt2,alice,2,\"dev,ops\"\nt3,bob,3\n",
        )
        .unwrap();
        let alice = t.authenticate(Some("Bearer t2")).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.groups, ["dev", "ops", "system:authenticated"]);
        assert_eq!(
            t.authenticate(Some("Bearer t3")).unwrap().groups,
            ["system:authenticated"]
        );
        assert_eq!(t.authenticate(Some("Bearer nope")).unwrap_err().code, 401);
        assert_eq!(t.authenticate(None).unwrap_err().code, 401);
        assert!(Tokens::parse("just-a-token\n").is_err());
    }
}

//! Label selectors (matchLabels and matchExpressions), as Kubernetes
//! evaluates them, checked once and then matched many times.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A selector Kubernetes would not accept, at its path within the selector
/// (`matchExpressions[i]...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "matchExpressions[{index}].operator: {operator:?} is not one of In, NotIn, Exists, DoesNotExist"
    )]
    UnknownOperator { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} needs values")]
    MissingValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} takes no values")]
    UnexpectedValues { index: usize, operator: String },
}

impl Selector {
    /// Absent or empty selects everything, as a NetworkPolicy's `{}` does.
    pub fn from_label_selector(
        selector: Option<&LabelSelector>,
    ) -> Result<Selector, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Selector::default());
        };
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
            .collect();
        for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
            let values = e.values.clone().unwrap_or_default();
            let (requirement, needs_values) = match e.operator.as_str() {
                "In" => (Requirement::In(e.key.clone(), values.clone()), true),
                "NotIn" => (Requirement::NotIn(e.key.clone(), values.clone()), true),
                "Exists" => (Requirement::Exists(e.key.clone()), false),
                "DoesNotExist" => (Requirement::DoesNotExist(e.key.clone()), false),
                other => {
                    return Err(SelectorError::UnknownOperator {
                        index: i,
                        operator: other.to_owned(),
                    });
                }
            };
            if needs_values == values.is_empty() {
                let (index, operator) = (i, e.operator.clone());
                return Err(if needs_values {
                    SelectorError::MissingValues { index, operator }
                } else {
                    SelectorError::UnexpectedValues { index, operator }
                });
            }
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expression(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn absent_and_empty_select_everything() {
        let any = labels(&[("x", "y")]);
        assert!(Selector::from_label_selector(None).unwrap().matches(&any));
        let empty = LabelSelector::default();
        assert!(
            Selector::from_label_selector(Some(&empty))
                .unwrap()
                .matches(&BTreeMap::new())
        );
    }

    #[test]
    fn labels_and_expressions_are_anded() {
        let s = LabelSelector {
            match_labels: Some(labels(&[("app", "agent")])),
            match_expressions: Some(vec![
                expression("tier", "In", &["a", "b"]),
                expression("canary", "DoesNotExist", &[]),
                expression("team", "NotIn", &["red"]),
                expression("zone", "Exists", &[]),
            ]),
        };
        let s = Selector::from_label_selector(Some(&s)).unwrap();
        assert!(s.matches(&labels(&[("app", "agent"), ("tier", "a"), ("zone", "1")])));
        assert!(s.matches(&labels(&[
            ("app", "agent"),
            ("tier", "b"),
            ("zone", "1"),
            ("team", "blue")
        ])));
        assert!(!s.matches(&labels(&[("app", "agent"), ("tier", "c"), ("zone", "1")])));
        assert!(!s.matches(&labels(&[
            ("app", "agent"),
            ("tier", "a"),
            ("zone", "1"),
            ("canary", "")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "agent"),
            ("tier", "a"),
            ("zone", "1"),
            ("team", "red")
        ])));
        assert!(!s.matches(&labels(&[("app", "agent"), ("tier", "a")])));
    }

    #[test]
    fn malformed_expressions_are_named() {
        let bad = |e| LabelSelector {
            match_expressions: Some(vec![e]),
            ..LabelSelector::default()
        };
        let e =
            Selector::from_label_selector(Some(&bad(expression("a", "Like", &["x"])))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matchExpressions[0].operator: \"Like\" is not one of In, NotIn, Exists, DoesNotExist"
        );
        let e = Selector::from_label_selector(Some(&bad(expression("a", "In", &[])))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matchExpressions[0]: operator In needs values"
        );
        let e = Selector::from_label_selector(Some(&bad(expression("a", "Exists", &["x"]))))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "matchExpressions[0]: operator Exists takes no values"
        );
    }
}

//! crds/aip.io.yaml, and the chart's copy, must be exactly what the Rust
//! types generate.

#[test]
fn checked_in_crds_match_the_rust_types() {
    for copy in ["crds/aip.io.yaml", "charts/aip/crds/aip.io.yaml"] {
        let path = format!("{}/../{copy}", env!("CARGO_MANIFEST_DIR"));
        let on_disk = std::fs::read_to_string(&path).expect("the CRDs are checked in");
        assert!(
            on_disk == aip_api::crds_yaml(),
            "{copy} is stale: run `cargo run -p aip-api --bin crdgen > {copy}`"
        );
    }
}

#[test]
fn every_kind_is_in_the_aip_category_with_its_own_short_name() {
    let crds = aip_api::crds();
    let shorts: Vec<String> = crds
        .iter()
        .flat_map(|c| c.spec.names.short_names.clone().unwrap_or_default())
        .collect();
    assert_eq!(shorts, ["agp", "tconn", "apr", "egl"]);
    for crd in &crds {
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["aip".to_owned()][..])
        );
        assert_eq!(crd.spec.scope, "Namespaced");
    }
}

/// What `kubectl explain` shows for each field is its doc comment: every
/// property has one of its own (not the generic text of its type, such as
/// k8s-openapi's "Time is a wrapper around time.Time ...").
#[test]
fn every_field_is_documented() {
    fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        if !schema.is_object() {
            return;
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            let path = format!("{path}.{name}");
            let description = property["description"].as_str().unwrap_or("");
            if description.is_empty() || description.starts_with("Time is a wrapper") {
                missing.push(path.clone());
            }
            walk(&path, property, missing);
        }
        walk(&format!("{path}[]"), &schema["items"], missing);
    }
    let mut missing = Vec::new();
    for crd in aip_api::crds() {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap_or_default();
        walk(
            &crd.spec.names.kind,
            &schema["openAPIV3Schema"],
            &mut missing,
        );
    }
    assert!(missing.is_empty(), "undocumented: {missing:?}");
}

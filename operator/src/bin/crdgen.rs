//! Prints the CRDs as YAML (what crds/aip.io.yaml holds).

fn main() {
    print!("{}", aip_operator::api::crds_yaml());
}

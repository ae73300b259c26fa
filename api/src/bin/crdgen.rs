//! Prints the CRDs as YAML (what crds/aip.io.yaml holds).

fn main() {
    print!("{}", aip_api::crds_yaml());
}

//! Starts a control plane and keeps it until Ctrl-C (or until this
//! process is killed): for kubectl by hand, or to run the tests of another
//! checkout against it with `AIP_TEST_KUBECONFIG`.
//!
//! ```sh
//! cargo run -p aip-kube-test --example control_plane
//! ```

use aip_kube_test::{ControlPlane, User};

#[tokio::main]
async fn main() -> Result<(), aip_kube_test::Error> {
    let control_plane = ControlPlane::start().await?;
    println!(
        "{} {} ready in {:.1} s",
        control_plane.url(),
        control_plane.version(),
        control_plane.started_in().as_secs_f64()
    );
    if let Some(dir) = control_plane.dir() {
        println!("logs, certificates and keys: {}", dir.display());
    }
    for user in User::ALL {
        println!(
            "KUBECONFIG={}  # {user}, groups {:?}",
            control_plane.kubeconfig_file(user).display(),
            user.groups()
        );
    }
    println!("Ctrl-C stops it");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("cannot wait for Ctrl-C ({e}); stopping");
    }
    Ok(())
}

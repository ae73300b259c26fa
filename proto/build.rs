//! Compiles the .proto files with protox (pure Rust), so building needs no
//! system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["aip/config/v1/config.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}

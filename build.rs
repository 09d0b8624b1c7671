//! Generates the control plane's gRPC code from `proto/cluster.proto`. The vendored `protoc`
//! means no system protobuf compiler is needed on any developer's machine or in CI.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // The client is built from a `Channel` we configure ourselves.
        .build_transport(false)
        .compile_with_config(config, &["proto/cluster.proto"], &["proto"])?;
    Ok(())
}

//! Generates the control plane's gRPC code from `proto/cluster.proto`, and the prost types of
//! TensorFlow's `tf.train.Example` from the vendored `proto/tensorflow/` (read by the TFRecord
//! reader), and ONNX's model format from the vendored `proto/onnx/onnx.proto` (written by
//! `trainrun export --format onnx`). The vendored `protoc` means no system protobuf compiler is needed on any
//! developer's machine or in CI.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without these, cargo reruns the script (and so rebuilds the crate) when any file of the
    // package changes, a test or a README included.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // The client is built from a `Channel` we configure ourselves.
        .build_transport(false)
        // Images in a `BytesList` become slices of the record buffer rather than copies.
        .bytes(".tensorflow")
        // Upstream's comments hold indented proto text that rustdoc would run as doctests.
        .disable_comments([".tensorflow", ".onnx"])
        .compile_with_config(
            config,
            &["proto/cluster.proto", "proto/tensorflow/core/example/example.proto", "proto/onnx/onnx.proto"],
            &["proto"],
        )?;
    Ok(())
}

//! Trained models in other tools' formats: `onnx.rs` writes an ONNX graph for ONNX Runtime and
//! the other inference servers people deploy with. `trainrun export` (`run/export.rs`) reads
//! the run and writes the file.

pub mod onnx;

/// `trainrun export --format`: the formats a model can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// An ONNX model (opset 13): dense, convolution, pooling and residual models.
    Onnx,
}

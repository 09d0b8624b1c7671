//! Trained models in other tools' formats: `onnx.rs` writes an ONNX graph for ONNX Runtime and
//! the other inference servers people deploy with; `hf_gpt2.rs` writes a GPT as the folder
//! Hugging Face `transformers` loads, with the run's tokenizer (`hf_tokenizer.rs`). `trainrun export` (`run/export.rs`) reads the run and
//! writes the file or folder.

pub mod hf_gpt2;
pub mod hf_tokenizer;
pub mod onnx;

/// `trainrun export --format`: the formats a model can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// An ONNX model (opset 13): dense, convolution, pooling and residual models.
    Onnx,
    /// A Hugging Face GPT-2 folder (`config.json`, `model.safetensors`) that
    /// `GPT2LMHeadModel.from_pretrained` loads: GPT models.
    #[value(name = "hf_gpt2")]
    HfGpt2,
}

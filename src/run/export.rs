//! `trainrun export RUN_OR_CHECKPOINT --format onnx|hf_gpt2 --out PATH`: the model of a run
//! folder (its final `model.safetensors`), one of its checkpoint folders, or a weights file
//! inside it, written for other tools (an ONNX file, or a Hugging Face GPT-2 folder). The model is the one the run's own `spec.toml` describes (found in
//! the folder or the nearest folder above it), so nothing else need be given. The file is
//! written whole under a temporary name and renamed into place; an `--out` that exists is
//! refused unless `--force` (which replaces the files it writes, nothing else in the folder).
//! A GPT-2 folder holds the run's tokenizer too where `transformers` has one for it
//! (`export/hf_tokenizer.rs`).

use crate::checkpoint::hf_gpt2::Gpt2Shape;
use crate::exit::RunError;
use crate::export::ExportFormat;
use crate::export::hf_tokenizer::TokenizerFiles;
use crate::prepare::{Invocation, prepare};
use std::path::{Path, PathBuf};

/// Writes the model at `path` to `out` in `format`.
pub fn export(
    path: &Path,
    format: ExportFormat,
    out: &Path,
    force: bool,
    env: Vec<(String, String)>,
) -> Result<(), RunError> {
    if out.exists() && !force {
        return Err(RunError::Usage(format!(
            "--out {} exists: an export never writes over a file; give another name, or --force to replace it",
            out.display()
        )));
    }
    let spec = run_spec(path)?;
    let inv = Invocation { spec, sets: Vec::new(), env, quiet: true, task: None, launched: std::time::Instant::now() };
    let p = prepare(&inv)?;
    let model = p.plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = crate::builder::layout(&model);
    let (params, state) = super::sample::weights(path, &layout)?;
    match format {
        ExportFormat::Onnx => {
            let doc = format!("exported by trainrun {} from {}", env!("CARGO_PKG_VERSION"), path.display());
            let unsupported = |e: crate::export::onnx::OnnxError| RunError::Unsupported(e.to_string());
            // A GPT is written whole (its layers have no engine description to walk).
            let (bytes, opset, input) = match Gpt2Shape::of(&p.plan.model) {
                Ok(gpt) => {
                    let t = model.input_shape().0.first().copied().unwrap_or(gpt.n_positions);
                    let bytes =
                        crate::export::onnx::export_gpt(&gpt, &layout, &params, t, &doc).map_err(unsupported)?;
                    (bytes, crate::export::onnx::GPT_OPSET, "int64 token ids")
                }
                Err(_) => {
                    let bytes = crate::export::onnx::export(&model, &p.plan.model.layers, &params, &state, &doc)
                        .map_err(unsupported)?;
                    (bytes, crate::export::onnx::OPSET, "float32")
                }
            };
            write_whole(out, &bytes)?;
            eprintln!(
                "wrote {} ({} bytes, ONNX opset {opset}): input `input` {input} [batch, {}], output `output` float32 \
                 [batch, {}]",
                out.display(),
                bytes.len(),
                shape(&model.input_shape().0),
                shape(&model.output_shape().0)
            );
        }
        ExportFormat::HfGpt2 => {
            let gpt = Gpt2Shape::of(&p.plan.model).map_err(|why| {
                RunError::Unsupported(format!(
                    "--format hf_gpt2 writes a GPT-2, and this run's model is not one: {why}"
                ))
            })?;
            let mut files =
                crate::export::hf_gpt2::files(&gpt, &layout, &params).map_err(|e| RunError::Failure(e.to_string()))?;
            // The tokenizer of the vocabulary the run wrote beside its weights.
            let tokenizer = match super::sample::run_vocabulary(path)? {
                Some((_, vocabulary)) => crate::export::hf_tokenizer::files(&vocabulary, gpt.n_positions)
                    .map_err(|e| RunError::Failure(e.to_string()))?,
                None => TokenizerFiles::Unwritten(format!(
                    "no vocab.json in {} or the folders above it, so the run's tokenizer is unknown",
                    path.display()
                )),
            };
            let tokenizer_note = match tokenizer {
                TokenizerFiles::Written(more) => {
                    files.extend(more);
                    String::new()
                }
                TokenizerFiles::Unwritten(why) => format!("\nno tokenizer files: {why}"),
            };
            std::fs::create_dir_all(out)
                .map_err(|e| RunError::Failure(format!("cannot make the folder {}: {e}", out.display())))?;
            for (name, bytes) in &files {
                write_whole(&out.join(name), bytes)?;
            }
            let names: Vec<&str> = files.iter().map(|f| f.0).collect();
            eprintln!(
                "wrote {} ({}): a GPT-2 of {} layers, {} heads, width {}, {} positions, {} token ids; load it with \
                 transformers' GPT2LMHeadModel.from_pretrained{}{tokenizer_note}",
                out.display(),
                names.join(", "),
                gpt.n_layer,
                gpt.n_head,
                gpt.n_embd,
                gpt.n_positions,
                gpt.vocab_size,
                if names.len() > 2 { " and AutoTokenizer.from_pretrained" } else { "" },
            );
        }
    }
    Ok(())
}

/// Writes `bytes` to `out` whole: under a temporary name beside it, then renamed into place.
fn write_whole(out: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let partial = super::partial_beside(out);
    let written = std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, out));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(RunError::Failure(format!("cannot write {}: {e}", out.display())));
    }
    Ok(())
}

fn shape(dims: &[usize]) -> String {
    dims.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// The run's `spec.toml`: in `path` (a run folder) or the nearest folder above it.
fn run_spec(path: &Path) -> Result<PathBuf, RunError> {
    if !path.exists() {
        return Err(RunError::Usage(format!(
            "{} does not exist: give a run folder, one of its checkpoint folders, or its model.safetensors",
            path.display()
        )));
    }
    path.ancestors().take(4).map(|d| d.join("spec.toml")).find(|f| f.is_file()).ok_or_else(|| {
        RunError::Usage(format!(
            "no spec.toml in {} or the folders above it: export reads the model from the run folder a run wrote \
             (runs/<name>, or a checkpoint folder inside it)",
            path.display()
        ))
    })
}

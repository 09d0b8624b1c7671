//! A trained GPT as a Hugging Face GPT-2 folder: `config.json` and `model.safetensors` as
//! `GPT2LMHeadModel.save_pretrained` writes them, so `GPT2LMHeadModel.from_pretrained(dir)`
//! loads it and computes what trainrun's model computes. The names and the config's keys are
//! `checkpoint/hf_gpt2.rs`'s, which reads such folders back: a round trip is bit-exact.
//!
//! Tensors keep their values and `[in, out]` layout (GPT-2's `Conv1D` uses it too); a tied
//! head is left out, as `transformers` leaves it out, and an untied one is written transposed
//! as `lm_head.weight [vocab, dim]`.

use crate::checkpoint::Layout;
use crate::checkpoint::hf_gpt2::{Gpt2Shape, LM_HEAD};
use safetensors::{Dtype, tensor::TensorView};
use std::collections::HashMap;

/// Why a GPT could not be written as GPT-2.
#[derive(Debug, thiserror::Error)]
pub enum HfExportError {
    /// The model lacks a tensor GPT-2 has (the planned model and its layout disagree: a bug).
    #[error("the model has no tensor `{0}`, which GPT-2's layout needs")]
    Missing(String),
    /// safetensors refused a tensor.
    #[error("cannot encode model.safetensors: {0}")]
    Encode(String),
}

/// The files of the folder, by name: `config.json` and `model.safetensors`.
pub fn files(
    shape: &Gpt2Shape,
    layout: &Layout,
    params: &[f32],
) -> Result<Vec<(&'static str, Vec<u8>)>, HfExportError> {
    let values = |name: &str| {
        layout
            .tensors
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| Some((t.shape.clone(), params.get(t.range())?)))
            .ok_or_else(|| HfExportError::Missing(name.to_string()))
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (hf, ours) in shape.names() {
        let (dims, v) = values(&ours)?;
        tensors.push((format!("transformer.{hf}"), dims, le_bytes(v.iter().copied())));
    }
    if !shape.tie_word_embeddings {
        let (dims, v) = values(LM_HEAD.1)?;
        let &[dim, vocab] = dims.as_slice() else {
            return Err(HfExportError::Missing(format!("{} of shape [dim, vocab]", LM_HEAD.1)));
        };
        let transposed = (0..vocab).flat_map(|o| (0..dim).map(move |i| v[i * vocab + o]));
        tensors.push((LM_HEAD.0.to_string(), vec![vocab, dim], le_bytes(transposed)));
    }
    let views = tensors
        .iter()
        .map(|(name, dims, data)| Ok((name.as_str(), TensorView::new(Dtype::F32, dims.clone(), data)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| HfExportError::Encode(e.to_string()))?;
    // `transformers` refuses a file whose metadata does not say which framework wrote it.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = safetensors::serialize(views, Some(metadata)).map_err(|e| HfExportError::Encode(e.to_string()))?;
    let config = serde_json::to_vec_pretty(&config(shape)).map_err(|e| HfExportError::Encode(e.to_string()))?;
    Ok(vec![("config.json", config), ("model.safetensors", weights)])
}

fn le_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// `config.json`: `GPT2Config`'s keys for this model.
fn config(s: &Gpt2Shape) -> serde_json::Value {
    let mut config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": s.vocab_size,
        "n_positions": s.n_positions,
        "n_embd": s.n_embd,
        "n_layer": s.n_layer,
        "n_head": s.n_head,
        "n_inner": s.n_inner,
        "activation_function": s.activation_function(),
        "layer_norm_epsilon": s.layer_norm_epsilon,
        "resid_pdrop": s.dropout,
        "embd_pdrop": s.dropout,
        "attn_pdrop": s.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": s.tie_word_embeddings,
        "torch_dtype": "float32",
    });
    // GPT-2's own vocabulary ends in `<|endoftext|>`, its begin and end token; another has
    // none (`GPT2Config` would otherwise assume 50256, outside it).
    let end = (s.vocab_size == 50257).then_some(50256);
    config["bos_token_id"] = end.into();
    config["eos_token_id"] = end.into();
    config
}

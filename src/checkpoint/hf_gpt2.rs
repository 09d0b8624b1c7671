//! Hugging Face GPT-2 folders (what `transformers`' `GPT2LMHeadModel.save_pretrained` writes:
//! `config.json` + `model.safetensors`) read into trainrun's GPT, and the names and config both
//! directions share (`export/hf_gpt2.rs` writes such a folder).
//!
//! The two models compute the same function: GPT-2's `Conv1D` stores its weights `[in, out]`,
//! as Keras and trainrun do, and its fused `c_attn` orders the columns queries, keys, values,
//! as trainrun's `attention/qkv/kernel` does, so every tensor maps by name with no transpose;
//! only an untied `lm_head.weight` (`[vocab, dim]`) is transposed into `lm_head/kernel`
//! (`[dim, vocab]`). The attention-mask buffers older `transformers` saved (`attn.bias`,
//! `attn.masked_bias`) are not weights and are skipped; a tied `lm_head.weight` (often absent)
//! is the token embedding again.
//!
//! The config must describe the model the spec builds: sizes (`n_layer`, `n_head`, `n_embd`,
//! `n_positions`, `vocab_size`, `n_inner`), `layer_norm_epsilon`, `activation_function`
//! (`gelu_new` and `gelu_pytorch_tanh` are trainrun's `approximate_gelu = true`, `gelu` the
//! exact form) and `tie_word_embeddings` (a tied GPT-2 also loads into an untied model, whose
//! head starts as the embedding); every key that differs is named with both values at once. Strict, any difference is refused; not strict, only those that change what the loaded
//! weights compute (heads, epsilon, GELU form, attention scaling) are, and size differences
//! show as the tensors that did not load.

use super::CheckpointError;
use crate::model::{LayerConfig, ModelPlan};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A GPT-2 as trainrun builds it: the sizes and options `config.json` states, read off the
/// planned layers (`zoo = "gpt"`, or the same layers written out).
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Shape {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// The MLP's hidden width.
    pub n_inner: usize,
    /// Of the blocks' layer norms and the final one (GPT-2 uses one value for all).
    pub layer_norm_epsilon: f64,
    pub approximate_gelu: bool,
    pub tie_word_embeddings: bool,
    /// Dropout rate in training (written as GPT-2's three `*_pdrop`s).
    pub dropout: f64,
}

impl Gpt2Shape {
    /// The GPT-2 that `plan` builds, or why it is not one (naming the first layer that differs).
    pub fn of(plan: &ModelPlan) -> Result<Self, String> {
        let refuse = |at: usize, what: &str| {
            let kind = plan.layers.get(at).map_or("the end of the model", LayerConfig::kind);
            format!(
                "a GPT-2 is embedding, position_embedding, [dropout], transformer_block × n_layer, layer_norm, \
                 lm_head (`zoo = \"gpt\"`); layer {} is {kind} where {what} belongs",
                at + 1
            )
        };
        let mut layers = plan.layers.iter().enumerate().peekable();
        let Some((_, LayerConfig::Embedding { output_dim })) = layers.next() else {
            return Err(refuse(0, "an embedding"));
        };
        let Some((_, LayerConfig::PositionEmbedding { block_size })) = layers.next() else {
            return Err(refuse(1, "a position_embedding"));
        };
        layers.next_if(|(_, l)| matches!(l, LayerConfig::Dropout { .. }));
        let mut blocks = Vec::new();
        while let Some((
            _,
            LayerConfig::TransformerBlock {
                num_heads,
                intermediate_dim,
                dropout,
                layer_norm_epsilon,
                approximate_gelu,
            },
        )) = layers.peek()
        {
            blocks.push((*num_heads, *intermediate_dim, *dropout, *layer_norm_epsilon, *approximate_gelu));
            layers.next();
        }
        let Some(&(n_head, inner, dropout, epsilon, approximate_gelu)) = blocks.first() else {
            return Err(refuse(plan.layers.len().min(2), "a transformer_block"));
        };
        if let Some(i) = blocks.iter().position(|b| *b != blocks[0]) {
            return Err(format!(
                "a GPT-2's blocks are all alike, but transformer_block {} differs from the first (heads, width, dropout, \
                 epsilon or GELU form)",
                i + 1
            ));
        }
        let after = plan.layers.len() - layers.len();
        let Some((_, LayerConfig::LayerNorm { epsilon: final_epsilon })) = layers.next() else {
            return Err(refuse(after, "a layer_norm"));
        };
        if *final_epsilon != epsilon {
            return Err(format!(
                "a GPT-2 has one layer_norm_epsilon, but the blocks use {epsilon} and the final layer_norm {final_epsilon}"
            ));
        }
        let Some((_, LayerConfig::LmHead { tie_embeddings })) = layers.next() else {
            return Err(refuse(after + 1, "an lm_head"));
        };
        if let Some((at, _)) = layers.next() {
            return Err(refuse(at, "nothing (the lm_head is last)"));
        }
        Ok(Self {
            vocab_size: plan.classes,
            n_positions: block_size.get(),
            n_embd: output_dim.get(),
            n_layer: blocks.len(),
            n_head: n_head.get(),
            n_inner: inner.map_or(4 * output_dim.get(), |i| i.get()),
            layer_norm_epsilon: epsilon,
            approximate_gelu,
            tie_word_embeddings: *tie_embeddings,
            dropout,
        })
    }

    /// `activation_function` as `transformers` names this model's GELU.
    pub fn activation_function(&self) -> &'static str {
        if self.approximate_gelu { "gelu_new" } else { "gelu" }
    }

    /// (GPT-2 name, trainrun name) of every tensor both have, GPT-2's without the
    /// `transformer.` prefix `GPT2LMHeadModel` adds; the untied head is [`LM_HEAD`].
    pub fn names(&self) -> Vec<(String, String)> {
        let mut names = vec![
            ("wte.weight".to_string(), "embedding/embeddings".to_string()),
            ("wpe.weight".into(), "position_embedding/embeddings".into()),
        ];
        for i in 0..self.n_layer {
            let block = if i == 0 { "transformer_block".to_string() } else { format!("transformer_block_{i}") };
            for (hf, ours) in [
                ("ln_1.weight", "ln_1/gamma"),
                ("ln_1.bias", "ln_1/beta"),
                ("attn.c_attn.weight", "attention/qkv/kernel"),
                ("attn.c_attn.bias", "attention/qkv/bias"),
                ("attn.c_proj.weight", "attention/attention_output/kernel"),
                ("attn.c_proj.bias", "attention/attention_output/bias"),
                ("ln_2.weight", "ln_2/gamma"),
                ("ln_2.bias", "ln_2/beta"),
                ("mlp.c_fc.weight", "mlp_fc/kernel"),
                ("mlp.c_fc.bias", "mlp_fc/bias"),
                ("mlp.c_proj.weight", "mlp_proj/kernel"),
                ("mlp.c_proj.bias", "mlp_proj/bias"),
            ] {
                names.push((format!("h.{i}.{hf}"), format!("{block}/{ours}")));
            }
        }
        names.extend([
            ("ln_f.weight".into(), "layer_norm/gamma".into()),
            ("ln_f.bias".into(), "layer_norm/beta".into()),
        ]);
        names
    }
}

/// The untied output head: GPT-2's name (`[vocab, dim]`) and trainrun's (`[dim, vocab]`).
pub const LM_HEAD: (&str, &str) = ("lm_head.weight", "lm_head/kernel");

/// The keys of `config.json` trainrun reads, with `GPT2Config`'s defaults for absent ones.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct Gpt2Config {
    model_type: Option<String>,
    vocab_size: usize,
    n_positions: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_inner: Option<usize>,
    activation_function: String,
    layer_norm_epsilon: f64,
    tie_word_embeddings: bool,
    scale_attn_weights: bool,
    scale_attn_by_inverse_layer_idx: bool,
    add_cross_attention: bool,
}

impl Default for Gpt2Config {
    fn default() -> Self {
        Self {
            model_type: None,
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: None,
            activation_function: "gelu_new".into(),
            layer_norm_epsilon: 1e-5,
            tie_word_embeddings: true,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            add_cross_attention: false,
        }
    }
}

/// One way the folder's config differs from the model: the key, its value there, trainrun's,
/// and whether loading anyway would compute something else (not only leave tensors out).
struct Difference {
    key: &'static str,
    theirs: String,
    ours: String,
    changes_function: bool,
}

impl Gpt2Config {
    fn differences(&self, m: &Gpt2Shape) -> Vec<Difference> {
        let mut out = Vec::new();
        let mut diff = |key, theirs: String, ours: String, changes_function| {
            if theirs != ours {
                out.push(Difference { key, theirs, ours, changes_function });
            }
        };
        diff("n_layer", self.n_layer.to_string(), m.n_layer.to_string(), false);
        diff("n_head", self.n_head.to_string(), m.n_head.to_string(), true);
        diff("n_embd", self.n_embd.to_string(), m.n_embd.to_string(), false);
        diff("n_positions", self.n_positions.to_string(), m.n_positions.to_string(), false);
        diff("vocab_size", self.vocab_size.to_string(), m.vocab_size.to_string(), false);
        diff("n_inner", self.n_inner.unwrap_or(4 * self.n_embd).to_string(), m.n_inner.to_string(), false);
        diff("layer_norm_epsilon", self.layer_norm_epsilon.to_string(), m.layer_norm_epsilon.to_string(), true);
        let gelu = match self.activation_function.as_str() {
            "gelu_new" | "gelu_pytorch_tanh" => "tanh-approximated GELU (approximate_gelu = true)",
            "gelu" => "exact GELU (approximate_gelu = false)",
            other => other,
        };
        let ours = if m.approximate_gelu {
            "tanh-approximated GELU (approximate_gelu = true)"
        } else {
            "exact GELU (approximate_gelu = false)"
        };
        diff(
            "activation_function",
            format!("{} = {gelu}", self.activation_function),
            format!("{} = {ours}", m.activation_function()),
            true,
        );
        // A tied GPT-2 loads into an untied model (its head starts as the embedding); the
        // other way round GPT-2's own head would be dropped.
        if !self.tie_word_embeddings && m.tie_word_embeddings {
            diff("tie_word_embeddings", "false".into(), "true".into(), false);
        }
        let scaled = "true (scores divided by √head_dim)".to_string();
        diff(
            "scale_attn_weights",
            format!(
                "{}{}",
                self.scale_attn_weights,
                if self.scale_attn_weights { " (scores divided by √head_dim)" } else { "" }
            ),
            scaled,
            true,
        );
        diff("scale_attn_by_inverse_layer_idx", self.scale_attn_by_inverse_layer_idx.to_string(), "false".into(), true);
        diff("add_cross_attention", self.add_cross_attention.to_string(), "false".into(), true);
        out
    }
}

/// Reads the Hugging Face GPT-2 folder `dir` for a model shaped `model`: the weights file and
/// its tensors renamed to trainrun's paths, as safetensors bytes the warm start reads like its
/// own. Refuses another model type, and a config that differs from the model (see the module).
pub fn read(dir: &Path, model: &Gpt2Shape, strict: bool) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|source| CheckpointError::Io { path: config_path.clone(), source })?;
    let config: Gpt2Config = serde_json::from_str(&text).map_err(|e| CheckpointError::Corrupt {
        path: config_path.clone(),
        reason: format!("not a GPT-2 config: {e}"),
    })?;
    match config.model_type.as_deref() {
        Some("gpt2") => {}
        other => {
            return Err(CheckpointError::Incompatible {
                path: config_path,
                reason: format!(
                    "its model_type is {}; init_from reads Hugging Face folders of model_type \"gpt2\" \
                     (GPT2LMHeadModel) only",
                    other.map_or("absent".to_string(), |t| format!("{t:?}"))
                ),
            });
        }
    }
    let refused: Vec<String> = config
        .differences(model)
        .into_iter()
        .filter(|d| strict || d.changes_function)
        .map(|d| format!("{}: config.json has {}, the spec's model has {}", d.key, d.theirs, d.ours))
        .collect();
    if !refused.is_empty() {
        return Err(CheckpointError::Incompatible {
            path: config_path,
            reason: format!(
                "the GPT-2 it describes is not the spec's model ([model.gpt] or its layers):\n  {}",
                refused.join("\n  ")
            ),
        });
    }
    let file = dir.join("model.safetensors");
    if !file.is_file() {
        let other = ["model.safetensors.index.json", "pytorch_model.bin"].into_iter().find(|f| dir.join(f).is_file());
        return Err(CheckpointError::Incompatible {
            path: dir.to_path_buf(),
            reason: format!(
                "it has no model.safetensors{}: save it with `model.save_pretrained(dir, safe_serialization=True, \
                 max_shard_size=\"100GB\")`",
                other.map_or(String::new(), |f| format!(" (it has {f})"))
            ),
        });
    }
    let bytes = std::fs::read(&file).map_err(|source| CheckpointError::Io { path: file.clone(), source })?;
    let renamed = rename(&file, &bytes, model)?;
    Ok((file, renamed))
}

/// The tensors of `bytes` under trainrun's names; those GPT-2 has and trainrun does not keep
/// their own names, so a strict load names them.
fn rename(file: &Path, bytes: &[u8], model: &Gpt2Shape) -> Result<Vec<u8>, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: file.to_path_buf(), reason };
    let st = SafeTensors::deserialize(bytes).map_err(|e| corrupt(format!("{e}")))?;
    let names = model.names();
    let mut head = None;
    let mut out: Vec<(String, TensorView<'_>)> = Vec::new();
    for (name, view) in st.tensors() {
        let bare = name.strip_prefix("transformer.").unwrap_or(&name);
        let buffer = bare.ends_with(".attn.bias") || bare.ends_with(".attn.masked_bias");
        if buffer {
            continue;
        }
        if bare == LM_HEAD.0 {
            head = Some(view);
            continue;
        }
        let ours = names.iter().find(|(hf, _)| hf == bare).map_or(name.clone(), |(_, ours)| ours.clone());
        out.push((ours, view));
    }
    // The head trainrun's model has its own matrix for: GPT-2's untied head, or its token
    // embedding when GPT-2 ties them; either transposed to `[dim, vocab]`.
    let transposed = match (model.tie_word_embeddings, head) {
        (false, head) => {
            let source = head.or_else(|| out.iter().find(|(n, _)| n == "embedding/embeddings").map(|(_, v)| v.clone()));
            source.map(|v| transpose(&v).map_err(corrupt)).transpose()?
        }
        // Tied on both sides: the head is the embedding again.
        (true, _) => None,
    };
    let transposed_bytes: Option<(Vec<usize>, Vec<u8>)> =
        transposed.map(|(shape, values)| (shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    if let Some((shape, data)) = &transposed_bytes {
        let view = TensorView::new(Dtype::F32, shape.clone(), data).map_err(|e| corrupt(e.to_string()))?;
        out.push((LM_HEAD.1.to_string(), view));
    }
    safetensors::serialize(out, None).map_err(|e| corrupt(e.to_string()))
}

/// A `[rows, cols]` tensor as f32, transposed: its shape `[cols, rows]` and values.
fn transpose(v: &TensorView<'_>) -> Result<(Vec<usize>, Vec<f32>), String> {
    let &[rows, cols] = v.shape() else {
        return Err(format!("the output head is {:?}, not a matrix", v.shape()));
    };
    let mut values = vec![0.0f32; rows * cols];
    super::warm_start::convert(v.dtype(), v.data(), &mut values)?;
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = values[r * cols + c];
        }
    }
    Ok((vec![cols, rows], t))
}

#[cfg(test)]
#[path = "hf_gpt2_tests.rs"]
mod tests;

//! The sequence layers of `[[model.layers]]` (token and position embeddings, attention,
//! transformer blocks, per-position dense layers and the language-model head), built on
//! `[T]` token ids and `[T, dim]` activations, with errors that name the key and the fix.

use super::build::Ctx;
use crate::diagnostic::Diagnostic;
use crate::engine::layers::{
    BlockConfig, Embedding, GeluForm, LmHead, MultiHeadAttention, PositionEmbedding, TransformerBlock,
};
use crate::engine::{Layer, Shape};

/// `approximate` as the engine's GELU form.
pub(super) fn gelu_form(approximate: bool) -> GeluForm {
    if approximate { GeluForm::Tanh } else { GeluForm::Exact }
}

/// The divisor of `dim` nearest to `heads`, for a `num_heads` that does not divide it.
fn nearest_divisor(dim: usize, heads: usize) -> usize {
    (1..=dim).filter(|h| dim.is_multiple_of(*h)).min_by_key(|h| h.abs_diff(heads)).unwrap_or(1)
}

impl Ctx {
    /// `input` as `(T, dim)`, or why this layer needs a sequence of vectors.
    pub(super) fn sequence(&self, input: &Shape) -> Result<(usize, usize), Diagnostic> {
        match input.0.as_slice() {
            [t, d] if *t > 0 && *d > 0 => Ok((*t, *d)),
            _ => Err(self
                .diag(None, format!("{} needs a sequence of vectors [T, dim] but gets {input}", self.kind))
                .help("start the model with an embedding layer on token sequences")),
        }
    }

    pub(super) fn embedding(&self, input: &Shape, dim: usize) -> Result<Box<dyn Layer>, Diagnostic> {
        if self.i > 0 {
            return Err(self
                .diag(None, "embedding must be the first layer: token ids have no gradient to pass back".into())
                .help("move it to the start of model.layers"));
        }
        let [t] = input.0.as_slice() else {
            return Err(self
                .diag(None, format!("embedding needs a sequence of token ids [T] but the data gives {input}"))
                .help("use a `text` or `tokens` data source"));
        };
        if self.classes == 0 {
            return Err(self.diag(None, "the data has an empty vocabulary: nothing to embed".into()));
        }
        Ok(Box::new(Embedding::new(self.classes, dim, *t)))
    }

    pub(super) fn position_embedding(&self, input: &Shape, block_size: usize) -> Result<Box<dyn Layer>, Diagnostic> {
        let (t, d) = self.sequence(input)?;
        let layer = PositionEmbedding::new(block_size, t, d).ok_or_else(|| {
            self.diag(
                Some("block_size"),
                format!("block_size = {block_size} is shorter than the data's sequences of {t} tokens"),
            )
            .help(format!("use `block_size = {t}` or more"))
        })?;
        Ok(Box::new(layer))
    }

    /// The error for a `num_heads` that does not divide the width `d`.
    fn heads_mismatch(&self, heads: usize, d: usize) -> Diagnostic {
        self.diag(Some("num_heads"), format!("num_heads = {heads} does not divide the width {d}"))
            .help(format!("use `num_heads = {}`, a divisor of {d}", nearest_divisor(d, heads)))
    }

    pub(super) fn attention(
        &self,
        input: &Shape,
        heads: usize,
        causal: bool,
        dropout: f64,
    ) -> Result<Box<dyn Layer>, Diagnostic> {
        let (t, d) = self.sequence(input)?;
        let layer = MultiHeadAttention::new(t, d, heads, causal).ok_or_else(|| self.heads_mismatch(heads, d))?;
        Ok(Box::new(layer.with_dropout(dropout as f32, self.i as u64)))
    }

    pub(super) fn transformer_block(
        &self,
        input: &Shape,
        heads: usize,
        hidden: Option<usize>,
        dropout: f64,
        epsilon: f64,
        approximate_gelu: bool,
    ) -> Result<Box<dyn Layer>, Diagnostic> {
        let (t, d) = self.sequence(input)?;
        if !d.is_multiple_of(heads) {
            return Err(self.heads_mismatch(heads, d));
        }
        let cfg = BlockConfig {
            seq_len: t,
            dim: d,
            heads,
            hidden: hidden.unwrap_or(4 * d),
            dropout: dropout as f32,
            epsilon: epsilon as f32,
            gelu: gelu_form(approximate_gelu),
            layers: self.blocks.max(1),
        };
        let block = TransformerBlock::new(cfg, self.i as u64)
            .ok_or_else(|| self.diag(None, format!("cannot build a block on input {input}")))?;
        Ok(Box::new(block))
    }

    pub(super) fn lm_head(&self, input: &Shape, tie: bool) -> Result<Box<dyn Layer>, Diagnostic> {
        let (t, d) = self.sequence(input)?;
        if self.classes == 0 {
            return Err(self.diag(None, "the data has an empty vocabulary: nothing to predict".into()));
        }
        if !tie {
            return Ok(Box::new(LmHead::untied(t, d, self.classes)));
        }
        match &self.embedding {
            None => Err(self
                .diag(Some("tie_embeddings"), "tie_embeddings = true but no embedding layer comes before it".into())
                .help("add an embedding layer first, or set `tie_embeddings = false`")),
            Some(e) if e.dim != d => Err(self
                .diag(
                    Some("tie_embeddings"),
                    format!(
                        "tie_embeddings = true but the embedding has {} values per token and this input {d}",
                        e.dim
                    ),
                )
                .help(format!("make the model {d} wide throughout, or set `tie_embeddings = false`"))),
            Some(e) => Ok(Box::new(LmHead::tied(t, d, self.classes, e.path.clone()))),
        }
    }
}

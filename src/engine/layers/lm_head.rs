//! `lm_head`: a language model's output layer, logits over the vocabulary at every position
//! of a `[T, dim]` input, giving `[T, vocab]`. No bias, as GPT-2's.
//!
//! Untied, it owns `kernel [dim, vocab]` (a per-position dense layer). Tied, it owns nothing
//! and computes `logits = h · Eᵀ` with the token embedding's `[vocab, dim]` table, borrowed
//! through [`Layer::tie`]: `Sequential` hands it that tensor as its parameter slice and lets
//! the embedding add its gradient on top (see `sequential.rs`). Tying is declared by weight
//! path (`embedding/embeddings`), which the model builder knows because it names the layers.

use super::positionwise_dense::PositionwiseDense;
use crate::engine::kernels::matmul;
use crate::engine::layer::{Init, Layer, ParamSpec, Pass, Tie};
use crate::engine::shape::Shape;

/// Where the head's matrix comes from.
enum Weights {
    /// Its own `kernel`.
    Own(PositionwiseDense),
    /// The `[vocab, dim]` tensor at this weight path.
    Tied(String),
}

/// Logits over a vocabulary at every position.
pub struct LmHead {
    vocab: usize,
    dim: usize,
    weights: Weights,
    output: Shape,
}

impl LmHead {
    /// A head with its own `kernel [dim, vocab]`, initialized as GPT-2's (normal, std 0.02).
    pub fn untied(seq_len: usize, dim: usize, vocab: usize) -> Self {
        let dense = PositionwiseDense::new(seq_len, dim, vocab, false).with_kernel_init(Init::Normal { std: 0.02 });
        Self { vocab, dim, weights: Weights::Own(dense), output: Shape(vec![seq_len, vocab]) }
    }

    /// A head that multiplies by the transpose of the `[vocab, dim]` tensor at `path` (an
    /// earlier `embedding` layer's `embeddings`).
    pub fn tied(seq_len: usize, dim: usize, vocab: usize, path: impl Into<String>) -> Self {
        Self { vocab, dim, weights: Weights::Tied(path.into()), output: Shape(vec![seq_len, vocab]) }
    }
}

impl Layer for LmHead {
    fn kind(&self) -> &'static str {
        "lm_head"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        match &self.weights {
            Weights::Own(dense) => dense.params(),
            Weights::Tied(_) => Vec::new(),
        }
    }

    fn tie(&self) -> Option<Tie> {
        match &self.weights {
            Weights::Own(_) => None,
            Weights::Tied(path) => Some(Tie { path: path.clone(), shape: vec![self.vocab, self.dim] }),
        }
    }

    fn forward(&mut self, pass: Pass, params: &[f32], state: &mut [f32], x: &[f32], y: &mut [f32], n: usize) {
        match &mut self.weights {
            Weights::Own(dense) => dense.forward(pass, params, state, x, y, n),
            Weights::Tied(_) => {
                let rows = n * self.output.0[0];
                matmul(rows, self.vocab, self.dim, x, false, params, true, y, false, pass.threads);
            }
        }
    }

    fn backward(
        &mut self,
        pass: Pass,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        y: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        match &mut self.weights {
            Weights::Own(dense) => dense.backward(pass, params, grads, x, y, dy, dx, n),
            Weights::Tied(_) => {
                let (rows, vocab, dim) = (n * self.output.0[0], self.vocab, self.dim);
                // dE [vocab, dim] = dyᵀ · h.
                matmul(vocab, dim, rows, dy, true, x, false, grads, pass.accumulate, pass.threads);
                if let Some(dx) = dx {
                    matmul(rows, dim, vocab, dy, false, params, false, dx, false, pass.threads);
                }
            }
        }
    }
}

//! `position_embedding`: learned absolute positions (GPT-2's `wpe`, Keras Hub's
//! `PositionEmbedding`): a `block_size × dim` table named `embeddings` whose first `T` rows
//! are added to a `[T, dim]` input.

use crate::engine::kernels::par_rows;
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::shape::Shape;

/// Adds a learned vector per position.
pub struct PositionEmbedding {
    block_size: usize,
    dim: usize,
    output: Shape,
}

impl PositionEmbedding {
    /// Positions up to `block_size` for inputs of `seq_len × dim`, initialized as GPT-2's
    /// (normal, std 0.02); `None` when `seq_len` exceeds `block_size`.
    pub fn new(block_size: usize, seq_len: usize, dim: usize) -> Option<Self> {
        (seq_len <= block_size).then(|| Self { block_size, dim, output: Shape(vec![seq_len, dim]) })
    }
}

impl Layer for PositionEmbedding {
    fn kind(&self) -> &'static str {
        "position_embedding"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("embeddings", vec![self.block_size, self.dim], Init::Normal { std: 0.02 })]
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let row = self.output.numel();
        let table = &params[..row];
        par_rows(y, n, row, pass.threads, |_, r, part| {
            crate::engine::simd::vectorized(
                #[inline(always)]
                || {
                    for (out, x) in part.chunks_exact_mut(row).zip(x[r.start * row..].chunks_exact(row)) {
                        for ((o, x), p) in out.iter_mut().zip(x).zip(table) {
                            *o = x + p;
                        }
                    }
                },
            )
        });
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, dy, n, .. } = cx;
        let row = self.output.numel();
        let table = &mut grads[..self.block_size * self.dim];
        if !pass.accumulate {
            // Positions past `T` get no gradient.
            table.fill(0.0);
        }
        // Example order, whatever the thread count.
        crate::engine::kernels::add_rows(&mut table[..row], &dy[..n * row]);
        if let Some(dx) = dx {
            dx[..n * row].copy_from_slice(&dy[..n * row]);
        }
    }
}

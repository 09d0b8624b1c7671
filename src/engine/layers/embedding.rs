//! `embedding`: Keras's `Embedding`, a lookup of one `dim`-vector per token id in a
//! `vocab × dim` table named `embeddings`.
//!
//! An example is `[T]` token ids stored as f32 (exact below 2²⁴), the output `[T, dim]`. Ids
//! are not differentiable, so this must be a model's first layer (`dx` is never asked for).
//!
//! An id that is not an integer in `0..vocab` (negative, too large, fractional, NaN) is a bug in
//! the data pipeline, which validates ids before batching: debug builds assert; release builds
//! give that position a zero vector and no gradient, never reading or writing out of bounds.
//! Clamping it to a valid id instead would train a real token on garbage.

use crate::engine::kernels::par_rows;
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::shape::Shape;

/// Token embeddings.
pub struct Embedding {
    vocab: usize,
    dim: usize,
    init: Init,
    output: Shape,
}

impl Embedding {
    /// A `vocab × dim` table for sequences of `seq_len` ids, initialized as GPT-2's (normal,
    /// std 0.02).
    pub fn new(vocab: usize, dim: usize, seq_len: usize) -> Self {
        Self { vocab, dim, init: Init::Normal { std: 0.02 }, output: Shape(vec![seq_len, dim]) }
    }

    /// The same layer with another initializer (Keras's default is uniform in ±0.05).
    pub fn with_init(self, init: Init) -> Self {
        Self { init, ..self }
    }

    /// The table row of `id`, when `id` is a valid token.
    fn row(&self, id: f32) -> Option<usize> {
        // NaN fails both comparisons.
        let valid = id >= 0.0 && id < self.vocab as f32 && id.fract() == 0.0;
        debug_assert!(valid, "token id {id} is not in 0..{}", self.vocab);
        valid.then_some(id as usize)
    }
}

impl Layer for Embedding {
    fn kind(&self) -> &'static str {
        "embedding"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("embeddings", vec![self.vocab, self.dim], self.init)]
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (rows, d) = (n * self.output.0[0], self.dim);
        par_rows(y, rows, d, pass.threads, |_, r, part| {
            for (out, id) in part.chunks_exact_mut(d).zip(&x[r]) {
                match self.row(*id) {
                    Some(t) => out.copy_from_slice(&params[t * d..(t + 1) * d]),
                    None => out.fill(0.0),
                }
            }
        });
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], grads: &mut [f32], _: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        let (rows, d) = (n * self.output.0[0], self.dim);
        let table = &mut grads[..self.vocab * d];
        if !pass.accumulate {
            table.fill(0.0);
        }
        // In position order, so repeated ids sum the same way on every run.
        crate::engine::simd::vectorized(
            #[inline(always)]
            || {
                for (id, g) in x[..rows].iter().zip(dy.chunks_exact(d)) {
                    if let Some(t) = self.row(*id) {
                        for (s, g) in table[t * d..(t + 1) * d].iter_mut().zip(g) {
                            *s += g;
                        }
                    }
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::layer::Pass;

    fn pass() -> Pass {
        Pass { training: true, seed: 1, accumulate: false, threads: 2 }
    }

    #[test]
    fn looks_up_rows_and_sums_gradients_of_repeated_ids() {
        let mut e = Embedding::new(3, 2, 4);
        let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
        let x = [2.0, 0.0, 2.0, 1.0];
        let mut y = [0.0; 8];
        e.forward(Forward { pass: pass(), x: &x, n: 1 }, &table, &mut [], &mut y);
        assert_eq!(y, [20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0]);
        let dy = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut g = [9.0; 6];
        e.backward(Backward { pass: pass(), x: &x, y: &y, dy: &dy, n: 1 }, &table, &mut g, None);
        assert_eq!(g, [3.0, 4.0, 7.0, 8.0, 6.0, 8.0]);
    }

    /// Release builds only: debug builds assert on a bad id, as they should.
    #[test]
    #[cfg(not(debug_assertions))]
    fn invalid_ids_give_zeros_and_no_gradient() {
        let mut e = Embedding::new(2, 1, 5);
        let table = [5.0, 6.0];
        let x = [-1.0, 2.0, 0.5, f32::NAN, 1.0];
        let mut y = [9.0; 5];
        e.forward(Forward { pass: pass(), x: &x, n: 1 }, &table, &mut [], &mut y);
        assert_eq!(y, [0.0, 0.0, 0.0, 0.0, 6.0]);
        let mut g = [0.0; 2];
        e.backward(Backward { pass: pass(), x: &x, y: &y, dy: &[1.0; 5], n: 1 }, &table, &mut g, None);
        assert_eq!(g, [0.0, 1.0]);
    }
}

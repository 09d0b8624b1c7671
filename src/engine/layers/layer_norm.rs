//! `layer_norm`: Keras's `LayerNormalization` over the last axis: each position's vector is
//! normalized by its own mean and biased variance, then scaled by `gamma` and shifted by
//! `beta`. `epsilon` is an argument (Keras's default 1e-3; GPT-2 uses 1e-5).
//!
//! Row statistics are computed in f32 with fixed-order lane sums (fast, and the same bits on
//! any thread count); `gamma`/`beta` gradients sum over rows in f64 on the fixed partition of
//! [`SUM_PARTS`] parts, combined in part order.

use crate::engine::fastmath::{dot, sum};
use crate::engine::kernels::{SUM_PARTS, par_rows, partition, split_rows};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::shape::Shape;
use crate::engine::simd::vectorized;
use rayon::prelude::*;

/// Layer normalization with trainable `gamma` and `beta`.
pub struct LayerNorm {
    dim: usize,
    epsilon: f32,
    output: Shape,
    /// Per row of the last forward pass: mean and 1/sqrt(var + ε).
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    /// Per part of the backward sums: Σ dy·x̂ then Σ dy (`2 × dim` each), and row scratch.
    partials: Vec<(Vec<f64>, Vec<f32>)>,
}

impl LayerNorm {
    /// Normalization of inputs of `shape` over its last axis.
    pub fn new(shape: Shape, epsilon: f32) -> Self {
        Self {
            dim: shape.0.last().copied().unwrap_or(1).max(1),
            epsilon,
            output: shape,
            mean: Vec::new(),
            inv_std: Vec::new(),
            partials: Vec::new(),
        }
    }

    fn rows(&self, n: usize) -> usize {
        n * self.output.numel() / self.dim
    }

    /// The last forward pass's output again, from its input `cx.x` and the row statistics it
    /// kept: the same operations on the same values, so the same bits. A transformer block
    /// recomputes its normalized inputs in backward rather than keep them (issue 34's memory).
    pub fn recompute(&self, cx: Forward<'_>, params: &[f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (d, rows) = (self.dim, self.rows(n));
        let (gamma, beta) = params.split_at(d);
        let (mean, inv_std) = (&self.mean, &self.inv_std);
        par_rows(y, rows, d, pass.threads, |_, r, y| {
            vectorized(
                #[inline(always)]
                || {
                    let x = &x[r.start * d..r.end * d];
                    for ((y, x), row) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(r.clone()) {
                        for (y, x) in y.iter_mut().zip(x) {
                            *y = x - mean[row];
                        }
                        scale_shift(y, inv_std[row], gamma, beta);
                    }
                },
            )
        });
    }

    /// [`Layer::backward`] plus `residual` (shaped like `dx`) added to `dx` in the same pass:
    /// the gradient a pre-LN block's residual path carries past the normalization, without a
    /// pass (and a wait for both threads) of its own. The same bits as adding it afterwards.
    pub fn backward_residual(
        &mut self,
        cx: Backward<'_>,
        params: &[f32],
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
        residual: Option<&[f32]>,
    ) {
        let Backward { pass, x, dy, n, .. } = cx;
        let (d, rows) = (self.dim, self.rows(n));
        let gamma = &params[..d];
        let ranges = partition(rows, SUM_PARTS);
        self.partials.resize_with(ranges.len(), Default::default);
        let dxs: Vec<Option<&mut [f32]>> = match dx {
            Some(dx) => split_rows(&mut dx[..rows * d], &ranges, d).into_iter().map(Some).collect(),
            None => ranges.iter().map(|_| None).collect(),
        };
        let (mean, inv_std) = (&self.mean, &self.inv_std);
        self.partials[..ranges.len()].par_iter_mut().zip(dxs).zip(&ranges).for_each(|((part, mut dx), r)| {
            let (sums, scratch) = part;
            sums.clear();
            sums.resize(2 * d, 0.0);
            scratch.resize(2 * d, 0.0);
            let (g_gamma, g_beta) = sums.split_at_mut(d);
            let (xhat, g) = scratch.split_at_mut(d);
            vectorized(
                #[inline(always)]
                || {
                    for row in r.clone() {
                        let (m, s) = (mean[row], inv_std[row]);
                        let (x, dy) = (&x[row * d..(row + 1) * d], &dy[row * d..(row + 1) * d]);
                        for (((h, g), x), (dy, gm)) in
                            xhat.iter_mut().zip(g.iter_mut()).zip(x).zip(dy.iter().zip(gamma))
                        {
                            *h = (x - m) * s;
                            *g = dy * gm;
                        }
                        for (((sg, sb), h), dy) in g_gamma.iter_mut().zip(g_beta.iter_mut()).zip(xhat.iter()).zip(dy) {
                            *sg += f64::from(dy * h);
                            *sb += f64::from(*dy);
                        }
                        if let Some(dx) = dx.as_deref_mut() {
                            // dx = inv_std · (g − mean(g) − x̂ · mean(g ⊙ x̂)).
                            let (mg, mgx) = (sum(g) / d as f32, dot(g, xhat) / d as f32);
                            let dx = &mut dx[(row - r.start) * d..(row - r.start + 1) * d];
                            for ((dx, g), h) in dx.iter_mut().zip(g.iter()).zip(xhat.iter()) {
                                *dx = s * (g - mg - h * mgx);
                            }
                            if let Some(res) = residual {
                                for (dx, r) in dx.iter_mut().zip(&res[row * d..(row + 1) * d]) {
                                    *dx += r;
                                }
                            }
                        }
                    }
                },
            )
        });
        let (g_gamma, g_beta) = grads[..2 * d].split_at_mut(d);
        if !pass.accumulate {
            g_gamma.fill(0.0);
            g_beta.fill(0.0);
        }
        for c in 0..d {
            let (sg, sb) =
                self.partials[..ranges.len()].iter().fold((0.0, 0.0), |(a, b), (p, _)| (a + p[c], b + p[d + c]));
            g_gamma[c] += sg as f32;
            g_beta[c] += sb as f32;
        }
    }
}

/// `y = y · s · gamma + beta` over one row whose `y` holds `x − mean`: the step forward and
/// [`LayerNorm::recompute`] share, so both round alike.
#[inline(always)]
fn scale_shift(y: &mut [f32], s: f32, gamma: &[f32], beta: &[f32]) {
    for ((y, g), b) in y.iter_mut().zip(gamma).zip(beta) {
        *y = *y * s * g + b;
    }
}

impl Layer for LayerNorm {
    fn kind(&self) -> &'static str {
        "layer_norm"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("gamma", vec![self.dim], Init::Ones), ParamSpec::new("beta", vec![self.dim], Init::Zeros)]
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (d, rows, eps) = (self.dim, self.rows(n), self.epsilon);
        let (gamma, beta) = params.split_at(d);
        self.mean.resize(rows, 0.0);
        self.inv_std.resize(rows, 0.0);
        let ranges = partition(rows, pass.threads);
        let ys = split_rows(&mut y[..rows * d], &ranges, d);
        let means = split_rows(&mut self.mean, &ranges, 1);
        let stds = split_rows(&mut self.inv_std, &ranges, 1);
        ys.into_par_iter().zip(means).zip(stds).zip(&ranges).for_each(|(((y, mean), inv_std), r)| {
            vectorized(
                #[inline(always)]
                || {
                    let x = &x[r.start * d..r.end * d];
                    for (((y, x), m), s) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(mean).zip(inv_std) {
                        *m = sum(x) / d as f32;
                        // Two passes: the centred sum of squares does not cancel.
                        for (y, x) in y.iter_mut().zip(x) {
                            *y = x - *m;
                        }
                        *s = 1.0 / (dot(y, y) / d as f32 + eps).sqrt();
                        scale_shift(y, *s, gamma, beta);
                    }
                },
            )
        });
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        self.backward_residual(cx, params, grads, dx, None);
    }
}

//! `batch_norm`: Keras's `BatchNormalization` over the last axis (channels last).
//!
//! Training normalizes with the batch's mean and biased variance and moves the moving
//! statistics towards them; inference uses the moving statistics. Per-channel sums are taken
//! in `f64` over a fixed partition of the rows and combined in part order, so they are
//! bit-identical run to run on a given thread count.

use crate::engine::kernels::{SUM_PARTS, par_rows, partition};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::op::{BatchNormOp, Op};
use crate::engine::shape::Shape;
use rayon::prelude::*;

/// Batch normalization with trainable `gamma`, `beta` and state `moving_mean`,
/// `moving_variance`.
pub struct BatchNorm {
    channels: usize,
    momentum: f32,
    epsilon: f32,
    output: Shape,
    /// Mean and 1/sqrt(var + ε) per channel used by the last forward pass (batch or moving).
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    /// Per-part sums, `2 × channels` each.
    partials: Vec<Vec<f64>>,
}

impl BatchNorm {
    /// Normalization of inputs of `shape` over its last axis.
    pub fn new(shape: Shape, momentum: f32, epsilon: f32) -> Self {
        Self {
            channels: shape.0.last().copied().unwrap_or(1),
            momentum,
            epsilon,
            output: shape,
            mean: Vec::new(),
            inv_std: Vec::new(),
            partials: Vec::new(),
        }
    }

    /// Per-channel sums `(Σ a, Σ a·b)` over `rows` rows of `a` and `b`, on a fixed
    /// partition of [`SUM_PARTS`] parts summed in order: the result does not depend on threads.
    fn sums(&mut self, a: &[f32], b: &[f32], rows: usize) -> (Vec<f64>, Vec<f64>) {
        let c = self.channels;
        let ranges = partition(rows, SUM_PARTS);
        self.partials.resize_with(ranges.len(), Vec::new);
        self.partials[..ranges.len()].par_iter_mut().zip(&ranges).for_each(|(p, r)| {
            p.clear();
            p.resize(2 * c, 0.0);
            let (s, sp) = p.split_at_mut(c);
            let (a, b) = (&a[r.start * c..r.end * c], &b[r.start * c..r.end * c]);
            crate::engine::simd::vectorized(|| {
                for (a, b) in a.chunks_exact(c).zip(b.chunks_exact(c)) {
                    for (((s, sp), &a), &b) in s.iter_mut().zip(sp.iter_mut()).zip(a).zip(b) {
                        *s += f64::from(a);
                        *sp += f64::from(a) * f64::from(b);
                    }
                }
            });
        });
        let (mut s, mut sp) = (vec![0.0; c], vec![0.0; c]);
        for p in &self.partials[..ranges.len()] {
            s.iter_mut().zip(&p[..c]).for_each(|(t, v)| *t += v);
            sp.iter_mut().zip(&p[c..]).for_each(|(t, v)| *t += v);
        }
        (s, sp)
    }
}

/// `out[r, ch] = a[ch]·u[r, ch] + b[ch]·v[r, ch] + d[ch]` over `rows` rows, in parallel.
fn affine(
    out: &mut [f32],
    u: &[f32],
    v: &[f32],
    (a, b, d): (&[f32], &[f32], &[f32]),
    rows: usize,
    c: usize,
    threads: usize,
) {
    par_rows(out, rows, c, threads, |_, r, part| {
        let (u, v) = (&u[r.start * c..r.end * c], &v[r.start * c..r.end * c]);
        let (a, b, d) = (&a[..c], &b[..c], &d[..c]);
        crate::engine::simd::vectorized(|| {
            for ((o, u), v) in part.chunks_exact_mut(c).zip(u.chunks_exact(c)).zip(v.chunks_exact(c)) {
                for (((o, u), v), ((a, b), d)) in o.iter_mut().zip(u).zip(v).zip(a.iter().zip(b).zip(d)) {
                    *o = a * u + b * v + d;
                }
            }
        });
    });
}

impl BatchNorm {
    /// This normalization as other engines describe it, its tensors at the start of its slices.
    pub(crate) fn batch_norm_op(&self) -> BatchNormOp {
        let c = self.channels;
        BatchNormOp {
            channels: c,
            momentum: self.momentum,
            epsilon: self.epsilon,
            gamma: 0,
            beta: c,
            moving_mean: 0,
            moving_variance: c,
        }
    }
}

impl Layer for BatchNorm {
    fn op(&self) -> Option<Op> {
        Some(Op::BatchNorm(self.batch_norm_op()))
    }

    fn kind(&self) -> &'static str {
        "batch_norm"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::new("gamma", vec![self.channels], Init::Ones),
            ParamSpec::new("beta", vec![self.channels], Init::Zeros),
        ]
    }

    fn state(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::new("moving_mean", vec![self.channels], Init::Zeros),
            ParamSpec::new("moving_variance", vec![self.channels], Init::Ones),
        ]
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], state: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let c = self.channels;
        let rows = n * self.output.numel() / c.max(1);
        let (gamma, beta) = params.split_at(c);
        let (moving_mean, moving_var) = state.split_at_mut(c);
        let var: Vec<f32> = if pass.training {
            // One pass for Σx and Σx²: in f64 the cancellation in E[x²] − E[x]² is harmless
            // for activations, and it reads the batch once instead of twice.
            let (s, sq) = self.sums(x, x, rows);
            let m = rows.max(1) as f64;
            self.mean = s.iter().map(|s| (s / m) as f32).collect();
            let var: Vec<f32> = s.iter().zip(&sq).map(|(s, sq)| (sq / m - (s / m) * (s / m)).max(0.0) as f32).collect();
            // Keras 3 moves both statistics towards the batch's, with the *biased* batch
            // variance (`ops.moments`), unlike Keras 2's fused kernel (Bessel-corrected).
            let mom = self.momentum;
            for ((mm, mv), (bm, bv)) in
                moving_mean.iter_mut().zip(moving_var.iter_mut()).zip(self.mean.iter().zip(&var))
            {
                *mm = *mm * mom + bm * (1.0 - mom);
                *mv = *mv * mom + bv * (1.0 - mom);
            }
            var
        } else {
            self.mean = moving_mean.to_vec();
            moving_var.to_vec()
        };
        self.inv_std = var.iter().map(|v| 1.0 / (v + self.epsilon).sqrt()).collect();
        // y = γ·(x − μ)/σ + β = scale·x + shift.
        let scale: Vec<f32> = gamma.iter().zip(&self.inv_std).map(|(g, s)| g * s).collect();
        let shift: Vec<f32> = beta.iter().zip(&scale).zip(&self.mean).map(|((b, s), m)| b - m * s).collect();
        let zeros = vec![0.0; c];
        affine(y, x, x, (&scale, &zeros, &shift), rows, c, pass.threads);
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        let c = self.channels;
        let rows = n * self.output.numel() / c.max(1);
        let (sum_dy, sum_dy_x) = self.sums(dy, x, rows);
        // Σ dy·x̂ = inv_std · (Σ dy·x − μ Σ dy).
        let (mean, inv_std) = (&self.mean, &self.inv_std);
        let d_gamma: Vec<f64> =
            (0..c).map(|ch| f64::from(inv_std[ch]) * (sum_dy_x[ch] - f64::from(mean[ch]) * sum_dy[ch])).collect();
        let (g_gamma, g_beta) = grads.split_at_mut(c);
        if !pass.accumulate {
            g_gamma.fill(0.0);
            g_beta.fill(0.0);
        }
        for ch in 0..c {
            g_gamma[ch] += d_gamma[ch] as f32;
            g_beta[ch] += sum_dy[ch] as f32;
        }
        let Some(dx) = dx else { return };
        let gamma = &params[..c];
        // dx = a·dy + k·x + d per channel. In inference the statistics are constants: dx =
        // γ/σ · dy. In training they depend on x: dx = γ/σ · (dy − Σdy/M − x̂ Σdy·x̂/M).
        let a: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
        let (k, d): (Vec<f32>, Vec<f32>) = if pass.training {
            let m = rows.max(1) as f64;
            (0..c)
                .map(|ch| {
                    let (a, s, mu) = (f64::from(a[ch]), f64::from(inv_std[ch]), f64::from(mean[ch]));
                    let k = -a * s * d_gamma[ch] / m;
                    let d = -a * sum_dy[ch] / m - k * mu;
                    (k as f32, d as f32)
                })
                .unzip()
        } else {
            (vec![0.0; c], vec![0.0; c])
        };
        affine(dx, dy, x, (&a, &k, &d), rows, c, pass.threads);
    }
}

//! `gelu`: the Gaussian error linear unit `x·Φ(x)` (Hendrycks & Gimpel), elementwise over any
//! shape, exact (`Φ` through `erfc`, Keras `gelu(approximate=False)`, PyTorch's default) or
//! with GPT-2's tanh approximation (`approximate=True`, PyTorch `approximate="tanh"`).
//!
//! Both are evaluated in forms that stay relative-accurate for negative inputs, where the
//! textbook `0.5·x·(1 + erf(x/√2))` loses every digit to cancellation: `Φ(x) = ½·erfc(−x/√2)`,
//! and `½(1 + tanh u) = sigmoid(2u)`. Forward also keeps the derivative, computed with the
//! same exponentials, so backward is one product per value.

use crate::engine::fastmath::{normal_cdf_pdf, sigmoid};
use crate::engine::kernels::{par_rows, partition, split_rows};
use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::shape::Shape;
use crate::engine::simd::vectorized;
use rayon::prelude::*;

/// Which GELU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeluForm {
    /// `x·Φ(x)`.
    Exact,
    /// `x·sigmoid(2u)` with `u = √(2/π)·(x + 0.044715·x³)`, GPT-2's.
    Tanh,
}

/// √(2/π).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const CUBIC: f32 = 0.044_715;

/// `(gelu(x), d gelu / dx)`, sharing their work.
#[inline(always)]
pub fn gelu_and_grad(form: GeluForm, x: f32) -> (f32, f32) {
    match form {
        GeluForm::Exact => {
            let (cdf, pdf) = normal_cdf_pdf(x);
            (x * cdf, cdf + x * pdf)
        }
        GeluForm::Tanh => {
            let s = sigmoid(2.0 * SQRT_2_OVER_PI * (x + CUBIC * x * x * x));
            (x * s, s + x * s * (1.0 - s) * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * x * x))
        }
    }
}

/// `y = gelu(x)` and `grad = gelu'(x)` over `len` values on `threads` threads. Backward is
/// then a product ([`backward`]): the derivative costs little more here, where it shares
/// the exponentials, than recomputing it would there.
pub fn forward(form: GeluForm, x: &[f32], y: &mut [f32], grad: &mut [f32], len: usize, threads: usize) {
    let ranges = partition(len, threads);
    let (ys, grads) = (split_rows(&mut y[..len], &ranges, 1), split_rows(&mut grad[..len], &ranges, 1));
    ys.into_par_iter().zip(grads).zip(&ranges).for_each(|((y, grad), r)| {
        let x = &x[r.clone()];
        // One loop per form, the `match` outside: each loop vectorizes.
        match form {
            GeluForm::Exact => vectorized(
                #[inline(always)]
                || map(x, y, grad, |x| gelu_and_grad(GeluForm::Exact, x)),
            ),
            GeluForm::Tanh => vectorized(
                #[inline(always)]
                || map(x, y, grad, |x| gelu_and_grad(GeluForm::Tanh, x)),
            ),
        }
    });
}

/// [`forward`] of `x + bias` for `rows` rows of `width` values (`bias` has `width` values, or
/// none), in one pass that also leaves `x + bias` in `x`: the transformer block's MLP adds its
/// first bias here rather than in a pass (and a wait for both threads) of its own. The same
/// bits as adding the bias first. Without `grad` (an evaluation pass, which has no backward)
/// the derivative is neither computed nor stored.
pub fn forward_biased(
    form: GeluForm,
    x: &mut [f32],
    (bias, width): (&[f32], usize),
    rows: usize,
    (y, grad): (&mut [f32], Option<&mut [f32]>),
    threads: usize,
) {
    let width = width.max(1);
    let ranges = partition(rows, threads);
    let len = rows * width;
    let (xs, ys) = (split_rows(&mut x[..len], &ranges, width), split_rows(&mut y[..len], &ranges, width));
    let Some(grad) = grad else {
        return xs.into_par_iter().zip(ys).for_each(|(x, y)| match form {
            GeluForm::Exact => vectorized(
                #[inline(always)]
                || biased_values(x, (bias, width), y, |x| gelu_and_grad(GeluForm::Exact, x).0),
            ),
            GeluForm::Tanh => vectorized(
                #[inline(always)]
                || biased_values(x, (bias, width), y, |x| gelu_and_grad(GeluForm::Tanh, x).0),
            ),
        });
    };
    let grads = split_rows(&mut grad[..len], &ranges, width);
    xs.into_par_iter().zip(ys).zip(grads).for_each(|((x, y), grad)| match form {
        GeluForm::Exact => vectorized(
            #[inline(always)]
            || biased_map(x, (bias, width), y, grad, |x| gelu_and_grad(GeluForm::Exact, x)),
        ),
        GeluForm::Tanh => vectorized(
            #[inline(always)]
            || biased_map(x, (bias, width), y, grad, |x| gelu_and_grad(GeluForm::Tanh, x)),
        ),
    });
}

/// Row by row (rows of `width` values): `x += b` (unless `b` is empty), then [`map`].
#[inline(always)]
fn biased_map(
    x: &mut [f32],
    (b, width): (&[f32], usize),
    y: &mut [f32],
    g: &mut [f32],
    f: impl Fn(f32) -> (f32, f32) + Copy,
) {
    let rows = x.chunks_exact_mut(width).zip(y.chunks_exact_mut(width)).zip(g.chunks_exact_mut(width));
    for ((x, y), g) in rows {
        add_bias(x, b);
        map(x, y, g, f);
    }
}

/// [`biased_map`] without the derivative: `y[i] = f(x[i] + b)`.
#[inline(always)]
fn biased_values(x: &mut [f32], (b, width): (&[f32], usize), y: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    for (x, y) in x.chunks_exact_mut(width).zip(y.chunks_exact_mut(width)) {
        add_bias(x, b);
        let n = x.len().min(y.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        for i in 0..n {
            y[i] = f(x[i]);
        }
    }
}

#[inline(always)]
fn add_bias(x: &mut [f32], b: &[f32]) {
    for (x, b) in x.iter_mut().zip(b) {
        *x += b;
    }
}

/// `(y[i], g[i]) = f(x[i])`, as a plain indexed loop (iterator adaptors and closures may stay
/// out of line, compiled for the baseline instruction set).
#[inline(always)]
fn map(x: &[f32], y: &mut [f32], g: &mut [f32], f: impl Fn(f32) -> (f32, f32)) {
    let n = x.len().min(y.len()).min(g.len());
    let (x, y, g) = (&x[..n], &mut y[..n], &mut g[..n]);
    for i in 0..n {
        (y[i], g[i]) = f(x[i]);
    }
}

/// `dx = dy ⊙ grad` over `len` values on `threads` threads, `grad` from [`forward`].
pub fn backward(grad: &[f32], dy: &[f32], dx: &mut [f32], len: usize, threads: usize) {
    par_rows(dx, len, 1, threads, |_, r, part| {
        let (grad, dy) = (&grad[r.clone()], &dy[r]);
        vectorized(
            #[inline(always)]
            || {
                for ((d, g), dy) in part.iter_mut().zip(grad).zip(dy) {
                    *d = g * dy;
                }
            },
        )
    });
}

/// GELU as a layer.
pub struct Gelu {
    form: GeluForm,
    output: Shape,
    /// The derivative at the last forward pass's inputs.
    grad: Vec<f32>,
}

impl Gelu {
    /// GELU over inputs of `shape`.
    pub fn new(form: GeluForm, shape: Shape) -> Self {
        Self { form, output: shape, grad: Vec::new() }
    }
}

impl Layer for Gelu {
    fn kind(&self) -> &'static str {
        "gelu"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let len = n * self.output.numel();
        self.grad.resize(len, 0.0);
        forward(self.form, x, y, &mut self.grad, len, pass.threads);
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, dy, n, .. } = cx;
        if let Some(dx) = dx {
            backward(&self.grad, dy, dx, n * self.output.numel(), pass.threads);
        }
    }
}

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

/// `y = gelu(x)` over `len` values on `threads` threads.
pub fn values(form: GeluForm, x: &[f32], y: &mut [f32], len: usize, threads: usize) {
    par_rows(y, len, 1, threads, |_, r, y| {
        let x = &x[r];
        // One loop per form, the `match` outside: each loop vectorizes.
        match form {
            GeluForm::Exact => vectorized(
                #[inline(always)]
                || map(x, y, |x| gelu_and_grad(GeluForm::Exact, x).0),
            ),
            GeluForm::Tanh => vectorized(
                #[inline(always)]
                || map(x, y, |x| gelu_and_grad(GeluForm::Tanh, x).0),
            ),
        }
    });
}

/// [`values`] of `x + bias` for `rows` rows of `width` values (`bias` has `width` values, or
/// none), in one pass that also leaves `x + bias` in `x`: the transformer block's MLP adds its
/// first bias here rather than in a pass (and a wait for both threads) of its own, and keeps
/// `x + bias` for backward. The same bits as adding the bias first.
pub fn forward_biased(
    form: GeluForm,
    x: &mut [f32],
    (bias, width): (&[f32], usize),
    rows: usize,
    y: &mut [f32],
    threads: usize,
) {
    let width = width.max(1);
    let ranges = partition(rows, threads);
    let len = rows * width;
    let (xs, ys) = (split_rows(&mut x[..len], &ranges, width), split_rows(&mut y[..len], &ranges, width));
    xs.into_par_iter().zip(ys).for_each(|(x, y)| match form {
        GeluForm::Exact => vectorized(
            #[inline(always)]
            || biased_values(x, (bias, width), y, |x| gelu_and_grad(GeluForm::Exact, x).0),
        ),
        GeluForm::Tanh => vectorized(
            #[inline(always)]
            || biased_values(x, (bias, width), y, |x| gelu_and_grad(GeluForm::Tanh, x).0),
        ),
    });
}

/// Row by row (rows of `width` values): `x += b` (unless `b` is empty), then [`map`].
#[inline(always)]
fn biased_values(x: &mut [f32], (b, width): (&[f32], usize), y: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    for (x, y) in x.chunks_exact_mut(width).zip(y.chunks_exact_mut(width)) {
        add_bias(x, b);
        map(x, y, f);
    }
}

#[inline(always)]
fn add_bias(x: &mut [f32], b: &[f32]) {
    for (x, b) in x.iter_mut().zip(b) {
        *x += b;
    }
}

/// `y[i] = f(x[i])`, as a plain indexed loop (iterator adaptors and closures may stay out of
/// line, compiled for the baseline instruction set).
#[inline(always)]
fn map(x: &[f32], y: &mut [f32], f: impl Fn(f32) -> f32) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    for i in 0..n {
        y[i] = f(x[i]);
    }
}

/// `dx = gelu'(x) ⊙ dy` over `len` values on `threads` threads, `x` the forward pass's input.
/// The derivative is recomputed rather than kept from forward: keeping it cost a `[rows,
/// hidden]` buffer per transformer block (issue 34's memory), and it is the same function of
/// the same input, so the same bits.
pub fn backward(form: GeluForm, x: &[f32], dy: &[f32], dx: &mut [f32], len: usize, threads: usize) {
    par_rows(dx, len, 1, threads, |_, r, dx| {
        let (x, dy) = (&x[r.clone()], &dy[r]);
        match form {
            GeluForm::Exact => vectorized(
                #[inline(always)]
                || derivative_times(x, dy, dx, |x| gelu_and_grad(GeluForm::Exact, x).1),
            ),
            GeluForm::Tanh => vectorized(
                #[inline(always)]
                || derivative_times(x, dy, dx, |x| gelu_and_grad(GeluForm::Tanh, x).1),
            ),
        }
    });
}

/// `dx[i] = grad(x[i]) · dy[i]`, as a plain indexed loop (see [`map`]).
#[inline(always)]
fn derivative_times(x: &[f32], dy: &[f32], dx: &mut [f32], grad: impl Fn(f32) -> f32) {
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    for i in 0..n {
        dx[i] = grad(x[i]) * dy[i];
    }
}

/// `y = gelu(x)`, and `x` replaced by `gelu'(x)`, over `len` values on `threads` threads, in
/// one pass sharing their exponentials: the transformer block's backward, which kept only
/// GELU's input from forward and needs both (the output for the next product's kernel
/// gradient, the derivative after it) but the input no more. [`times`] applies the derivative.
pub fn values_and_derivative(form: GeluForm, x: &mut [f32], y: &mut [f32], len: usize, threads: usize) {
    let ranges = partition(len, threads);
    let (xs, ys) = (split_rows(&mut x[..len], &ranges, 1), split_rows(&mut y[..len], &ranges, 1));
    xs.into_par_iter().zip(ys).for_each(|(x, y)| match form {
        GeluForm::Exact => vectorized(
            #[inline(always)]
            || map_in_place(x, y, |x| gelu_and_grad(GeluForm::Exact, x)),
        ),
        GeluForm::Tanh => vectorized(
            #[inline(always)]
            || map_in_place(x, y, |x| gelu_and_grad(GeluForm::Tanh, x)),
        ),
    });
}

/// `(y[i], x[i]) = f(x[i])`, as a plain indexed loop (see [`map`]).
#[inline(always)]
fn map_in_place(x: &mut [f32], y: &mut [f32], f: impl Fn(f32) -> (f32, f32)) {
    let n = x.len().min(y.len());
    let (x, y) = (&mut x[..n], &mut y[..n]);
    for i in 0..n {
        (y[i], x[i]) = f(x[i]);
    }
}

/// `dx = grad ⊙ dy` over `len` values on `threads` threads, `grad` from
/// [`values_and_derivative`].
pub fn times(grad: &[f32], dy: &[f32], dx: &mut [f32], len: usize, threads: usize) {
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

/// GELU as a layer. Backward recomputes the derivative from its input (`cx.x`), so the layer
/// keeps nothing between the passes.
pub struct Gelu {
    form: GeluForm,
    output: Shape,
}

impl Gelu {
    /// GELU over inputs of `shape`.
    pub fn new(form: GeluForm, shape: Shape) -> Self {
        Self { form, output: shape }
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
        values(self.form, x, y, n * self.output.numel(), pass.threads);
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        if let Some(dx) = dx {
            backward(self.form, x, dy, dx, n * self.output.numel(), pass.threads);
        }
    }
}

//! `gelu`: the Gaussian error linear unit `x·Φ(x)` (Hendrycks & Gimpel), elementwise over any
//! shape, exact (`Φ` through `erfc`, Keras `gelu(approximate=False)`, PyTorch's default) or
//! with GPT-2's tanh approximation (`approximate=True`, PyTorch `approximate="tanh"`).
//!
//! Both are evaluated in forms that stay relative-accurate for negative inputs, where the
//! textbook `0.5·x·(1 + erf(x/√2))` loses every digit to cancellation: `Φ(x) = ½·erfc(−x/√2)`,
//! and `½(1 + tanh u) = sigmoid(2u)`. Backward recomputes from the input, so nothing is kept.

use crate::engine::fastmath::{normal_cdf, normal_pdf, sigmoid};
use crate::engine::kernels::par_rows;
use crate::engine::layer::{Layer, Pass};
use crate::engine::shape::Shape;
use crate::engine::simd::vectorized;

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

/// GELU of `x`.
#[inline(always)]
pub fn gelu(form: GeluForm, x: f32) -> f32 {
    match form {
        GeluForm::Exact => x * normal_cdf(x),
        GeluForm::Tanh => x * sigmoid(2.0 * SQRT_2_OVER_PI * (x + CUBIC * x * x * x)),
    }
}

/// d gelu / dx at `x`.
#[inline(always)]
pub fn gelu_grad(form: GeluForm, x: f32) -> f32 {
    match form {
        GeluForm::Exact => normal_cdf(x) + x * normal_pdf(x),
        GeluForm::Tanh => {
            let s = sigmoid(2.0 * SQRT_2_OVER_PI * (x + CUBIC * x * x * x));
            s + x * s * (1.0 - s) * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * x * x)
        }
    }
}

/// `y = gelu(x)` over `len` values on `threads` threads.
pub fn forward(form: GeluForm, x: &[f32], y: &mut [f32], len: usize, threads: usize) {
    par_rows(y, len, 1, threads, |_, r, part| {
        let x = &x[r];
        // One loop per form: the `match` stays outside, and each loop vectorizes.
        vectorized(|| match form {
            GeluForm::Exact => part.iter_mut().zip(x).for_each(|(y, x)| *y = gelu(GeluForm::Exact, *x)),
            GeluForm::Tanh => part.iter_mut().zip(x).for_each(|(y, x)| *y = gelu(GeluForm::Tanh, *x)),
        })
    });
}

/// `dx = dy ⊙ gelu'(x)` over `len` values on `threads` threads.
pub fn backward(form: GeluForm, x: &[f32], dy: &[f32], dx: &mut [f32], len: usize, threads: usize) {
    par_rows(dx, len, 1, threads, |_, r, part| {
        let (x, dy) = (&x[r.clone()], &dy[r]);
        vectorized(|| match form {
            GeluForm::Exact => {
                part.iter_mut().zip(x).zip(dy).for_each(|((d, x), g)| *d = g * gelu_grad(GeluForm::Exact, *x))
            }
            GeluForm::Tanh => {
                part.iter_mut().zip(x).zip(dy).for_each(|((d, x), g)| *d = g * gelu_grad(GeluForm::Tanh, *x))
            }
        })
    });
}

/// GELU as a layer.
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

    fn forward(&mut self, pass: Pass, _: &[f32], _: &mut [f32], x: &[f32], y: &mut [f32], n: usize) {
        forward(self.form, x, y, n * self.output.numel(), pass.threads);
    }

    fn backward(
        &mut self,
        pass: Pass,
        _: &[f32],
        _: &mut [f32],
        x: &[f32],
        _: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        if let Some(dx) = dx {
            backward(self.form, x, dy, dx, n * self.output.numel(), pass.threads);
        }
    }
}

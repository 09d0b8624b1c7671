//! A dense layer over the last axis: `x · kernel + bias` applied at every position of a
//! `[T, in]` input, giving `[T, units]`. This is what Keras's `Dense` does on a rank-3 input
//! (hence the kind `dense`); trainrun's [`super::Dense`] flattens its input instead, and keeps
//! doing so for the models built on it. The transformer block's MLP and the LM head use this.

use super::composite::{add_bias_residual, both};
use crate::engine::bf16::{self, ProductPath};
use crate::engine::kernels::{add_bias, add_rows, par_rows};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::shape::Shape;
use crate::engine::strided::{MatMut, MatRef};

/// `kernel [in, units]` and optional `bias [units]`, shared by all positions.
pub struct PositionwiseDense {
    inputs: usize,
    units: usize,
    use_bias: bool,
    kernel_init: Init,
    output: Shape,
    /// How the products run (the precision policy).
    products: ProductPath,
}

impl PositionwiseDense {
    /// `inputs → units` at each of `seq_len` positions, Glorot-uniform (Keras's default).
    pub fn new(seq_len: usize, inputs: usize, units: usize, use_bias: bool) -> Self {
        let kernel_init = Init::GlorotUniform { fan_in: inputs, fan_out: units };
        Self {
            inputs,
            units,
            use_bias,
            kernel_init,
            output: Shape(vec![seq_len, units]),
            products: ProductPath::Float32,
        }
    }

    /// The same layer with another kernel initializer (GPT-2: normal, std 0.02).
    pub fn with_kernel_init(self, kernel_init: Init) -> Self {
        Self { kernel_init, ..self }
    }

    fn rows(&self, n: usize) -> usize {
        n * self.output.0[0]
    }

    /// `y = x · kernel` alone, returning the bias (empty without one) for the caller to add
    /// in a pass it has anyway: the transformer block adds it inside GELU's.
    pub fn product<'p>(&self, cx: Forward<'_>, params: &'p [f32], y: &mut [f32]) -> &'p [f32] {
        let (rows, inputs, units) = (self.rows(cx.n), self.inputs, self.units);
        let (kernel, bias) = params.split_at(inputs * units);
        let (x, kernel) = (MatRef::rows(cx.x, rows, inputs), MatRef::rows(kernel, inputs, units));
        bf16::gemm(self.products, MatMut::rows(y, rows, units), x, kernel, false, 1.0, cx.pass.threads);
        if self.use_bias { &bias[..units] } else { &[] }
    }

    /// The forward pass plus `residual` (shaped like `y`), added in the bias's pass: one pass
    /// over `y` (and one wait for both threads) instead of two. The same bits as adding the
    /// residual after [`Layer::forward`].
    pub fn forward_residual(&mut self, cx: Forward<'_>, params: &[f32], y: &mut [f32], residual: Option<&[f32]>) {
        let (rows, units, pass) = (self.rows(cx.n), self.units, cx.pass);
        let bias = self.product(cx, params, y);
        match residual {
            Some(r) => add_bias_residual(y, bias, r, rows, units, pass.threads),
            None if self.use_bias => par_rows(y, rows, units, pass.threads, |_, _, part| add_bias(part, bias)),
            None => {}
        }
    }
}

impl Layer for PositionwiseDense {
    fn kind(&self) -> &'static str {
        "dense"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![ParamSpec::new("kernel", vec![self.inputs, self.units], self.kernel_init)];
        if self.use_bias {
            p.push(ParamSpec::new("bias", vec![self.units], Init::Zeros));
        }
        p
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        self.products = path.for_dims(self.inputs, self.units);
        !self.products.is_float32()
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        self.forward_residual(cx, params, y, None);
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        let (rows, units, inputs) = (self.rows(n), self.units, self.inputs);
        let dy = &dy[..rows * units];
        let (g_kernel, g_bias) = grads.split_at_mut(inputs * units);
        let (use_bias, acc, products) = (self.use_bias, pass.accumulate, self.products);
        let kernel = MatRef::rows(&params[..inputs * units], inputs, units);
        let (x, dy_m) = (MatRef::rows(x, rows, inputs), MatRef::rows(dy, rows, units));
        let mut weights = |threads| {
            bf16::gemm(products, MatMut::rows(g_kernel, inputs, units), x.t(), dy_m, acc, 1.0, threads);
            if use_bias {
                if !acc {
                    g_bias[..units].fill(0.0);
                }
                add_rows(&mut g_bias[..units], dy);
            }
        };
        match dx {
            Some(dx) => both(pass.threads, weights, |threads| {
                bf16::gemm(products, MatMut::rows(dx, rows, inputs), dy_m, kernel.t(), false, 1.0, threads)
            }),
            None => weights(pass.threads),
        }
    }
}

//! `dense`: `activation(x · kernel + bias)`, Keras's `Dense`, on `gemm`.

use crate::engine::activation;
use crate::engine::kernels::{add_bias, add_rows, gemm_scaled, matmul, par_rows};
use crate::engine::layer::{Init, Layer, ParamSpec, Pass};
use crate::engine::op::Op;
use crate::engine::optimizer::SliceStep;
use crate::engine::shape::Shape;
use crate::vocab::Activation;

/// A fully connected layer over flat inputs.
pub struct Dense {
    inputs: usize,
    units: usize,
    activation: Activation,
    use_bias: bool,
    output: Shape,
    /// Gradient before the activation, reused across steps.
    dz: Vec<f32>,
}

impl Dense {
    /// A dense layer from `inputs` features to `units`.
    pub fn new(inputs: usize, units: usize, activation: Activation, use_bias: bool) -> Self {
        Self { inputs, units, activation, use_bias, output: Shape(vec![units]), dz: Vec::new() }
    }
}

impl Layer for Dense {
    fn op(&self) -> Option<Op> {
        let bias = self.use_bias.then_some(self.inputs * self.units);
        Some(Op::Dense { inputs: self.inputs, units: self.units, activation: self.activation, kernel: 0, bias })
    }

    fn kind(&self) -> &'static str {
        "dense"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![ParamSpec::new(
            "kernel",
            vec![self.inputs, self.units],
            Init::GlorotUniform { fan_in: self.inputs, fan_out: self.units },
        )];
        if self.use_bias {
            p.push(ParamSpec::new("bias", vec![self.units], Init::Zeros));
        }
        p
    }

    fn forward(&mut self, pass: Pass, params: &[f32], _: &mut [f32], x: &[f32], y: &mut [f32], n: usize) {
        let (kernel, bias) = params.split_at(self.inputs * self.units);
        matmul(n, self.units, self.inputs, x, false, kernel, false, y, false, pass.threads);
        let (units, act, use_bias) = (self.units, self.activation, self.use_bias);
        par_rows(y, n, units, pass.threads, |_, _, rows| {
            if use_bias {
                add_bias(rows, &bias[..units]);
            }
            activation::forward(act, rows, units);
        });
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
        let (inputs, units, threads, use_bias) = (self.inputs, self.units, pass.threads, self.use_bias);
        let dz = self.dz(y, dy, n);
        let kernel = &params[..inputs * units];
        let (g_kernel, g_bias) = grads.split_at_mut(inputs * units);
        matmul(inputs, units, n, x, true, dz, false, g_kernel, pass.accumulate, threads);
        if use_bias {
            if !pass.accumulate {
                g_bias.fill(0.0);
            }
            add_rows(g_bias, dz);
        }
        if let Some(dx) = dx {
            matmul(n, inputs, units, dz, false, kernel, true, dx, false, threads);
        }
    }

    /// The kernel's gradient product writes the update itself (see [`SliceStep::apply_product`]):
    /// `dx` first, while the kernel is still the one forward used.
    fn backward_update(
        &mut self,
        pass: Pass,
        params: &mut [f32],
        update: &mut SliceStep<'_>,
        scratch: &mut Vec<f32>,
        x: &[f32],
        y: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        let (inputs, units, threads, use_bias) = (self.inputs, self.units, pass.threads, self.use_bias);
        let dz = self.dz(y, dy, n);
        let k_len = inputs * units;
        let (kernel, bias) = params.split_at_mut(k_len);
        if let Some(dx) = dx {
            matmul(n, inputs, units, dz, false, kernel, true, dx, false, threads);
        }
        if use_bias {
            scratch.clear();
            scratch.resize(units, 0.0);
            let g_bias = &mut scratch[..units];
            add_rows(g_bias, dz);
            update.sub(k_len..k_len + units).apply(bias, g_bias);
        }
        update.sub(0..k_len).apply_product(kernel, |target, keep, scale| {
            gemm_scaled(inputs, units, n, (x, true), (dz, false), target, keep, scale, threads);
        });
    }
}

impl Dense {
    /// The gradient before the activation: `dy` itself for a linear layer.
    fn dz<'a>(&'a mut self, y: &[f32], dy: &'a [f32], n: usize) -> &'a [f32] {
        let len = n * self.units;
        if self.activation == Activation::Linear {
            return &dy[..len];
        }
        self.dz.resize(len, 0.0);
        activation::backward(self.activation, &y[..len], &dy[..len], &mut self.dz, self.units);
        &self.dz
    }
}

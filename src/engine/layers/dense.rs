//! `dense`: `activation(x · kernel + bias)`, Keras's `Dense`, on `gemm`.

use crate::engine::activation;
use crate::engine::kernels::{add_bias, add_rows, matmul, par_rows, partition, split_rows};
use crate::engine::layer::{Init, Layer, ParamSpec, Pass};
use crate::engine::meet::BLOCK_ROWS;
use crate::engine::op::Op;
use crate::engine::optimizer::SliceStep;
use crate::engine::shape::Shape;
use crate::engine::strided::{MatMut, MatRef, gemm_scaled};
use crate::vocab::Activation;
use rayon::prelude::*;
use std::ops::Range;

/// A fully connected layer over flat inputs.
pub struct Dense {
    inputs: usize,
    units: usize,
    activation: Activation,
    use_bias: bool,
    output: Shape,
    /// Gradient before the activation, reused across steps.
    dz: Vec<f32>,
    /// Write `dx` through ReLU's derivative at `x` ([`Layer::mask_dx`]).
    mask_dx: bool,
    /// `dy` comes through this layer's ReLU's derivative already ([`Layer::dy_masked`]).
    dy_masked: bool,
}

impl Dense {
    /// A dense layer from `inputs` features to `units`.
    pub fn new(inputs: usize, units: usize, activation: Activation, use_bias: bool) -> Self {
        Self {
            inputs,
            units,
            activation,
            use_bias,
            output: Shape(vec![units]),
            dz: Vec::new(),
            mask_dx: false,
            dy_masked: false,
        }
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

    fn relu_output(&self) -> bool {
        self.activation == Activation::Relu
    }

    fn mask_dx(&mut self, on: bool) -> bool {
        self.mask_dx = on;
        true
    }

    fn dy_masked(&mut self, on: bool) {
        self.dy_masked = on;
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
        let (inputs, units, threads, use_bias, mask) =
            (self.inputs, self.units, pass.threads, self.use_bias, self.mask_dx);
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
            if mask {
                activation::relu_mask(&x[..n * inputs], &mut dx[..n * inputs]);
            }
        }
    }

    fn kernel_product(&self) -> Option<(usize, usize)> {
        Some((self.inputs, self.units))
    }

    fn backward_dz(&mut self, pass: Pass, grads: &mut [f32], y: &[f32], dy: &[f32], n: usize) -> &[f32] {
        let (k_len, units, use_bias) = (self.inputs * self.units, self.units, self.use_bias);
        let len = n * units;
        if self.activation == Activation::Linear || self.dy_masked {
            // The caller reads `dz` beside buffers it borrows from the model: keep a copy here.
            self.dz.clear();
            self.dz.extend_from_slice(&dy[..len]);
        } else {
            self.dz(y, dy, n);
        }
        let dz = &self.dz[..len];
        if use_bias {
            let g_bias = &mut grads[k_len..k_len + units];
            if !pass.accumulate {
                g_bias.fill(0.0);
            }
            add_rows(g_bias, dz);
        }
        dz
    }

    /// The kernel's gradient product writes the update itself (see [`SliceStep::apply_product`]).
    /// With `dx` to compute too, both products walk the kernel in blocks of rows: each block
    /// gives its columns of `dx` and then takes its update while it is still in cache, so the
    /// kernel is read once per backward instead of twice (and packed for `dx` from cache).
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
        let mask = self.mask_dx.then_some(&x[..n * inputs]);
        let dz = self.dz(y, dy, n);
        let k_len = inputs * units;
        let (kernel, bias) = params.split_at_mut(k_len);
        if use_bias {
            scratch.clear();
            scratch.resize(units, 0.0);
            let g_bias = &mut scratch[..units];
            add_rows(g_bias, dz);
            update.sub(k_len..k_len + units).apply(bias, g_bias);
        }
        let (x, dz) = (MatRef::rows(x, n, inputs), MatRef::rows(dz, n, units));
        let kernel_update = &mut update.sub(0..k_len);
        match dx {
            Some(dx) => kernel_blocks(kernel, kernel_update, MatMut::rows(dx, n, inputs), x, dz, mask, threads),
            None => kernel_update.apply_product(kernel, |target, keep, scale| {
                gemm_scaled(MatMut::rows(target, inputs, units), x.t(), dz, keep, scale, threads)
            }),
        }
    }
}

/// `dx = dz · kernelᵀ` and the kernel's update from `xᵀ · dz`, block of kernel rows by block:
/// a block gives its columns of `dx`, with the weights forward used, and then takes its
/// update while still in cache. The blocks are fixed and dealt to threads in contiguous runs,
/// so every product has the same shape, and the same bits, on any number of threads. With
/// `mask` (the layer's input again, the ReLU output of the layer below), each block's `dx`
/// also goes through ReLU's derivative while in cache, beside the `x` columns the update reads.
fn kernel_blocks(
    kernel: &mut [f32],
    update: &mut SliceStep<'_>,
    dx: MatMut<'_>,
    x: MatRef<'_>,
    dz: MatRef<'_>,
    mask: Option<&[f32]>,
    threads: usize,
) {
    let (n, inputs, units) = (x.shape().0, x.shape().1, dz.shape().1);
    let blocks = inputs.div_ceil(BLOCK_ROWS);
    let runs: Vec<Range<usize>> = partition(blocks, threads)
        .into_iter()
        .map(|b| (b.start * BLOCK_ROWS).min(inputs)..(b.end * BLOCK_ROWS).min(inputs))
        .collect();
    let kernels = split_rows(kernel, &runs, units);
    let steps = update.split(&runs.iter().map(|r| r.start * units..r.end * units).collect::<Vec<_>>());
    let dxs = dx.split_cols(&runs);
    kernels.into_par_iter().zip(steps).zip(dxs).zip(&runs).for_each(|(((w, mut step), mut dx), run)| {
        for start in run.clone().step_by(BLOCK_ROWS) {
            let rows = start..(start + BLOCK_ROWS).min(run.end);
            let local = rows.start - run.start..rows.end - run.start;
            let w = &mut w[local.start * units..local.end * units];
            dx.gemm(local.clone(), dz, MatRef::rows(w, rows.len(), units).t(), 1.0);
            if let Some(x) = mask {
                dx.for_each_row(local.clone(), |i, d| {
                    activation::relu_mask(&x[i * inputs + rows.start..][..d.len()], d)
                });
            }
            step.sub(local.start * units..local.end * units).apply_product(w, |target, keep, scale| {
                let xt = x.block(0..n, rows.clone()).t();
                gemm_scaled(MatMut::rows(target, rows.len(), units), xt, dz, keep, scale, 1)
            });
        }
    });
}

impl Dense {
    /// The gradient before the activation: `dy` itself for a linear layer.
    fn dz<'a>(&'a mut self, y: &[f32], dy: &'a [f32], n: usize) -> &'a [f32] {
        let len = n * self.units;
        if self.activation == Activation::Linear || self.dy_masked {
            return &dy[..len];
        }
        self.dz.resize(len, 0.0);
        activation::backward(self.activation, &y[..len], &dy[..len], &mut self.dz, self.units);
        &self.dz
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::optimizer::{Optimizer, Sgd};

    /// A kernel of several row blocks (the last one short), with its input, output gradient and
    /// parameters.
    struct Fixture {
        inputs: usize,
        units: usize,
        n: usize,
        x: Vec<f32>,
        dy: Vec<f32>,
        params: Vec<f32>,
    }

    impl Fixture {
        fn new() -> Self {
            let (inputs, units, n) = (2 * BLOCK_ROWS + 88, 20, 5);
            let x = (0..n * inputs).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
            let dy = (0..n * units).map(|i| ((i * 53) % 89) as f32 / 89.0 - 0.5).collect();
            let params = (0..inputs * units + units).map(|i| ((i * 29) % 97) as f32 / 97.0 - 0.5).collect();
            Self { inputs, units, n, x, dy, params }
        }
    }

    /// `mask_dx`: `dx` comes out through ReLU's derivative at `x`, block by block, the same
    /// bits as masking the whole `dx` afterwards, as the ReLU's own layer did; `dy_masked`
    /// takes `dy` as the gradient before this layer's ReLU.
    #[test]
    fn masked_dx_is_the_relu_derivative_applied_after() {
        let Fixture { inputs, units, n, x, dy, params } = Fixture::new();
        let run = |mask: bool, premasked: bool| {
            let pass = Pass { training: true, seed: 0, accumulate: false, threads: 2 };
            let mut layer = Dense::new(inputs, units, Activation::Relu, true);
            let mut opt = Optimizer::Sgd(Sgd::new(params.len(), 0.9, false, 0.0));
            let (mut p, mut dx, mut y) = (params.clone(), vec![0.0; n * inputs], vec![0.0; n * units]);
            layer.forward(pass, &p, &mut [], &x, &mut y, n);
            let mut dy = dy.clone();
            if premasked {
                activation::relu_mask(&y, &mut dy);
            }
            assert!(layer.mask_dx(mask));
            layer.dy_masked(premasked);
            let Some(mut step) = opt.fused(0.1) else { panic!("SGD must fuse") };
            let mut slice = step.slice(0..p.len());
            layer.backward_update(pass, &mut p, &mut slice, &mut Vec::new(), &x, &y, &dy, Some(&mut dx), n);
            (p, dx)
        };
        let (want_p, mut want_dx) = run(false, false);
        activation::relu_mask(&x, &mut want_dx);
        assert!(want_dx.iter().any(|v| *v == 0.0) && want_dx.iter().any(|v| *v != 0.0));
        for premasked in [false, true] {
            assert!(run(true, premasked) == (want_p.clone(), want_dx.clone()), "premasked {premasked}");
        }
    }

    /// A kernel of several row blocks (the last one short): `dx` and the fused update match
    /// backward + the optimizer pass, and are the same bits on any number of threads.
    #[test]
    fn blocked_kernel_update_matches_the_unfused_step_on_any_thread_count() {
        let Fixture { inputs, units, n, x, dy, params } = Fixture::new();
        for momentum in [0.0, 0.9] {
            let run_fused = |threads: usize| {
                let pass = Pass { training: true, seed: 0, accumulate: false, threads };
                let mut layer = Dense::new(inputs, units, Activation::Relu, true);
                let mut opt = Optimizer::Sgd(Sgd::new(params.len(), momentum, false, 0.0));
                let (mut p, mut dx, mut y) = (params.clone(), vec![0.0; n * inputs], vec![0.0; n * units]);
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    for _ in 0..2 {
                        layer.forward(pass, &p, &mut [], &x, &mut y, n);
                        let Some(mut step) = opt.fused(0.1) else { panic!("SGD must fuse") };
                        let mut slice = step.slice(0..p.len());
                        layer.backward_update(pass, &mut p, &mut slice, &mut Vec::new(), &x, &y, &dy, Some(&mut dx), n);
                    }
                });
                (p, dx)
            };
            let pass = Pass { training: true, seed: 0, accumulate: false, threads: 1 };
            let mut layer = Dense::new(inputs, units, Activation::Relu, true);
            let mut opt = Optimizer::Sgd(Sgd::new(params.len(), momentum, false, 0.0));
            let (mut want, mut want_dx, mut y) = (params.clone(), vec![0.0; n * inputs], vec![0.0; n * units]);
            let mut g = vec![0.0; params.len()];
            for _ in 0..2 {
                layer.forward(pass, &want, &mut [], &x, &mut y, n);
                layer.backward(pass, &want, &mut g, &x, &y, &dy, Some(&mut want_dx), n);
                opt.step(&mut want, &g, 0.1);
            }
            let (got, got_dx) = run_fused(1);
            let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            assert!(worst(&got, &want) < 1e-5, "momentum {momentum}: weights off by {}", worst(&got, &want));
            assert!(worst(&got_dx, &want_dx) < 1e-5, "momentum {momentum}: dx off by {}", worst(&got_dx, &want_dx));
            assert_ne!(got, params, "the update moved the weights");
            for threads in [2, 3] {
                assert!(run_fused(threads) == (got.clone(), got_dx.clone()), "{threads} threads changed the bits");
            }
        }
    }
}

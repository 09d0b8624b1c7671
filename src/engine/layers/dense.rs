//! `dense`: `activation(x · kernel + bias)`, Keras's `Dense`, on `gemm` (or, under
//! `mixed_bfloat16`, on the bf16 path for layers wide enough: `engine::bf16`). Where `x` is
//! mostly zeros (a ReLU's output) the products walk its nonzeros instead, in fp32 under either
//! policy: the walk skips the work any dense product, bf16 or not, would do on the zeros.

use crate::engine::activation;
use crate::engine::bf16::{self, ProductPath};
use crate::engine::kernels::{add_bias, add_rows, par_rows, split_rows};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::meet::{self, BLOCK_ROWS, RowBlock};
use crate::engine::op::Op;
use crate::engine::optimizer::SliceStep;
use crate::engine::shape::Shape;
use crate::engine::sparse;
use crate::engine::strided::{ColumnBlock, MatMut, MatRef};
use crate::vocab::Activation;
use rayon::prelude::*;
use std::ops::Range;

thread_local! {
    /// Each thread's list of one row's nonzeros for the sparse forward product.
    static LIST: std::cell::RefCell<sparse::Nonzeros> = std::cell::RefCell::new(sparse::Nonzeros::default());
}

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
    /// How the kernel's dense products run (the precision policy).
    products: ProductPath,
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
            products: ProductPath::Float32,
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

    fn use_products(&mut self, path: ProductPath) -> bool {
        self.products = path.for_dims(self.inputs, self.units);
        !self.products.is_float32()
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

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (kernel, bias) = params.split_at(self.inputs * self.units);
        let (inputs, units, act, use_bias) = (self.inputs, self.units, self.activation, self.use_bias);
        let x = &x[..n * inputs];
        let sparse = sparse::pays_for(x, sparse::forward_pays);
        if !sparse {
            bf16::gemm(
                self.products,
                MatMut::rows(y, n, units),
                MatRef::rows(x, n, inputs),
                MatRef::rows(kernel, inputs, units),
                false,
                1.0,
                pass.threads,
            );
        }
        par_rows(y, n, units, pass.threads, |_, part, rows| {
            if sparse {
                let x = &x[part.start * inputs..part.end * inputs];
                LIST.with_borrow_mut(|list| sparse::forward_rows(x, inputs, kernel, units, rows, list));
            }
            if use_bias {
                add_bias(rows, &bias[..units]);
            }
            activation::forward(act, rows, units);
        });
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, y, dy, n } = cx;
        let (inputs, units, threads, use_bias, mask, products) =
            (self.inputs, self.units, pass.threads, self.use_bias, self.mask_dx, self.products);
        let dz = self.dz(y, dy, n);
        let kernel = &params[..inputs * units];
        let (g_kernel, g_bias) = grads.split_at_mut(inputs * units);
        if use_bias {
            if !pass.accumulate {
                g_bias.fill(0.0);
            }
            add_rows(g_bias, dz);
        }
        let x = &x[..n * inputs];
        // Above a ReLU, every block of kernel rows chooses between gemm and the walk over the
        // ReLU's nonzeros, as the fused update and replicas meeting do, so all three take the
        // same products; the walk computes `dx` only where ReLU lets it through.
        if mask || (dx.is_none() && sparse::pays_for(x, sparse::backward_pays)) {
            let sink = Sink::Grads { kernel, grads: g_kernel, accumulate: pass.accumulate };
            let dx = dx.map(|dx| MatMut::rows(dx, n, inputs));
            kernel_blocks(sink, dx, x, dz, (n, inputs, units), (mask, products), threads);
            return;
        }
        let (x_m, dz_m, kernel_m) =
            (MatRef::rows(x, n, inputs), MatRef::rows(dz, n, units), MatRef::rows(kernel, inputs, units));
        bf16::gemm(products, MatMut::rows(g_kernel, inputs, units), x_m.t(), dz_m, pass.accumulate, 1.0, threads);
        if let Some(dx) = dx {
            bf16::gemm(products, MatMut::rows(dx, n, inputs), dz_m, kernel_m.t(), false, 1.0, threads);
            if mask {
                activation::relu_mask(x, &mut dx[..n * inputs]);
            }
        }
    }

    fn kernel_product(&self) -> Option<(usize, usize)> {
        Some((self.inputs, self.units))
    }

    fn kernel_products(&self) -> ProductPath {
        self.products
    }

    fn backward_dz(&mut self, cx: Backward<'_>, grads: &mut [f32]) -> &[f32] {
        let Backward { pass, y, dy, n, .. } = cx;
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
        cx: Backward<'_>,
        params: &mut [f32],
        update: &mut SliceStep<'_>,
        scratch: &mut Vec<f32>,
        dx: Option<&mut [f32]>,
    ) {
        let Backward { pass, x, y, dy, n } = cx;
        let (inputs, units, threads, use_bias) = (self.inputs, self.units, pass.threads, self.use_bias);
        let how = (self.mask_dx, self.products);
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
        let (x_rows, dz_rows) = (&x[..n * inputs], dz);
        let (x, dz) = (MatRef::rows(x, n, inputs), MatRef::rows(dz, n, units));
        let kernel_update = &mut update.sub(0..k_len);
        match dx {
            Some(dx) => {
                let sink = Sink::Step { kernel, step: kernel_update };
                kernel_blocks(
                    sink,
                    Some(MatMut::rows(dx, n, inputs)),
                    x_rows,
                    dz_rows,
                    (n, inputs, units),
                    how,
                    threads,
                )
            }
            None if sparse::pays_for(x_rows, sparse::backward_pays) => {
                let sink = Sink::Step { kernel, step: kernel_update };
                kernel_blocks(sink, None, x_rows, dz_rows, (n, inputs, units), how, threads)
            }
            None => kernel_update.apply_product(kernel, |target, keep, scale| {
                bf16::product(how.1, MatMut::rows(target, inputs, units), x.t(), dz, keep, scale, threads)
            }),
        }
    }
}

/// Where the kernel's gradient goes, block by block: into the optimizer's update inside the
/// product ([`SliceStep::apply_product`]), or stored for an all-reduce.
enum Sink<'a, 's> {
    Step { kernel: &'a mut [f32], step: &'a mut SliceStep<'s> },
    Grads { kernel: &'a [f32], grads: &'a mut [f32], accumulate: bool },
}

/// One thread's run of kernel rows of a [`Sink`].
enum RunSink<'a> {
    Step { kernel: &'a mut [f32], step: SliceStep<'a> },
    Grads { kernel: &'a [f32], grads: &'a mut [f32], accumulate: bool },
}

impl<'a> Sink<'a, '_> {
    /// The runs of kernel rows `runs`, `units` wide.
    fn split(self, runs: &[Range<usize>], units: usize) -> Vec<RunSink<'a>>
    where
        Self: 'a,
    {
        match self {
            Sink::Step { kernel, step } => {
                let steps = step.split(&runs.iter().map(|r| r.start * units..r.end * units).collect::<Vec<_>>());
                split_rows(kernel, runs, units)
                    .into_iter()
                    .zip(steps)
                    .map(|(kernel, step)| RunSink::Step { kernel, step })
                    .collect()
            }
            Sink::Grads { kernel, grads, accumulate } => split_rows(grads, runs, units)
                .into_iter()
                .zip(runs)
                .map(|(grads, r)| RunSink::Grads { kernel: &kernel[r.start * units..r.end * units], grads, accumulate })
                .collect(),
        }
    }
}

impl RunSink<'_> {
    /// The kernel rows `local` (counted within the run).
    fn kernel(&self, local: Range<usize>, units: usize) -> &[f32] {
        match self {
            RunSink::Step { kernel, .. } => &kernel[local.start * units..local.end * units],
            RunSink::Grads { kernel, .. } => &kernel[local.start * units..local.end * units],
        }
    }

    /// Hands rows `local`'s gradient target to `product`, which writes
    /// `target = keep·target + scale·g`.
    fn take(&mut self, local: Range<usize>, units: usize, product: impl FnOnce(&mut [f32], Option<f32>, f32)) {
        let range = local.start * units..local.end * units;
        match self {
            RunSink::Step { kernel, step } => step.sub(range.clone()).apply_product(&mut kernel[range], product),
            RunSink::Grads { grads, accumulate, .. } => product(&mut grads[range], accumulate.then_some(1.0), 1.0),
        }
    }
}

/// `dx = dz · kernelᵀ` and the kernel's gradient `xᵀ · dz`, block of kernel rows by block:
/// a block gives its columns of `dx`, with the weights forward used, and then its gradient to
/// `sink` while still in cache. The blocks are fixed and dealt to threads in contiguous runs,
/// so every product has the same shape, and the same bits, on any number of threads. With
/// `mask` (`x` is the ReLU output of the layer below), each block's `dx` also goes through
/// ReLU's derivative while in cache, beside the `x` columns the gradient reads; then a block
/// whose columns of `x` are mostly zero skips them ([`sparse`]). The dense products run on
/// `products`.
fn kernel_blocks(
    sink: Sink<'_, '_>,
    dx: Option<MatMut<'_>>,
    x: &[f32],
    dz: &[f32],
    (n, inputs, units): (usize, usize, usize),
    (mask, products): (bool, ProductPath),
    threads: usize,
) {
    let runs = meet::runs(inputs, threads);
    let sinks = sink.split(&runs, units);
    let dxs: Vec<Option<ColumnBlock<'_>>> = match dx {
        Some(dx) => dx.split_cols(&runs).into_iter().map(Some).collect(),
        None => runs.iter().map(|_| None).collect(),
    };
    sinks.into_par_iter().zip(dxs).zip(&runs).for_each(|((mut sink, mut dx), run)| {
        let mut columns = sparse::Columns::default();
        for start in run.clone().step_by(BLOCK_ROWS) {
            let rows = start..(start + BLOCK_ROWS).min(run.end);
            let local = rows.start - run.start..rows.end - run.start;
            let block = RowBlock { x, dz, n, inputs, units, rows, local: local.clone(), mask, products };
            let sparse = block.dx(&mut columns, dx.as_mut(), sink.kernel(local.clone(), units));
            sink.take(local, units, |target, keep, scale| block.product(&columns, sparse, target, keep, scale));
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
    use crate::engine::layer::Pass;
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
            Self::with_inputs(2 * BLOCK_ROWS + 88)
        }

        fn with_inputs(inputs: usize) -> Self {
            Self::with_shape(inputs, 20)
        }

        fn with_shape(inputs: usize, units: usize) -> Self {
            let n = 5;
            let x = (0..n * inputs).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
            let dy = (0..n * units).map(|i| ((i * 53) % 89) as f32 / 89.0 - 0.5).collect();
            let params = (0..inputs * units + units).map(|i| ((i * 29) % 97) as f32 / 97.0 - 0.5).collect();
            Self { inputs, units, n, x, dy, params }
        }

        /// Four row blocks (the last short) with `x` a ReLU's output: in the first block of
        /// kernel rows 40 % of `x` nonzero (gemm's path on every CPU family's row), in the others
        /// about one value in 23 (the sparse path), and the whole (15 %) sparse enough for
        /// forward to walk it on every row (`engine::tuning`).
        fn relu_output() -> Self {
            let mut f = Self::with_inputs(3 * BLOCK_ROWS + 88);
            let inputs = f.inputs;
            for (i, v) in f.x.iter_mut().enumerate() {
                let dense = i % inputs < BLOCK_ROWS;
                *v = if (dense && i % 5 < 2) || (!dense && (i * 7919) % 23 == 0) { v.abs() + 0.01 } else { 0.0 };
            }
            let (n, rows) = (f.n, BLOCK_ROWS);
            let block = |b: usize| {
                (0..n).flat_map(move |r| (b * rows..((b + 1) * rows).min(inputs)).map(move |k| r * inputs + k))
            };
            let count = |b: usize| block(b).filter(|&i| f.x[i] != 0.0).count();
            assert!(
                !sparse::backward_pays(count(0), n * rows) && sparse::backward_pays(count(1), n * rows),
                "one block of each kind"
            );
            assert!(sparse::forward_pays(sparse::count_nonzeros(&f.x), f.x.len()), "the forward product goes sparse");
            f
        }
    }

    /// Forward, the kernel's gradient and the masked `dx` on a ReLU's output (sparse blocks
    /// beside a dense one) are the exact sums within rounding, and the same bits on any number
    /// of threads.
    #[test]
    fn sparse_products_are_the_exact_ones_on_any_thread_count() {
        let Fixture { inputs, units, n, x, dy, params } = Fixture::relu_output();
        let run = |threads: usize| {
            let pass = Pass { training: true, seed: 0, accumulate: false, threads };
            let mut layer = Dense::new(inputs, units, Activation::Relu, true);
            assert!(layer.mask_dx(true));
            let (mut y, mut g, mut dx) = (vec![0.0; n * units], vec![0.0; params.len()], vec![0.0; n * inputs]);
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                layer.forward(Forward { pass, x: &x, n }, &params, &mut [], &mut y);
                layer.backward(Backward { pass, x: &x, y: &y, dy: &dy, n }, &params, &mut g, Some(&mut dx));
            });
            (y, g, dx)
        };
        let (y, g, dx) = run(1);
        let (w, bias) = params.split_at(inputs * units);
        let close =
            |got: f32, want: f64, what: &str| assert!((got as f64 - want).abs() < 1e-4, "{what}: {got} != {want}");
        for b in 0..n {
            for u in 0..units {
                let z: f64 = bias[u] as f64
                    + (0..inputs).map(|k| x[b * inputs + k] as f64 * w[k * units + u] as f64).sum::<f64>();
                close(y[b * units + u], z.max(0.0), &format!("y[{b}, {u}]"));
            }
        }
        let dz = |b: usize, u: usize| if y[b * units + u] > 0.0 { dy[b * units + u] as f64 } else { 0.0 };
        for k in 0..inputs {
            for u in 0..units {
                let want: f64 = (0..n).map(|b| x[b * inputs + k] as f64 * dz(b, u)).sum();
                close(g[k * units + u], want, &format!("kernel gradient [{k}, {u}]"));
            }
            for b in 0..n {
                let want: f64 = (0..units).map(|u| dz(b, u) * w[k * units + u] as f64).sum();
                close(dx[b * inputs + k], if x[b * inputs + k] > 0.0 { want } else { 0.0 }, &format!("dx[{b}, {k}]"));
            }
        }
        for threads in [2, 3] {
            assert!(run(threads) == (y.clone(), g.clone(), dx.clone()), "{threads} threads changed the bits");
        }
        // No examples: a stored gradient is zero, not the last step's.
        let pass = Pass { training: true, seed: 0, accumulate: false, threads: 2 };
        let mut layer = Dense::new(inputs, units, Activation::Relu, true);
        assert!(layer.mask_dx(true));
        let mut stale = vec![1.0; params.len()];
        layer.backward(Backward { pass, x: &[], y: &[], dy: &[], n: 0 }, &params, &mut stale, Some(&mut []));
        assert!(stale.iter().all(|v| *v == 0.0), "an empty batch left a gradient behind");
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
            layer.forward(Forward { pass, x: &x, n }, &p, &mut [], &mut y);
            let mut dy = dy.clone();
            if premasked {
                activation::relu_mask(&y, &mut dy);
            }
            assert!(layer.mask_dx(mask));
            layer.dy_masked(premasked);
            let Some(mut step) = opt.fused(0.1) else { panic!("SGD must fuse") };
            let mut slice = step.slice(0..p.len());
            let cx = Backward { pass, x: &x, y: &y, dy: &dy, n };
            layer.backward_update(cx, &mut p, &mut slice, &mut Vec::new(), Some(&mut dx));
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
        for (fixture, mask) in [(Fixture::new(), false), (Fixture::relu_output(), true)] {
            blocked_update_matches(fixture, mask, ProductPath::Float32);
        }
    }

    /// Under `mixed_bfloat16` the kernel's products take every bf16 path this CPU has (the
    /// portable emulation everywhere, AMX or `vdpbf16ps` where present): forward, the blocked
    /// `dx` and fused update match backward + the optimizer pass, the same bits on any number
    /// of threads, within bf16's rounding of float32's weights and not equal to them.
    #[test]
    fn bf16_products_match_the_unfused_step_on_any_thread_count() {
        // 256 units: wide enough for every path ([`ProductPath::pays_from`]).
        let (inputs, units) = (2 * BLOCK_ROWS + 88, 256);
        let fp32 = blocked_update_matches(Fixture::with_shape(inputs, units), false, ProductPath::Float32);
        let paths = bf16::bf16_paths_to_test();
        if !paths.contains(&ProductPath::Amx) {
            eprintln!("this CPU has no AMX: its path is not tested here (the emulated one is)");
        }
        for path in paths {
            let mut layer = Dense::new(inputs, units, Activation::Relu, true);
            assert!(layer.use_products(path), "{path:?} not taken by a {inputs} × {units} kernel");
            assert_eq!(layer.kernel_products(), path);
            let weights = blocked_update_matches(Fixture::with_shape(inputs, units), false, path);
            let apart = weights.iter().zip(&fp32).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(apart > 0.0 && apart < 2e-2, "{path:?}: {apart} from float32's weights");
        }
        assert!(!Dense::new(inputs, 20, Activation::Relu, true).use_products(ProductPath::Amx), "too narrow for AMX");
    }

    /// [`blocked_kernel_update_matches_the_unfused_step_on_any_thread_count`] for one input,
    /// `dx` masked or not, products on `path`; returns the weights after two steps.
    fn blocked_update_matches(fixture: Fixture, mask: bool, path: ProductPath) -> Vec<f32> {
        let Fixture { inputs, units, n, x, dy, params } = fixture;
        let layer = || {
            let mut layer = Dense::new(inputs, units, Activation::Relu, true);
            assert!(layer.mask_dx(mask) || !mask);
            layer.use_products(path);
            layer
        };
        let mut last = Vec::new();
        for momentum in [0.0, 0.9] {
            let run_fused = |threads: usize| {
                let pass = Pass { training: true, seed: 0, accumulate: false, threads };
                let mut layer = layer();
                let mut opt = Optimizer::Sgd(Sgd::new(params.len(), momentum, false, 0.0));
                let (mut p, mut dx, mut y) = (params.clone(), vec![0.0; n * inputs], vec![0.0; n * units]);
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    for _ in 0..2 {
                        layer.forward(Forward { pass, x: &x, n }, &p, &mut [], &mut y);
                        let Some(mut step) = opt.fused(0.1) else { panic!("SGD must fuse") };
                        let mut slice = step.slice(0..p.len());
                        let cx = Backward { pass, x: &x, y: &y, dy: &dy, n };
                        layer.backward_update(cx, &mut p, &mut slice, &mut Vec::new(), Some(&mut dx));
                    }
                });
                (p, dx)
            };
            let pass = Pass { training: true, seed: 0, accumulate: false, threads: 1 };
            let mut layer = layer();
            let mut opt = Optimizer::Sgd(Sgd::new(params.len(), momentum, false, 0.0));
            let (mut want, mut want_dx, mut y) = (params.clone(), vec![0.0; n * inputs], vec![0.0; n * units]);
            let mut g = vec![0.0; params.len()];
            for _ in 0..2 {
                layer.forward(Forward { pass, x: &x, n }, &want, &mut [], &mut y);
                layer.backward(Backward { pass, x: &x, y: &y, dy: &dy, n }, &want, &mut g, Some(&mut want_dx));
                opt.step(&mut want, &g, 0.1);
            }
            let (got, got_dx) = run_fused(1);
            let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            assert!(
                worst(&got, &want) < 1e-5,
                "mask {mask}, momentum {momentum}: weights off by {}",
                worst(&got, &want)
            );
            assert!(
                worst(&got_dx, &want_dx) < 1e-5,
                "mask {mask}, momentum {momentum}: dx off by {}",
                worst(&got_dx, &want_dx)
            );
            assert_ne!(got, params, "the update moved the weights");
            for threads in [2, 3] {
                assert!(run_fused(threads) == (got.clone(), got_dx.clone()), "{threads} threads changed the bits");
            }
            last = got;
        }
        last
    }
}

//! `conv2d`: Keras's `Conv2D` (channels last) as im2col + `gemm`, split over threads by image;
//! one-channel 3 × 3 layers (MNIST's first) run direct kernels instead (`conv2d_direct`).
//! Under `mixed_bfloat16` the im2col products take the bf16 path where the layer is wide
//! enough for it to pay (patch length and filters, as `dense` decides on its inputs and
//! units); the direct kernels stay fp32, since a 9-long patch gives a tile nothing to do.
//!
//! The batch is split into a fixed number of parts ([`SUM_PARTS`]), each worked through in
//! chunks small enough to stay in cache with its own partial weight gradient; the partials are
//! summed in part order, so results depend neither on scheduling nor on the thread count.

use super::conv2d_direct;
use crate::engine::activation;
use crate::engine::bf16::{self, ProductPath};
use crate::engine::kernels::{SUM_PARTS, Window, add_bias, add_rows, partition, split_rows};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec};
use crate::engine::op::{ConvOp, Op};
use crate::engine::shape::Shape;
use crate::engine::strided::{MatMut, MatRef};
use crate::vocab::Activation;
use rayon::prelude::*;

/// Patch values one chunk may hold (1 MiB of f32): keeps im2col output cache-resident.
const CHUNK_VALUES: usize = 1 << 18;

/// How a convolution's kernel starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelInit {
    /// Keras's default for `Conv2D`.
    #[default]
    GlorotUniform,
    /// He et al.'s normal, as ResNets use: keeps activations' variance through relu stacks.
    HeNormal,
}

/// One thread's scratch.
#[derive(Default)]
struct ThreadScratch {
    /// im2col patches: one chunk's, or (see [`KEEP_VALUES`]) the whole part's, kept from
    /// forward for backward.
    patches: Vec<f32>,
    /// Patch gradients of one chunk.
    d_patches: Vec<f32>,
    /// Gradient before the activation, one chunk.
    dz: Vec<f32>,
    d_kernel: Vec<f32>,
    d_bias: Vec<f32>,
}

/// Patch values a training forward keeps for backward instead of redoing im2col (8 MiB of
/// f32 across the batch): the tutorial's first layer fits; big ResNet layers recompute.
const KEEP_VALUES: usize = 1 << 21;

/// A 2-D convolution layer.
pub struct Conv2d {
    win: Window,
    filters: usize,
    activation: Activation,
    use_bias: bool,
    kernel_init: KernelInit,
    output: Shape,
    parts: Vec<ThreadScratch>,
    /// Batch size whose patches the parts hold from the last training forward.
    kept: Option<usize>,
    /// Backward's `dy` comes through the ReLU's derivative already ([`Layer::dy_masked`]).
    dy_masked: bool,
    /// How the im2col products run (the precision policy).
    products: ProductPath,
}

impl Conv2d {
    /// A convolution with the given geometry and `filters` outputs.
    pub fn new(win: Window, filters: usize, activation: Activation, use_bias: bool) -> Self {
        let output = Shape(vec![win.oh, win.ow, filters]);
        Self {
            win,
            filters,
            activation,
            use_bias,
            kernel_init: KernelInit::default(),
            output,
            parts: Vec::new(),
            kept: None,
            dy_masked: false,
            products: ProductPath::Float32,
        }
    }

    /// The same convolution with its kernel drawn by `init` instead of Glorot-uniform.
    pub fn with_kernel_init(mut self, init: KernelInit) -> Self {
        self.kernel_init = init;
        self
    }

    fn kernel_len(&self) -> usize {
        self.win.patch_len() * self.filters
    }

    fn images_per_chunk(&self) -> usize {
        (CHUNK_VALUES / (self.win.positions() * self.win.patch_len()).max(1)).max(1)
    }
}

impl Conv2d {
    /// This convolution as other engines describe it, its tensors at the start of its slice.
    pub(crate) fn conv_op(&self) -> ConvOp {
        let w = &self.win;
        let bias = self.use_bias.then_some(w.kh * w.kw * w.c * self.filters);
        ConvOp { window: self.win, filters: self.filters, activation: self.activation, kernel: 0, bias }
    }
}

impl Layer for Conv2d {
    fn op(&self) -> Option<Op> {
        Some(Op::Conv2d(self.conv_op()))
    }

    fn kind(&self) -> &'static str {
        "conv2d"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn relu_output(&self) -> bool {
        self.activation == Activation::Relu
    }

    fn dy_masked(&mut self, on: bool) {
        self.dy_masked = on;
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        self.products = if conv2d_direct::applies(&self.win, self.filters) {
            ProductPath::Float32
        } else {
            path.for_dims(self.win.patch_len(), self.filters)
        };
        !self.products.is_float32()
    }

    fn params(&self) -> Vec<ParamSpec> {
        let w = &self.win;
        let fan_in = w.kh * w.kw * w.c;
        let init = match self.kernel_init {
            KernelInit::GlorotUniform => Init::GlorotUniform { fan_in, fan_out: w.kh * w.kw * self.filters },
            KernelInit::HeNormal => Init::HeNormal { fan_in },
        };
        let mut p = vec![ParamSpec::new("kernel", vec![w.kh, w.kw, w.c, self.filters], init)];
        if self.use_bias {
            p.push(ParamSpec::new("bias", vec![self.filters], Init::Zeros));
        }
        p
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (win, filters, act, use_bias, products) =
            (self.win, self.filters, self.activation, self.use_bias, self.products);
        let chunk = self.images_per_chunk();
        let (kernel, bias) = params.split_at(self.kernel_len());
        let ranges = partition(n, SUM_PARTS);
        self.parts.resize_with(ranges.len(), ThreadScratch::default);
        let (in_len, out_len, per_image) =
            (win.h * win.w * win.c, win.positions() * filters, win.positions() * win.patch_len());
        let direct = conv2d_direct::applies(&win, filters);
        let keep = pass.training && n * per_image <= KEEP_VALUES && !direct;
        self.kept = keep.then_some(n);
        let ys = split_rows(&mut y[..n * out_len], &ranges, out_len);
        self.parts.par_iter_mut().zip(ys).zip(&ranges).for_each(|((part, y), r)| {
            let x = &x[r.start * in_len..r.end * in_len];
            if direct {
                // ReLU is applied in the kernel's registers, not in a second pass over the
                // whole output (5.5 MB at batch 64 in the tutorial). With the kernel's pixels
                // taken in groups, the layer went from 13 % of predict's time on the tutorial
                // model to 6 % (perf samples, batch 64, 2 threads).
                let relu = act == Activation::Relu;
                conv2d_direct::forward(&win, kernel, use_bias.then_some(bias), relu, x, r.len(), y);
                if !relu {
                    activation::forward(act, y, filters);
                }
                return;
            }
            part.patches.resize(if keep { r.len() } else { chunk.min(r.len()) } * per_image, 0.0);
            for start in (0..r.len()).step_by(chunk) {
                let imgs = chunk.min(r.len() - start);
                let at = if keep { start * per_image } else { 0 };
                let patches = &mut part.patches[at..at + imgs * per_image];
                win.im2col(&x[start * in_len..], imgs, patches);
                let y = &mut y[start * out_len..(start + imgs) * out_len];
                let (rows, pl) = (imgs * win.positions(), win.patch_len());
                let (patches, kernel) = (MatRef::rows(patches, rows, pl), MatRef::rows(kernel, pl, filters));
                bf16::gemm(products, MatMut::rows(y, rows, filters), patches, kernel, false, 1.0, 1);
                if use_bias {
                    add_bias(y, &bias[..filters]);
                }
                activation::forward(act, y, filters);
            }
        });
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, y, dy, n } = cx;
        let (win, filters, products) = (self.win, self.filters, self.products);
        let act = if self.dy_masked { Activation::Linear } else { self.activation };
        let chunk = self.images_per_chunk();
        let (kernel_len, pl) = (self.kernel_len(), win.patch_len());
        let kernel = &params[..kernel_len];
        let (in_len, out_len, per_image) = (win.h * win.w * win.c, win.positions() * filters, win.positions() * pl);
        let kept = self.kept.take() == Some(n);
        let direct = conv2d_direct::applies(&win, filters);
        let ranges = partition(n, SUM_PARTS);
        self.parts.resize_with(ranges.len(), ThreadScratch::default);
        let dxs: Vec<Option<&mut [f32]>> = match dx {
            Some(dx) => split_rows(&mut dx[..n * in_len], &ranges, in_len).into_iter().map(Some).collect(),
            None => ranges.iter().map(|_| None).collect(),
        };
        self.parts.par_iter_mut().zip(dxs).zip(&ranges).for_each(|((part, mut dx), r)| {
            part.d_kernel.resize(kernel_len, 0.0);
            part.d_bias.clear();
            part.d_bias.resize(filters, 0.0);
            if r.is_empty() || direct {
                // The direct kernels add to it from the first chunk on.
                part.d_kernel.fill(0.0);
            }
            let ThreadScratch { patches: part_patches, d_patches, dz: part_dz, d_kernel, d_bias } = part;
            for start in (0..r.len()).step_by(chunk) {
                let imgs = chunk.min(r.len() - start);
                let rows = imgs * win.positions();
                let at = (r.start + start) * out_len;
                let (y, dy) = (&y[at..at + imgs * out_len], &dy[at..at + imgs * out_len]);
                // Per chunk, so the activation gradient is still in cache for the products.
                let dz: &[f32] = if act == Activation::Linear {
                    dy
                } else {
                    part_dz.resize(imgs * out_len, 0.0);
                    activation::backward(act, y, dy, part_dz, filters);
                    part_dz
                };
                if direct && dx.is_none() {
                    conv2d_direct::backward(&win, &x[(r.start + start) * in_len..], imgs, dz, d_kernel, d_bias);
                    continue;
                }
                let patches: &[f32] = if kept {
                    &part_patches[start * per_image..(start + imgs) * per_image]
                } else {
                    part_patches.resize(imgs * per_image, 0.0);
                    win.im2col(&x[(r.start + start) * in_len..], imgs, part_patches);
                    part_patches
                };
                let (patches_m, dz_m) = (MatRef::rows(patches, rows, pl), MatRef::rows(dz, rows, filters));
                bf16::gemm(products, MatMut::rows(d_kernel, pl, filters), patches_m.t(), dz_m, start > 0, 1.0, 1);
                add_rows(d_bias, dz);
                if let Some(dx) = dx.as_deref_mut() {
                    d_patches.resize(rows * pl, 0.0);
                    let kernel = MatRef::rows(kernel, pl, filters);
                    bf16::gemm(products, MatMut::rows(d_patches, rows, pl), dz_m, kernel.t(), false, 1.0, 1);
                    let dx = &mut dx[start * in_len..(start + imgs) * in_len];
                    dx.fill(0.0);
                    win.col2im(d_patches, imgs, dx);
                }
            }
        });
        let (g_kernel, g_bias) = grads.split_at_mut(kernel_len);
        if !pass.accumulate {
            g_kernel.fill(0.0);
            g_bias.fill(0.0);
        }
        for part in &self.parts[..ranges.len()] {
            g_kernel.iter_mut().zip(&part.d_kernel).for_each(|(g, d)| *g += d);
            if self.use_bias {
                g_bias.iter_mut().zip(&part.d_bias).for_each(|(g, d)| *g += d);
            }
        }
    }
}

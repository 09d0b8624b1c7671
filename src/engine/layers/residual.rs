//! `residual`: a ResNet basic block (He et al., 2016, CIFAR style), a composite of child
//! layers: `relu(bn_2(conv_2(relu(bn_1(conv_1(x))))) + shortcut(x))`, where the shortcut is
//! the identity, or `shortcut_bn(shortcut_conv(x))` (1×1, strided) when the shape changes.
//!
//! Convolutions are 3×3 `same`, without bias (batch norm's β plays that part) and He-normal.
//! The children's parameters and state lie back to back in the block's slices, named
//! `conv_1/kernel`, `bn_1/gamma`, … so weight paths read `residual_2/conv_1/kernel`.

use super::batch_norm::BatchNorm;
use super::composite::{add, prefixed, ranges, sized, total};
use super::conv2d::{Conv2d, KernelInit};
use crate::engine::activation;
use crate::engine::bf16::ProductPath;
use crate::engine::kernels::{Window, par_rows};
use crate::engine::layer::{Backward, Forward, Layer, ParamSpec};
use crate::engine::op::{BatchNormOp, ConvOp, Op, ResidualOp};
use crate::engine::shape::Shape;
use crate::vocab::Activation;
use std::ops::Range;

/// The 1×1 projection used when the block changes resolution or width.
struct Projection {
    conv: Conv2d,
    bn: BatchNorm,
    /// The convolution's output.
    out: Vec<f32>,
}

/// A basic residual block.
pub struct Residual {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    shortcut: Option<Projection>,
    /// Parameter ranges in child order: conv_1, bn_1, conv_2, bn_2, shortcut_conv, shortcut_bn.
    params: Vec<Range<usize>>,
    /// State ranges: bn_1, bn_2, shortcut_bn.
    state: Vec<Range<usize>>,
    /// Values in one input example.
    input: usize,
    output: Shape,
    /// Activations kept for backward: conv_1's output, relu(bn_1(·)), conv_2's output.
    c1: Vec<f32>,
    a1: Vec<f32>,
    c2: Vec<f32>,
    /// Scratch: output-sized gradients and the shortcut's input gradient.
    g0: Vec<f32>,
    g1: Vec<f32>,
    g2: Vec<f32>,
    gx: Vec<f32>,
}

impl Residual {
    /// A block over `(h, w, c)` inputs with `filters` outputs and first-convolution `strides`;
    /// batch norms use `momentum` and `epsilon`. `None` when a dimension is zero.
    pub fn new(
        (h, w, c): (usize, usize, usize),
        filters: usize,
        strides: (usize, usize),
        momentum: f32,
        epsilon: f32,
    ) -> Option<Self> {
        if h == 0 || w == 0 || c == 0 || filters == 0 || strides.0 == 0 || strides.1 == 0 {
            return None;
        }
        let conv = |input, k, s| -> Option<Conv2d> {
            let win = Window::new(input, (k, k), s, true)?;
            Some(Conv2d::new(win, filters, Activation::Linear, false).with_kernel_init(KernelInit::HeNormal))
        };
        let conv1 = conv((h, w, c), 3, strides)?;
        let out = conv1.output_shape().clone();
        let (oh, ow, _) = out.hwc()?;
        let conv2 = conv((oh, ow, filters), 3, (1, 1))?;
        let bn = || BatchNorm::new(out.clone(), momentum, epsilon);
        let shortcut = if strides != (1, 1) || c != filters {
            Some(Projection { conv: conv((h, w, c), 1, strides)?, bn: bn(), out: Vec::new() })
        } else {
            None
        };
        let mut block = Self {
            conv1,
            bn1: bn(),
            conv2,
            bn2: bn(),
            shortcut,
            params: Vec::new(),
            state: Vec::new(),
            input: h * w * c,
            output: out,
            c1: Vec::new(),
            a1: Vec::new(),
            c2: Vec::new(),
            g0: Vec::new(),
            g1: Vec::new(),
            g2: Vec::new(),
            gx: Vec::new(),
        };
        block.params = ranges(block.children().map(|(_, l)| total(l.params())));
        block.state = ranges(block.children().map(|(_, l)| total(l.state())).filter(|&len| len > 0));
        Some(block)
    }

    /// Children with their weight-path prefixes, in slice order.
    fn children(&self) -> impl Iterator<Item = (&'static str, &dyn Layer)> {
        let main: [(&'static str, &dyn Layer); 4] =
            [("conv_1", &self.conv1), ("bn_1", &self.bn1), ("conv_2", &self.conv2), ("bn_2", &self.bn2)];
        let shortcut = self
            .shortcut
            .iter()
            .flat_map(|p| [("shortcut_conv", &p.conv as &dyn Layer), ("shortcut_bn", &p.bn as &dyn Layer)]);
        main.into_iter().chain(shortcut)
    }
}

/// `v = max(v, 0)`, in parallel.
fn relu(v: &mut [f32], rows: usize, row: usize, threads: usize) {
    par_rows(v, rows, row, threads, |_, _, part| {
        part.iter_mut().for_each(|v| *v = activation::relu(*v));
    });
}

/// `g = g ⊙ [y > 0]`: relu's backward from its output.
fn relu_mask(g: &mut [f32], y: &[f32], rows: usize, row: usize, threads: usize) {
    par_rows(g, rows, row, threads, |_, r, part| {
        let y = &y[r.start * row..r.end * row];
        part.iter_mut().zip(y).for_each(|(g, y)| *g = if *y > 0.0 { *g } else { 0.0 });
    });
}

/// `a = max(a + b, 0)`, in parallel: the block's join.
fn add_relu(a: &mut [f32], b: &[f32], rows: usize, row: usize, threads: usize) {
    par_rows(a, rows, row, threads, |_, r, part| {
        part.iter_mut().zip(&b[r.start * row..r.end * row]).for_each(|(a, b)| *a = activation::relu(*a + b));
    });
}

impl Layer for Residual {
    fn op(&self) -> Option<Op> {
        // Children lie back to back in slice order: conv_1, bn_1, conv_2, bn_2 (and the
        // projection's conv and bn); only the batch norms have state.
        let (p, s) = (&self.params, &self.state);
        let at = |i: usize| p.get(i).map_or(0, |r| r.start);
        let st = |i: usize| s.get(i).map_or(0, |r| r.start);
        let conv = |c: &Conv2d, i: usize| {
            let op = c.conv_op();
            ConvOp { kernel: op.kernel + at(i), bias: op.bias.map(|b| b + at(i)), ..op }
        };
        let bn = |b: &BatchNorm, i: usize, j: usize| {
            let op = b.batch_norm_op();
            BatchNormOp {
                gamma: op.gamma + at(i),
                beta: op.beta + at(i),
                moving_mean: op.moving_mean + st(j),
                moving_variance: op.moving_variance + st(j),
                ..op
            }
        };
        Some(Op::Residual(ResidualOp {
            conv1: conv(&self.conv1, 0),
            bn1: bn(&self.bn1, 1, 0),
            conv2: conv(&self.conv2, 2),
            bn2: bn(&self.bn2, 3, 1),
            shortcut: self.shortcut.as_ref().map(|sc| (conv(&sc.conv, 4), bn(&sc.bn, 5, 2))),
        }))
    }

    fn kind(&self) -> &'static str {
        "residual"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        // Every convolution is told, so no `||` that would stop at the first.
        let mut taken = vec![self.conv1.use_products(path), self.conv2.use_products(path)];
        taken.extend(self.shortcut.as_mut().map(|sc| sc.conv.use_products(path)));
        taken.contains(&true)
    }

    fn params(&self) -> Vec<ParamSpec> {
        prefixed(self.children(), |l| l.params())
    }

    fn state(&self) -> Vec<ParamSpec> {
        prefixed(self.children(), |l| l.state())
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], state: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (p, s) = (&self.params, &self.state);
        let row = self.output.numel();
        let (len, t) = (n * row, pass.threads);
        let (c1, a1, c2) = (sized(&mut self.c1, len), sized(&mut self.a1, len), sized(&mut self.c2, len));
        let y = &mut y[..len];
        self.conv1.forward(cx, &params[p[0].clone()], &mut [], c1);
        self.bn1.forward(Forward { pass, x: c1, n }, &params[p[1].clone()], &mut state[s[0].clone()], a1);
        relu(a1, n, row, t);
        self.conv2.forward(Forward { pass, x: a1, n }, &params[p[2].clone()], &mut [], c2);
        self.bn2.forward(Forward { pass, x: c2, n }, &params[p[3].clone()], &mut state[s[1].clone()], y);
        match &mut self.shortcut {
            None => add_relu(y, x, n, row, t),
            Some(proj) => {
                // g0 is backward scratch, free here: it holds the shortcut until added.
                let out = sized(&mut proj.out, len);
                let sc = sized(&mut self.g0, len);
                proj.conv.forward(cx, &params[p[4].clone()], &mut [], out);
                proj.bn.forward(Forward { pass, x: out, n }, &params[p[5].clone()], &mut state[s[2].clone()], sc);
                add_relu(y, sc, n, row, t);
            }
        }
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], mut dx: Option<&mut [f32]>) {
        let Backward { pass, x, y, dy, n } = cx;
        let p = &self.params;
        let row = self.output.numel();
        let (len, t) = (n * row, pass.threads);
        let in_len = n * self.input;
        let (c1, a1, c2) = (&self.c1[..len], &self.a1[..len], &self.c2[..len]);
        let g0 = sized(&mut self.g0, len);
        g0.copy_from_slice(&dy[..len]);
        relu_mask(g0, y, n, row, t);
        let g0 = &*g0;
        let (g1, g2) = (sized(&mut self.g1, len), sized(&mut self.g2, len));
        // Main branch, back to front: g2 = d c2, g1 = d a1, then g2 = d c1.
        self.bn2.backward(
            Backward { pass, x: c2, y, dy: g0, n },
            &params[p[3].clone()],
            &mut grads[p[3].clone()],
            Some(g2),
        );
        self.conv2.backward(
            Backward { pass, x: a1, y: c2, dy: g2, n },
            &params[p[2].clone()],
            &mut grads[p[2].clone()],
            Some(g1),
        );
        relu_mask(g1, a1, n, row, t);
        self.bn1.backward(
            Backward { pass, x: c1, y: a1, dy: g1, n },
            &params[p[1].clone()],
            &mut grads[p[1].clone()],
            Some(g2),
        );
        self.conv1.backward(
            Backward { pass, x, y: c1, dy: g2, n },
            &params[p[0].clone()],
            &mut grads[p[0].clone()],
            dx.as_deref_mut(),
        );
        match &mut self.shortcut {
            None => {
                if let Some(dx) = dx {
                    add(&mut dx[..len], g0, n, row, t);
                }
            }
            Some(proj) => {
                let out = &proj.out[..len];
                proj.bn.backward(
                    Backward { pass, x: out, y: out, dy: g0, n },
                    &params[p[5].clone()],
                    &mut grads[p[5].clone()],
                    Some(g1),
                );
                let gx = dx.is_some().then(|| sized(&mut self.gx, in_len));
                proj.conv.backward(
                    Backward { pass, x, y: out, dy: g1, n },
                    &params[p[4].clone()],
                    &mut grads[p[4].clone()],
                    gx,
                );
                if let Some(dx) = dx {
                    add(&mut dx[..in_len], &self.gx[..in_len], n, self.input, t);
                }
            }
        }
    }
}

//! `transformer_block`: a pre-LN GPT-2 block, a composite of child layers (as `residual.rs`):
//!
//! ```text
//! x₁ = x  + dropout(attention(ln_1(x)))            causal self-attention
//! y  = x₁ + dropout(mlp_proj(gelu(mlp_fc(ln_2(x₁)))))   per position, dim → hidden → dim
//! ```
//!
//! The dropout after the attention is GPT-2's `resid_dropout` (inside nanoGPT's attention
//! module); with the attention-probability dropout and the MLP's, all three use one rate.
//! Children's tensors lie back to back in the block's slice, named `ln_1/gamma`,
//! `attention/qkv/kernel`, `mlp_fc/kernel`, … so weight paths read
//! `transformer_block_2/ln_1/gamma`. Kernels start as GPT-2's: normal with std 0.02, and
//! 0.02/√(2·layers) for the two projections that feed the residual stream.

use super::composite::{add, prefixed, ranges, sized, total};
use super::dropout::Dropout;
use super::gelu::{self, GeluForm};
use super::layer_norm::LayerNorm;
use super::lent::lend;
use super::multi_head_attention::MultiHeadAttention;
use super::positionwise_dense::PositionwiseDense;
use crate::engine::bf16::ProductPath;
use crate::engine::init::derive_seed;
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec, Pass};
use crate::engine::shape::Shape;
use std::ops::Range;

/// A block's sizes and options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockConfig {
    /// Positions per example, `T`.
    pub seq_len: usize,
    /// Model width.
    pub dim: usize,
    /// Attention heads; must divide `dim`.
    pub heads: usize,
    /// MLP hidden width (GPT-2: 4 · dim).
    pub hidden: usize,
    /// Dropout rate in training, in `[0, 1)`.
    pub dropout: f32,
    /// Layer-norm epsilon (GPT-2: 1e-5).
    pub epsilon: f32,
    /// The MLP's activation.
    pub gelu: GeluForm,
    /// Blocks in the model, for the scaled initialization of the residual projections.
    pub layers: usize,
}

/// One transformer block.
pub struct TransformerBlock {
    ln_1: LayerNorm,
    attention: MultiHeadAttention,
    attn_dropout: Dropout,
    ln_2: LayerNorm,
    mlp_fc: PositionwiseDense,
    mlp_proj: PositionwiseDense,
    mlp_dropout: Dropout,
    cfg: BlockConfig,
    /// Parameter ranges in child order: ln_1, attention, ln_2, mlp_fc, mlp_proj.
    params: Vec<Range<usize>>,
    output: Shape,
    /// Kept for backward: x₁ and the MLP's pre-activation `f` (its first product plus bias).
    /// Backward recomputes ln_1(x), ln_2(x₁), gelu(f) and gelu'(f) from them (the derivative
    /// in place of `f`, which backward then needs no more): the same functions of the same
    /// values, so the same bits, for two `[rows, dim]` and three `[rows, hidden]` buffers
    /// less per block than keeping them (issue 34). Scratch (the normalized input and gelu's
    /// output in forward, three `[rows, dim]` and two `[rows, hidden]` buffers in backward) is
    /// lent by the thread's pool (`lent.rs`): blocks run one at a time.
    x1: Vec<f32>,
    f: Vec<f32>,
}

impl TransformerBlock {
    /// A block as `cfg` describes; `salt` tells its dropout masks from other layers' (the
    /// model builder gives the layer's position). `None` when a size is 0 or `heads` does not
    /// divide `dim`.
    pub fn new(cfg: BlockConfig, salt: u64) -> Option<Self> {
        let BlockConfig { seq_len: t, dim: d, heads, hidden, dropout, epsilon, layers, .. } = cfg;
        if t == 0 || hidden == 0 || layers == 0 {
            return None;
        }
        let shape = Shape(vec![t, d]);
        let std = 0.02;
        let residual = Init::Normal { std: std / (2.0 * layers as f32).sqrt() };
        let attention = MultiHeadAttention::new(t, d, heads, true)?
            .with_dropout(dropout, derive_seed(&[salt, 1]))
            .with_init(Init::Normal { std }, residual);
        let mut block = Self {
            ln_1: LayerNorm::new(shape.clone(), epsilon),
            attention,
            attn_dropout: Dropout::new(dropout, derive_seed(&[salt, 2]), shape.clone()),
            ln_2: LayerNorm::new(shape.clone(), epsilon),
            mlp_fc: PositionwiseDense::new(t, d, hidden, true).with_kernel_init(Init::Normal { std }),
            mlp_proj: PositionwiseDense::new(t, hidden, d, true).with_kernel_init(residual),
            mlp_dropout: Dropout::new(dropout, derive_seed(&[salt, 3]), shape.clone()),
            cfg,
            params: Vec::new(),
            output: shape,
            x1: Vec::new(),
            f: Vec::new(),
        };
        block.params = ranges(block.children().map(|(_, l)| total(l.params())));
        Some(block)
    }

    /// Children with tensors, with their weight-path prefixes, in slice order.
    fn children(&self) -> impl Iterator<Item = (&'static str, &dyn Layer)> {
        let children: [(&'static str, &dyn Layer); 5] = [
            ("ln_1", &self.ln_1),
            ("attention", &self.attention),
            ("ln_2", &self.ln_2),
            ("mlp_fc", &self.mlp_fc),
            ("mlp_proj", &self.mlp_proj),
        ];
        children.into_iter()
    }

    fn drops(&self, pass: Pass) -> bool {
        pass.training && self.cfg.dropout > 0.0
    }
}

impl Layer for TransformerBlock {
    fn kind(&self) -> &'static str {
        "transformer_block"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    /// The output, the attention's, and six `[T, dim]` and five `[T, hidden]` buffers: what
    /// the block kept and its scratch before it recomputed the normalized inputs and GELU in
    /// backward and borrowed its scratch from the thread's pool. It still counts them: the
    /// evaluation batch is sized from this sum (`eval_batch_size`), and counting them keeps
    /// that batch, hence what `validation_steps` covers and the golden runs' test losses, as
    /// they were.
    fn activation_len(&self) -> usize {
        let (t, d, hidden) = (self.cfg.seq_len, self.cfg.dim, self.cfg.hidden);
        t * d + self.attention.activation_len() + 6 * t * d + 5 * t * hidden
    }

    fn params(&self) -> Vec<ParamSpec> {
        prefixed(self.children(), |l| l.params())
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        // Every child is told, so no `||` that would stop at the first.
        let taken =
            [self.attention.use_products(path), self.mlp_fc.use_products(path), self.mlp_proj.use_products(path)];
        taken.contains(&true)
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let p = &self.params;
        let (d, threads) = (self.cfg.dim, pass.threads);
        let rows = n * self.cfg.seq_len;
        let (len, wide) = (rows * d, rows * self.cfg.hidden);
        let drops = self.drops(pass);
        // `h` holds ln_1(x), then ln_2(x₁); backward recomputes both.
        let (x1, mut h) = (sized(&mut self.x1, len), lend(len));
        let y = &mut y[..len];
        self.ln_1.forward(cx, &params[p[0].clone()], &mut [], &mut h);
        // Without dropout each residual is added in the pass that adds the bias before it.
        if drops {
            let mut a = lend(len);
            self.attention.forward(Forward { pass, x: &h, n }, &params[p[1].clone()], &mut [], &mut a);
            self.attn_dropout.forward(Forward { pass, x: &a, n }, &[], &mut [], x1);
            add(x1, x, rows, d, threads);
        } else {
            self.attention.forward_residual(Forward { pass, x: &h, n }, &params[p[1].clone()], x1, Some(x));
        }
        self.ln_2.forward(Forward { pass, x: x1, n }, &params[p[2].clone()], &mut [], &mut h);
        let f = sized(&mut self.f, wide);
        let bias = self.mlp_fc.product(Forward { pass, x: &h, n }, &params[p[3].clone()], f);
        drop(h);
        let mut g = lend(wide);
        gelu::forward_biased(self.cfg.gelu, f, (bias, self.cfg.hidden), rows, &mut g, threads);
        if drops {
            let mut m = lend(len);
            self.mlp_proj.forward(Forward { pass, x: &g, n }, &params[p[4].clone()], &mut [], &mut m);
            self.mlp_dropout.forward(Forward { pass, x: &m, n }, &[], &mut [], y);
            add(y, x1, rows, d, threads);
        } else {
            self.mlp_proj.forward_residual(Forward { pass, x: &g, n }, &params[p[4].clone()], y, Some(x1));
        }
    }

    /// Children ignore their forward output in backward (none needs it), so they get `&[]`.
    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        let p = &self.params;
        let (d, threads) = (self.cfg.dim, pass.threads);
        let rows = n * self.cfg.seq_len;
        let (len, wide) = (rows * d, rows * self.cfg.hidden);
        let drops = self.drops(pass);
        let dy = &dy[..len];
        let (mut s0, mut s1, mut s2) = (lend(len), lend(len), lend(len));
        let (s0, s1, s2) = (&mut s0[..], &mut s1[..], &mut s2[..]);
        let (mut w0, mut w1) = (lend(wide), lend(wide));
        let (x1, f) = (&self.x1[..len], &mut self.f[..wide]);
        // MLP branch, back to front: s0 = d m, w1 = g then d f, f = gelu'(f), w0 = d g,
        // s2 = h2 then d x₁, s1 = d h2.
        let dm: &[f32] = if drops {
            self.mlp_dropout.backward(Backward { pass, x: &[], y: &[], dy, n }, &[], &mut [], Some(s0));
            s0
        } else {
            dy
        };
        gelu::values_and_derivative(self.cfg.gelu, f, &mut w1, wide, threads);
        self.mlp_proj.backward(
            Backward { pass, x: &w1, y: &[], dy: dm, n },
            &params[p[4].clone()],
            &mut grads[p[4].clone()],
            Some(&mut w0[..]),
        );
        gelu::times(f, &w0, &mut w1, wide, threads);
        self.ln_2.recompute(Forward { pass, x: x1, n }, &params[p[2].clone()], s2);
        self.mlp_fc.backward(
            Backward { pass, x: s2, y: &[], dy: &w1, n },
            &params[p[3].clone()],
            &mut grads[p[3].clone()],
            Some(s1),
        );
        // Back to the pool for the attention's gradients.
        drop(w1);
        // s2 = ln_2's input gradient plus the residual path's dy, in one pass.
        let ln_2 = Backward { pass, x: x1, y: &[], dy: s1, n };
        self.ln_2.backward_residual(ln_2, &params[p[2].clone()], &mut grads[p[2].clone()], Some(s2), Some(dy));
        // Attention branch: s0 = d a, w0 = h1, s1 = d h1.
        let da: &[f32] = if drops {
            self.attn_dropout.backward(Backward { pass, x: &[], y: &[], dy: s2, n }, &[], &mut [], Some(s0));
            s0
        } else {
            s2
        };
        let h1 = &mut w0[..len];
        self.ln_1.recompute(Forward { pass, x, n }, &params[p[0].clone()], h1);
        self.attention.backward(
            Backward { pass, x: h1, y: &[], dy: da, n },
            &params[p[1].clone()],
            &mut grads[p[1].clone()],
            Some(s1),
        );
        // dx = ln_1's input gradient plus the residual path's d x₁, in one pass.
        let ln_1 = Backward { pass, x, y: &[], dy: s1, n };
        self.ln_1.backward_residual(ln_1, &params[p[0].clone()], &mut grads[p[0].clone()], dx, Some(s2));
    }
}

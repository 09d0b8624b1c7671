//! `multi_head_attention`: scaled dot-product self-attention over `heads` heads (Vaswani et
//! al.), optionally causal, with dropout on the attention probabilities. Input and output are
//! `[T, dim]`.
//!
//! Weights: one fused `qkv/kernel [dim, 3·dim]` (columns: the queries of every head, then the
//! keys, then the values; GPT-2's `c_attn` in Keras's `[in, out]` layout) with `qkv/bias
//! [3·dim]`, and `attention_output/kernel [dim, dim]`, `attention_output/bias [dim]` (Keras's
//! name). Fused because one `[rows, dim] × [dim, 3·dim]` product runs faster than three, and
//! backward then needs one product for the input gradient instead of three.
//!
//! Work: the projections are single `gemm`s over all positions; the per-head products run as
//! tasks over batch × heads on a fixed split across `pass.threads`, each multiplying strided
//! views of the `[T, 3·dim]` buffer (no copies), with the causal mask and softmax fused into
//! one pass over the scores. Tasks write disjoint buffers, so results are the same bits on
//! any thread count. Every buffer is kept in the layer and reused across steps.
//!
//! Dropout masks are a pure function of `(pass.seed, salt, index)`, as in `dropout.rs`:
//! backward recomputes them.

use super::dropout::masker;
use crate::engine::fastmath::{dot, exp, max, sum};
use crate::engine::kernels::{add_bias, add_rows, matmul, par_rows, partition, split_rows};
use crate::engine::layer::{Init, Layer, ParamSpec, Pass};
use crate::engine::shape::Shape;
use crate::engine::simd::vectorized;
use crate::engine::strided::{MatMut, MatRef, gemm};
use rayon::prelude::*;

/// Sizes and options the per-head kernels need.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Sequence length, model width, heads, width per head.
    t: usize,
    d: usize,
    heads: usize,
    hd: usize,
    causal: bool,
    /// Attention dropout rate and the salt telling this layer's masks from others'.
    rate: f32,
    salt: u64,
}

impl Geometry {
    /// Query, key and value of head `head` of example `b`, as `[T, hd]` strided views.
    fn qkv<'a>(&self, qkv: &'a [f32], b: usize, head: usize) -> [MatRef<'a>; 3] {
        let (t, d, hd) = (self.t, self.d, self.hd);
        let at = |part: usize| MatRef::new(&qkv[b * t * 3 * d + part * d + head * hd..], t, hd, 3 * d, 1);
        [at(0), at(1), at(2)]
    }

    /// Columns of row `i` the causal mask keeps.
    fn live(&self, i: usize) -> usize {
        if self.causal { i + 1 } else { self.t }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }
}

/// Multi-head self-attention.
pub struct MultiHeadAttention {
    geo: Geometry,
    kernel_init: Init,
    output_init: Init,
    output: Shape,
    /// Forward: projected queries, keys, values `[rows, 3·dim]`; probabilities `[n·heads, T,
    /// T]` and, with dropout, the dropped ones; per-head outputs `[n·heads, T, hd]`; merged
    /// heads `[rows, dim]`.
    qkv: Vec<f32>,
    probs: Vec<f32>,
    dropped: Vec<f32>,
    heads_out: Vec<f32>,
    merged: Vec<f32>,
    /// Backward scratch of the same shapes; `d_heads` is `[n·heads, 3, T, hd]`.
    d_merged: Vec<f32>,
    d_probs: Vec<f32>,
    d_heads: Vec<f32>,
    d_qkv: Vec<f32>,
}

/// `buf` resized to `len` values (contents are overwritten by the caller).
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

/// `len`-value chunks of `buf` for each range of tasks, or empty slices when `buf` is empty.
fn task_parts<'a>(buf: &'a mut [f32], ranges: &[std::ops::Range<usize>], len: usize) -> Vec<&'a mut [f32]> {
    if buf.is_empty() { ranges.iter().map(|_| <&mut [f32]>::default()).collect() } else { split_rows(buf, ranges, len) }
}

impl MultiHeadAttention {
    /// Attention over `seq_len × dim` inputs with `heads` heads, GPT-2's initialization (normal,
    /// std 0.02) and no dropout; `None` unless `heads` divides `dim` (and neither is 0).
    pub fn new(seq_len: usize, dim: usize, heads: usize, causal: bool) -> Option<Self> {
        if heads == 0 || dim == 0 || dim % heads != 0 {
            return None;
        }
        let geo = Geometry { t: seq_len, d: dim, heads, hd: dim / heads, causal, rate: 0.0, salt: 0 };
        let init = Init::Normal { std: 0.02 };
        Some(Self {
            geo,
            kernel_init: init,
            output_init: init,
            output: Shape(vec![seq_len, dim]),
            qkv: Vec::new(),
            probs: Vec::new(),
            dropped: Vec::new(),
            heads_out: Vec::new(),
            merged: Vec::new(),
            d_merged: Vec::new(),
            d_probs: Vec::new(),
            d_heads: Vec::new(),
            d_qkv: Vec::new(),
        })
    }

    /// The same layer with dropout of `rate` (in `[0, 1)`) on the attention probabilities in
    /// training; `salt` tells its masks from other layers' (the model builder gives one).
    pub fn with_dropout(mut self, rate: f32, salt: u64) -> Self {
        self.geo.rate = rate;
        self.geo.salt = salt;
        self
    }

    /// The same layer with other initializers for `qkv/kernel` and `attention_output/kernel`
    /// (GPT-2 scales the output projection's std by 1/√(2·layers)).
    pub fn with_init(self, kernel_init: Init, output_init: Init) -> Self {
        Self { kernel_init, output_init, ..self }
    }

    fn drops(&self, pass: Pass) -> bool {
        pass.training && self.geo.rate > 0.0
    }
}

/// Softmax of each row of the `[T, T]` scores `p` in place, zero past the causal limit.
fn softmax_rows(geo: &Geometry, p: &mut [f32]) {
    for (i, row) in p.chunks_exact_mut(geo.t).enumerate() {
        let (live, masked) = row.split_at_mut(geo.live(i));
        let top = max(live);
        live.iter_mut().for_each(|v| *v = exp(*v - top));
        let inv = 1.0 / sum(live);
        live.iter_mut().for_each(|v| *v *= inv);
        masked.fill(0.0);
    }
}

/// `ds = p ⊙ (dp − rowsum(p ⊙ dp))` in place of `dp`: softmax's backward, row by row.
fn softmax_backward_rows(geo: &Geometry, p: &[f32], dp: &mut [f32]) {
    for (i, (p, dp)) in p.chunks_exact(geo.t).zip(dp.chunks_exact_mut(geo.t)).enumerate() {
        let n = geo.live(i);
        let (live, masked) = dp.split_at_mut(n);
        let s = dot(&p[..n], live);
        live.iter_mut().zip(p).for_each(|(d, p)| *d = p * (*d - s));
        masked.fill(0.0);
    }
}

/// One head of one example: probabilities into `p` (and `dropped`), output `[T, hd]` into `o`.
fn head_forward(
    geo: &Geometry,
    qkv: &[f32],
    task: usize,
    seed: u64,
    p: &mut [f32],
    dropped: &mut [f32],
    o: &mut [f32],
) {
    let t = geo.t;
    let [q, k, v] = geo.qkv(qkv, task / geo.heads, task % geo.heads);
    gemm(MatMut::rows(p, t, t), q, k.t(), false, geo.scale(), 1);
    vectorized(|| softmax_rows(geo, p));
    let used: &[f32] = if dropped.is_empty() {
        p
    } else {
        let mask = masker(geo.rate, geo.salt, seed);
        let base = (task * t * t) as u64;
        dropped.iter_mut().zip(p.iter()).zip(base..).for_each(|((d, p), i)| *d = p * mask(i));
        dropped
    };
    gemm(MatMut::rows(o, t, geo.hd), MatRef::rows(used, t, t), v, false, 1.0, 1);
}

/// One head's backward: from `d_merged` (the gradient of the merged heads) to the gradients
/// of its query, key and value, `[3, T, hd]` into `dqkv`, with `dp` as `[T, T]` scratch.
/// `used` are the probabilities the forward pass multiplied the values by: `probs`, or the
/// dropped ones when `drop_seed` (the pass seed, given when dropout was on) is given.
#[allow(clippy::too_many_arguments)]
fn head_backward(
    geo: &Geometry,
    qkv: &[f32],
    probs: &[f32],
    used: &[f32],
    d_merged: &[f32],
    task: usize,
    drop_seed: Option<u64>,
    dp: &mut [f32],
    dqkv: &mut [f32],
) {
    let (t, d, hd) = (geo.t, geo.d, geo.hd);
    let (b, head) = (task / geo.heads, task % geo.heads);
    let [q, k, v] = geo.qkv(qkv, b, head);
    let d_out = MatRef::new(&d_merged[b * t * d + head * hd..], t, hd, d, 1);
    let (dq, rest) = dqkv.split_at_mut(t * hd);
    let (dk, dv) = rest.split_at_mut(t * hd);
    gemm(MatMut::rows(dp, t, t), d_out, v.t(), false, 1.0, 1);
    gemm(MatMut::rows(dv, t, hd), MatRef::rows(used, t, t).t(), d_out, false, 1.0, 1);
    if let Some(seed) = drop_seed {
        let mask = masker(geo.rate, geo.salt, seed);
        dp.iter_mut().zip((task * t * t) as u64..).for_each(|(g, i)| *g *= mask(i));
    }
    vectorized(|| softmax_backward_rows(geo, probs, dp));
    let ds = MatRef::rows(dp, t, t);
    gemm(MatMut::rows(dq, t, hd), ds, k, false, geo.scale(), 1);
    gemm(MatMut::rows(dk, t, hd), ds.t(), q, false, geo.scale(), 1);
}

/// Copies per-head blocks `[n·heads, parts, T, hd]` into rows `[n·T, parts·dim]` (column
/// `part·dim + head·hd + j`), one example per task.
fn merge_heads(geo: &Geometry, blocks: &[f32], parts: usize, out: &mut [f32], n: usize, threads: usize) {
    let (t, d, hd, heads) = (geo.t, geo.d, geo.hd, geo.heads);
    let width = parts * d;
    par_rows(out, n, t * width, threads, |_, r, out| {
        for (b, out) in r.zip(out.chunks_exact_mut(t * width)) {
            for head in 0..heads {
                for part in 0..parts {
                    let src = &blocks[((b * heads + head) * parts + part) * t * hd..][..t * hd];
                    for (row, src) in out.chunks_exact_mut(width).zip(src.chunks_exact(hd)) {
                        row[part * d + head * hd..][..hd].copy_from_slice(src);
                    }
                }
            }
        }
    });
}

impl Layer for MultiHeadAttention {
    fn kind(&self) -> &'static str {
        "multi_head_attention"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        let d = self.geo.d;
        vec![
            ParamSpec::new("qkv/kernel", vec![d, 3 * d], self.kernel_init),
            ParamSpec::new("qkv/bias", vec![3 * d], Init::Zeros),
            ParamSpec::new("attention_output/kernel", vec![d, d], self.output_init),
            ParamSpec::new("attention_output/bias", vec![d], Init::Zeros),
        ]
    }

    fn forward(&mut self, pass: Pass, params: &[f32], _: &mut [f32], x: &[f32], y: &mut [f32], n: usize) {
        let (geo, drops) = (self.geo, self.drops(pass));
        let (t, d, threads) = (geo.t, geo.d, pass.threads);
        let (rows, tasks) = (n * t, n * geo.heads);
        let (w_qkv, rest) = params.split_at(3 * d * d);
        let (b_qkv, rest) = rest.split_at(3 * d);
        let (w_out, b_out) = rest.split_at(d * d);
        let qkv = sized(&mut self.qkv, rows * 3 * d);
        matmul(rows, 3 * d, d, x, false, w_qkv, false, qkv, false, threads);
        par_rows(qkv, rows, 3 * d, threads, |_, _, part| add_bias(part, &b_qkv[..3 * d]));
        let qkv: &[f32] = qkv;
        let ranges = partition(tasks, threads);
        let probs = split_rows(sized(&mut self.probs, tasks * t * t), &ranges, t * t);
        let drop_len = if drops { tasks * t * t } else { 0 };
        let dropped = task_parts(sized(&mut self.dropped, drop_len), &ranges, t * t);
        let outs = split_rows(sized(&mut self.heads_out, tasks * t * geo.hd), &ranges, t * geo.hd);
        probs.into_par_iter().zip(dropped).zip(outs).zip(&ranges).for_each(|(((p, dr), o), r)| {
            for (i, task) in r.clone().enumerate() {
                let dr = if dr.is_empty() { &mut [][..] } else { &mut dr[i * t * t..(i + 1) * t * t] };
                let (p, o) = (&mut p[i * t * t..(i + 1) * t * t], &mut o[i * t * geo.hd..(i + 1) * t * geo.hd]);
                head_forward(&geo, qkv, task, pass.seed, p, dr, o);
            }
        });
        let merged = sized(&mut self.merged, rows * d);
        merge_heads(&geo, &self.heads_out, 1, merged, n, threads);
        matmul(rows, d, d, merged, false, w_out, false, y, false, threads);
        par_rows(y, rows, d, threads, |_, _, part| add_bias(part, &b_out[..d]));
    }

    fn backward(
        &mut self,
        pass: Pass,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        _: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        let (geo, drops) = (self.geo, self.drops(pass));
        let (t, d, hd, threads, acc) = (geo.t, geo.d, geo.hd, pass.threads, pass.accumulate);
        let (rows, tasks) = (n * t, n * geo.heads);
        let dy = &dy[..rows * d];
        let w_qkv = &params[..3 * d * d];
        let w_out = &params[3 * d * d + 3 * d..][..d * d];
        let (g_wqkv, rest) = grads.split_at_mut(3 * d * d);
        let (g_bqkv, rest) = rest.split_at_mut(3 * d);
        let (g_wout, g_bout) = rest.split_at_mut(d * d);
        matmul(d, d, rows, &self.merged, true, dy, false, g_wout, acc, threads);
        if !acc {
            g_bout[..d].fill(0.0);
        }
        add_rows(&mut g_bout[..d], dy);
        let d_merged = sized(&mut self.d_merged, rows * d);
        matmul(rows, d, d, dy, false, w_out, true, d_merged, false, threads);

        let ranges = partition(tasks, threads);
        let d_probs = split_rows(sized(&mut self.d_probs, tasks * t * t), &ranges, t * t);
        let d_heads = split_rows(sized(&mut self.d_heads, tasks * 3 * t * hd), &ranges, 3 * t * hd);
        let (qkv, probs, d_merged) = (&self.qkv[..], &self.probs[..], &self.d_merged[..]);
        let (used, drop_seed) = if drops { (&self.dropped[..], Some(pass.seed)) } else { (probs, None) };
        d_probs.into_par_iter().zip(d_heads).zip(&ranges).for_each(|((dp, dh), r)| {
            for (i, task) in r.clone().enumerate() {
                let (p, u) = (&probs[task * t * t..][..t * t], &used[task * t * t..][..t * t]);
                let (dp, dh) = (&mut dp[i * t * t..][..t * t], &mut dh[i * 3 * t * hd..][..3 * t * hd]);
                head_backward(&geo, qkv, p, u, d_merged, task, drop_seed, dp, dh);
            }
        });
        let d_qkv = sized(&mut self.d_qkv, rows * 3 * d);
        merge_heads(&geo, &self.d_heads, 3, d_qkv, n, threads);
        matmul(d, 3 * d, rows, x, true, d_qkv, false, g_wqkv, acc, threads);
        if !acc {
            g_bqkv.fill(0.0);
        }
        add_rows(g_bqkv, d_qkv);
        if let Some(dx) = dx {
            matmul(rows, d, 3 * d, d_qkv, false, w_qkv, true, dx, false, threads);
        }
    }
}

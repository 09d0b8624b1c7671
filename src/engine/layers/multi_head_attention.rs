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
//! Work: the projections are single `gemm`s over all positions. The per-head products run
//! as one task per example on a fixed split across `pass.threads`, heads in turn, each
//! multiplying strided views of the example's `[T, 3·dim]` projections and writing straight
//! into its head's columns of the merged output (no transposes), with the causal mask and
//! softmax fused into one pass over the scores and causal blocks of rows skipping the keys
//! they cannot see. Tasks write disjoint rows, so results are the same bits on any thread
//! count (the tasks are examples rather than example × head so that they own whole rows; a
//! batch is normally much larger than the thread count). What backward reads is kept in the
//! layer and reused across steps; scratch is lent by the thread's pool (`lent.rs`).
//!
//! Memory (the flash-attention idea, issue 34): no `[T, T]` matrix is kept from forward to
//! backward. Forward keeps, per row of each head, the softmax's maximum and the inverse of
//! its sum (what the log-sum-exp holds); backward recomputes the head's scores with the same
//! products and turns them into the same probabilities with those statistics, in a `[T, T]`
//! tile per task that the next head reuses. Kept memory is linear in `T` (projections, merged
//! heads, in bf16 where only bf16 products read them, and two floats a row per head); the tiles are `threads × 3 × T²` whatever the batch.
//! Why whole rows rather than flash attention's column tiles with a running max and sum: a
//! running rescale rounds differently from today's softmax, so float32 results would change
//! bits (the golden runs pin them), and at GPT's block sizes (T ≤ 1024) a task's `[T, T]`
//! tile stays in L2 cache; the recomputed probabilities here are the same bits as before, so
//! one path serves both precision policies. Backward recomputes one product of the four.
//!
//! Dropout masks are a pure function of `(pass.seed, salt, index)`, as in `dropout.rs`:
//! backward recomputes them.

use super::composite::{add_bias_residual, both, sized};
use super::dropout::masker;
use super::kept::Kept;
use super::lent::lend;
use crate::engine::bf16::{self, ProductPath};
use crate::engine::fastmath::{dot, exp, max, sum};
use crate::engine::kernels::{add_bias, add_rows, par_rows, partition, split_rows};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec, Pass};
use crate::engine::shape::Shape;
use crate::engine::simd::vectorized;
use crate::engine::strided::{MatMut, MatRef};
use rayon::prelude::*;
use std::ops::Range;

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
    /// How the projections (`dim` wide) and the per-head products (`T × hd`) run: the
    /// precision policy for their sizes.
    projections: ProductPath,
    heads_path: ProductPath,
}

impl Geometry {
    /// Query, key and value of head `head`, as `[T, hd]` strided views of one example's
    /// `[T, 3·dim]` projections.
    fn qkv<'a>(&self, qkv: &'a [f32], head: usize) -> [MatRef<'a>; 3] {
        let [q, k, v] = [0, 1, 2].map(|part| part * self.d + head * self.hd);
        let at = |start: usize| MatRef::new(&qkv[start..], self.t, self.hd, 3 * self.d, 1);
        [at(q), at(k), at(v)]
    }

    /// Head `head`'s `[T, hd]` columns of `rows` (one example's rows of `width` values, the
    /// head's block starting at column `offset`).
    fn head_cols<'a>(&self, rows: &'a mut [f32], width: usize, offset: usize) -> MatMut<'a> {
        MatMut::new(&mut rows[offset..], self.t, self.hd, width, 1)
    }

    /// Columns of row `i` the causal mask keeps.
    fn live(&self, i: usize) -> usize {
        if self.causal { i + 1 } else { self.t }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }

    /// `c = scale · a · b` for one head, on the caller's thread (a task of the per-example split).
    fn head_product(&self, c: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32) {
        bf16::gemm(self.heads_path, c, a, b, false, scale, 1);
    }
}

/// Multi-head self-attention.
pub struct MultiHeadAttention {
    geo: Geometry,
    kernel_init: Init,
    output_init: Init,
    output: Shape,
    /// Forward: projected queries, keys, values `[rows, 3·dim]`; each head's softmax
    /// statistics `[n, heads, T, 2]` (see [`softmax_rows`]); the heads' outputs side by side
    /// `[rows, dim]`. The projections are read only by the per-head products and the merged
    /// heads only by the output projection's, so each is kept in bf16 where those run in
    /// bf16 (`kept.rs`).
    qkv: Kept,
    stats: Vec<f32>,
    merged: Kept,
}

/// One task's `[T, T]` buffers for the head it is working on: probabilities, their gradient,
/// and the dropped probabilities (empty without dropout).
struct HeadTile<'a> {
    p: &'a mut [f32],
    dp: &'a mut [f32],
    dropped: &'a mut [f32],
}

impl<'a> HeadTile<'a> {
    /// Values a task's tile takes: two or, with dropout, three `[T, T]` buffers.
    fn len(t: usize, drops: bool) -> usize {
        t * t * if drops { 3 } else { 2 }
    }

    /// A task's tiles out of its `len(t, drops)` values.
    fn new(buf: &'a mut [f32], t: usize) -> Self {
        let (p, rest) = buf.split_at_mut(t * t);
        let (dp, dropped) = rest.split_at_mut(t * t);
        Self { p, dp, dropped }
    }
}

impl MultiHeadAttention {
    /// Attention over `seq_len × dim` inputs with `heads` heads, GPT-2's initialization (normal,
    /// std 0.02) and no dropout; `None` unless `heads` divides `dim` (and neither is 0).
    pub fn new(seq_len: usize, dim: usize, heads: usize, causal: bool) -> Option<Self> {
        if heads == 0 || dim == 0 || !dim.is_multiple_of(heads) {
            return None;
        }
        let geo = Geometry {
            t: seq_len,
            d: dim,
            heads,
            hd: dim / heads,
            causal,
            rate: 0.0,
            salt: 0,
            projections: ProductPath::Float32,
            heads_path: ProductPath::Float32,
        };
        let init = Init::Normal { std: 0.02 };
        Some(Self {
            geo,
            kernel_init: init,
            output_init: init,
            output: Shape(vec![seq_len, dim]),
            qkv: Kept::Float32(Vec::new()),
            stats: Vec::new(),
            merged: Kept::Float32(Vec::new()),
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

    /// The forward pass plus `residual` (shaped like `y`), added in the output bias's pass:
    /// the transformer block's residual connection without a pass (and a wait for both
    /// threads) of its own. The same bits as adding it after [`Layer::forward`].
    pub fn forward_residual(&mut self, cx: Forward<'_>, params: &[f32], y: &mut [f32], residual: Option<&[f32]>) {
        let Forward { pass, x, n } = cx;
        let (geo, drops) = (self.geo, self.drops(pass));
        let (t, d, threads) = (geo.t, geo.d, pass.threads);
        let rows = n * t;
        let (w_qkv, rest) = params.split_at(3 * d * d);
        let (b_qkv, rest) = rest.split_at(3 * d);
        let (w_out, b_out) = rest.split_at(d * d);
        let mut qkv = self.qkv.staging(rows * 3 * d);
        let (x, w_qkv) = (MatRef::rows(x, rows, d), MatRef::rows(w_qkv, d, 3 * d));
        bf16::gemm(geo.projections, MatMut::rows(&mut qkv, rows, 3 * d), x, w_qkv, false, 1.0, threads);
        // One task per example, its heads in turn: each adds the bias to its own rows of the
        // projections (in the same task, so no pass of its own) and writes its own rows.
        let (ranges, per, stat) = (partition(n, threads), geo.heads * t * t, geo.heads * t * 2);
        let qkvs = split_rows(&mut qkv, &ranges, t * 3 * d);
        let stats = split_rows(sized(&mut self.stats, n * stat), &ranges, stat);
        let mut tiles = lend(ranges.len() * HeadTile::len(t, drops));
        let tiles = tiles.chunks_exact_mut(HeadTile::len(t, drops));
        let mut merged = self.merged.staging(rows * d);
        let merged_rows = split_rows(&mut merged, &ranges, t * d);
        let drop_seed = drops.then_some(pass.seed);
        let tasks = qkvs.into_par_iter().zip(stats).zip(tiles.collect::<Vec<_>>()).zip(merged_rows).zip(&ranges);
        tasks.for_each(|((((qkv, stats), tile), out), r)| {
            add_bias(qkv, &b_qkv[..3 * d]);
            let mut tile = HeadTile::new(tile, t);
            for (i, b) in r.clone().enumerate() {
                for head in 0..geo.heads {
                    let first = (b * per + head * t * t) as u64;
                    let stats = &mut stats[(i * geo.heads + head) * t * 2..][..t * 2];
                    let (qkv, out) = (&qkv[i * t * 3 * d..][..t * 3 * d], &mut out[i * t * d..][..t * d]);
                    Head { geo: &geo, qkv, head, first, drop_seed }.forward(&mut tile, stats, out);
                }
            }
        });
        qkv.keep(threads);
        bf16::gemm(
            geo.projections,
            MatMut::rows(y, rows, d),
            MatRef::rows(&merged, rows, d),
            MatRef::rows(w_out, d, d),
            false,
            1.0,
            threads,
        );
        merged.keep(threads);
        match residual {
            Some(r) => add_bias_residual(y, &b_out[..d], r, rows, d, threads),
            None => par_rows(y, rows, d, threads, |_, _, part| add_bias(part, &b_out[..d])),
        }
    }
}

/// Softmax of each row of the `[T, T]` scores `p` in place, zero past the causal limit;
/// each row's maximum and inverse sum go into `stats` (`[T, 2]`) for [`probabilities_rows`].
#[inline(always)]
fn softmax_rows(geo: &Geometry, p: &mut [f32], stats: &mut [f32]) {
    for ((i, row), stat) in p.chunks_exact_mut(geo.t).enumerate().zip(stats.chunks_exact_mut(2)) {
        let (live, masked) = row.split_at_mut(geo.live(i));
        let top = max(live);
        for v in live.iter_mut() {
            *v = exp(*v - top);
        }
        let inv = 1.0 / sum(live);
        for v in live.iter_mut() {
            *v *= inv;
        }
        masked.fill(0.0);
        stat.copy_from_slice(&[top, inv]);
    }
}

/// [`softmax_rows`] again from the same scores and its `stats`, without the maximum and the
/// sum: each probability is rounded by the same two operations, so these are the same bits.
#[inline(always)]
fn probabilities_rows(geo: &Geometry, p: &mut [f32], stats: &[f32]) {
    for ((i, row), stat) in p.chunks_exact_mut(geo.t).enumerate().zip(stats.chunks_exact(2)) {
        let (live, masked) = row.split_at_mut(geo.live(i));
        let (top, inv) = (stat[0], stat[1]);
        for v in live.iter_mut() {
            *v = exp(*v - top) * inv;
        }
        masked.fill(0.0);
    }
}

/// `ds = p ⊙ (dp − rowsum(p ⊙ dp))` in place of `dp`: softmax's backward, row by row.
#[inline(always)]
fn softmax_backward_rows(geo: &Geometry, p: &[f32], dp: &mut [f32]) {
    for (i, (p, dp)) in p.chunks_exact(geo.t).zip(dp.chunks_exact_mut(geo.t)).enumerate() {
        let n = geo.live(i);
        let (live, masked) = dp.split_at_mut(n);
        let s = dot(&p[..n], live);
        for (d, p) in live.iter_mut().zip(p) {
            *d = p * (*d - s);
        }
        masked.fill(0.0);
    }
}

/// Rows per block of the per-head products: with a causal mask, a block of rows needs only
/// the keys up to its last row. At T = 64 that skips a quarter of the multiply-adds, which
/// measured within noise of no blocking (the products are a small part of the step there);
/// the saving approaches half as T grows.
const BLOCK: usize = 32;

/// `(rows, columns they attend to)` for each block of rows.
fn row_blocks(geo: &Geometry) -> impl Iterator<Item = (Range<usize>, usize)> + '_ {
    (0..geo.t).step_by(BLOCK).map(|r0| {
        let r1 = (r0 + BLOCK).min(geo.t);
        (r0..r1, if geo.causal { r1 } else { geo.t })
    })
}

/// `(columns, first row attending to them)` for each block of columns.
fn col_blocks(geo: &Geometry) -> impl Iterator<Item = (Range<usize>, usize)> + '_ {
    (0..geo.t).step_by(BLOCK).map(|c0| (c0..(c0 + BLOCK).min(geo.t), if geo.causal { c0 } else { 0 }))
}

/// One head of one example, as the per-head products read it.
#[derive(Debug, Clone, Copy)]
struct Head<'a> {
    geo: &'a Geometry,
    /// The example's `[T, 3·dim]` projections.
    qkv: &'a [f32],
    /// Which head.
    head: usize,
    /// The index of the head's first probability among the pass's, which numbers the dropout
    /// mask.
    first: u64,
    /// The pass seed, given when dropout is on.
    drop_seed: Option<u64>,
}

impl Head<'_> {
    /// The scaled scores `q·kᵀ/√hd` into `p` (`[T, T]`), by blocks of rows; entries past a
    /// causal block's last row are left as they were (the softmax zeroes them).
    fn scores(self, p: &mut [f32]) {
        let (geo, hd) = (self.geo, self.geo.hd);
        let [q, k, _] = geo.qkv(self.qkv, self.head);
        let mut scores = MatMut::rows(p, geo.t, geo.t);
        for (rows, cols) in row_blocks(geo) {
            let (q, k) = (q.block(rows.clone(), 0..hd), k.block(0..cols, 0..hd));
            geo.head_product(scores.block(rows, 0..cols), q, k.t(), geo.scale());
        }
    }

    /// What the values are multiplied by: `p`, or with dropout the dropped probabilities,
    /// written into `dropped`.
    fn used<'b>(self, p: &'b [f32], dropped: &'b mut [f32]) -> &'b [f32] {
        match self.drop_seed {
            None => p,
            Some(seed) => {
                let mask = masker(self.geo.rate, self.geo.salt, seed);
                for ((d, p), i) in dropped.iter_mut().zip(p).zip(self.first..) {
                    *d = p * mask(i);
                }
                dropped
            }
        }
    }

    /// Probabilities in `tile` (their statistics into `stats`, `[T, 2]`), output into the
    /// head's columns of `out`, the example's `[T, dim]` merged heads.
    fn forward(self, tile: &mut HeadTile<'_>, stats: &mut [f32], out: &mut [f32]) {
        let Head { geo, qkv, head, .. } = self;
        let (t, hd) = (geo.t, geo.hd);
        let [_, _, v] = geo.qkv(qkv, head);
        self.scores(tile.p);
        vectorized(
            #[inline(always)]
            || softmax_rows(geo, tile.p, stats),
        );
        let used = MatRef::rows(self.used(tile.p, tile.dropped), t, t);
        let mut out = geo.head_cols(out, geo.d, head * hd);
        for (rows, cols) in row_blocks(geo) {
            geo.head_product(out.block(rows.clone(), 0..hd), used.block(rows, 0..cols), v.block(0..cols, 0..hd), 1.0);
        }
    }

    /// The backward from `d_out` (the example's `[T, dim]` gradient of the merged heads) to
    /// the gradients of the head's query, key and value, written into its columns of `dqkv`
    /// (`[T, 3·dim]`). The probabilities are recomputed into `tile` from the projections and
    /// the forward pass's `stats`.
    fn backward(self, tile: &mut HeadTile<'_>, stats: &[f32], d_out: &[f32], dqkv: &mut [f32]) {
        let Head { geo, qkv, head, first, drop_seed } = self;
        let (t, d, hd) = (geo.t, geo.d, geo.hd);
        let [q, k, v] = geo.qkv(qkv, head);
        self.scores(tile.p);
        vectorized(
            #[inline(always)]
            || probabilities_rows(geo, tile.p, stats),
        );
        let (probs, dp) = (&*tile.p, &mut *tile.dp);
        let used = MatRef::rows(self.used(probs, tile.dropped), t, t);
        let d_out = MatRef::new(&d_out[head * hd..], t, hd, d, 1);
        {
            let mut g = MatMut::rows(dp, t, t);
            for (rows, cols) in row_blocks(geo) {
                let (d_out, v) = (d_out.block(rows.clone(), 0..hd), v.block(0..cols, 0..hd));
                geo.head_product(g.block(rows, 0..cols), d_out, v.t(), 1.0);
            }
        }
        let mut dv = geo.head_cols(dqkv, 3 * d, 2 * d + head * hd);
        for (cols, from) in col_blocks(geo) {
            let (p, g) = (used.block(from..t, cols.clone()).t(), d_out.block(from..t, 0..hd));
            geo.head_product(dv.block(cols, 0..hd), p, g, 1.0);
        }
        if let Some(seed) = drop_seed {
            let mask = masker(geo.rate, geo.salt, seed);
            for (g, i) in dp.iter_mut().zip(first..) {
                *g *= mask(i);
            }
        }
        vectorized(
            #[inline(always)]
            || softmax_backward_rows(geo, probs, dp),
        );
        let ds = MatRef::rows(dp, t, t);
        let mut dq = geo.head_cols(dqkv, 3 * d, head * hd);
        for (rows, cols) in row_blocks(geo) {
            geo.head_product(
                dq.block(rows.clone(), 0..hd),
                ds.block(rows, 0..cols),
                k.block(0..cols, 0..hd),
                geo.scale(),
            );
        }
        let mut dk = geo.head_cols(dqkv, 3 * d, d + head * hd);
        for (cols, from) in col_blocks(geo) {
            let (s, x) = (ds.block(from..t, cols.clone()).t(), q.block(from..t, 0..hd));
            geo.head_product(dk.block(cols, 0..hd), s, x, geo.scale());
        }
    }
}

impl Layer for MultiHeadAttention {
    fn kind(&self) -> &'static str {
        "multi_head_attention"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    /// The output, the projections `[T, 3·dim]`, the softmax statistics `[heads, T, 2]` and
    /// the merged heads `[T, dim]`: linear in `T` (the per-task tiles do not grow with the batch).
    fn activation_len(&self) -> usize {
        let Geometry { t, d, heads, .. } = self.geo;
        t * d + t * 3 * d + heads * t * 2 + t * d
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

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], _: &mut [f32], y: &mut [f32]) {
        self.forward_residual(cx, params, y, None);
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        self.geo.projections = path.for_dims(self.geo.d, self.geo.d);
        self.geo.heads_path = path.for_dims(self.geo.hd, self.geo.t);
        self.qkv = Kept::for_products(self.geo.heads_path);
        self.merged = Kept::for_products(self.geo.projections);
        !(self.geo.projections.is_float32() && self.geo.heads_path.is_float32())
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, dy, n, .. } = cx;
        let (geo, drops) = (self.geo, self.drops(pass));
        let (t, d, threads, acc) = (geo.t, geo.d, pass.threads, pass.accumulate);
        let rows = n * t;
        let dy = &dy[..rows * d];
        let w_qkv = &params[..3 * d * d];
        let w_out = &params[3 * d * d + 3 * d..][..d * d];
        let (g_wqkv, rest) = grads.split_at_mut(3 * d * d);
        let (g_bqkv, rest) = rest.split_at_mut(3 * d);
        let (g_wout, g_bout) = rest.split_at_mut(d * d);
        // The larger first: it takes the free buffer the block's MLP gave back (`lent.rs`).
        let (mut d_qkv, mut d_merged) = (lend(rows * 3 * d), lend(rows * d));
        // Kept bf16 values widen into scratch: the merged heads into `d_qkv`, not yet written.
        let merged = MatRef::rows(self.merged.read(rows * d, &mut d_qkv, threads), rows, d);
        let (dy_m, w_out) = (MatRef::rows(dy, rows, d), MatRef::rows(w_out, d, d));
        let output_weights = |threads| {
            bf16::gemm(geo.projections, MatMut::rows(g_wout, d, d), merged.t(), dy_m, acc, 1.0, threads);
            if !acc {
                g_bout[..d].fill(0.0);
            }
            add_rows(&mut g_bout[..d], dy);
        };
        both(threads, output_weights, |threads| {
            bf16::gemm(geo.projections, MatMut::rows(&mut d_merged, rows, d), dy_m, w_out.t(), false, 1.0, threads)
        });

        let (ranges, per) = (partition(n, threads), geo.heads * t * t);
        let mut tiles = lend(ranges.len() * HeadTile::len(t, drops));
        let tiles = tiles.chunks_exact_mut(HeadTile::len(t, drops));
        let d_qkvs = split_rows(&mut d_qkv, &ranges, t * 3 * d);
        let mut widened = (self.qkv.scratch_len(1) > 0).then(|| lend(rows * 3 * d));
        let qkv = self.qkv.read(rows * 3 * d, widened.as_deref_mut().unwrap_or_default(), threads);
        let (stats, d_merged) = (&self.stats[..], &d_merged[..]);
        let drop_seed = drops.then_some(pass.seed);
        tiles.collect::<Vec<_>>().into_par_iter().zip(d_qkvs).zip(&ranges).for_each(|((tile, dqkv), r)| {
            let mut tile = HeadTile::new(tile, t);
            for (i, b) in r.clone().enumerate() {
                let dqkv = &mut dqkv[i * t * 3 * d..][..t * 3 * d];
                for head in 0..geo.heads {
                    let first = (b * per + head * t * t) as u64;
                    let stats = &stats[(b * geo.heads + head) * t * 2..][..t * 2];
                    let (qkv, d_out) = (&qkv[b * t * 3 * d..][..t * 3 * d], &d_merged[b * t * d..][..t * d]);
                    Head { geo: &geo, qkv, head, first, drop_seed }.backward(&mut tile, stats, d_out, dqkv);
                }
            }
        });
        let d_qkv = &d_qkv[..];
        let (x, d_qkv_m, w_qkv) =
            (MatRef::rows(x, rows, d), MatRef::rows(d_qkv, rows, 3 * d), MatRef::rows(w_qkv, d, 3 * d));
        let mut qkv_weights = |threads| {
            bf16::gemm(geo.projections, MatMut::rows(g_wqkv, d, 3 * d), x.t(), d_qkv_m, acc, 1.0, threads);
            if !acc {
                g_bqkv.fill(0.0);
            }
            add_rows(g_bqkv, d_qkv);
        };
        match dx {
            Some(dx) => both(threads, qkv_weights, |threads| {
                bf16::gemm(geo.projections, MatMut::rows(dx, rows, d), d_qkv_m, w_qkv.t(), false, 1.0, threads)
            }),
            None => qkv_weights(threads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward then backward on `x` (`n` examples) with `params` and the output gradient `dy`:
    /// the output, the parameter gradients and the input gradient.
    fn step(attn: &mut MultiHeadAttention, params: &[f32], x: &[f32], dy: &[f32], n: usize) -> [Vec<f32>; 3] {
        let pass = Pass { training: true, seed: 9, accumulate: false, threads: 2 };
        let mut y = vec![0.0; x.len()];
        attn.forward(Forward { pass, x, n }, params, &mut [], &mut y);
        let (mut grads, mut dx) = (vec![0.0; params.len()], vec![0.0; x.len()]);
        attn.backward(Backward { pass, x, y: &[], dy, n }, params, &mut grads, Some(&mut dx));
        [y, grads, dx]
    }

    /// Under `mixed_bfloat16` the projections and the merged heads are kept in bf16 because
    /// only bf16 products read them: the same bits as keeping them in fp32.
    #[test]
    fn keeping_bf16_for_bf16_products_gives_the_bits_of_keeping_fp32() {
        let (t, d, n) = (21, 8, 3);
        for rate in [0.0, 0.2] {
            let build = || {
                let mut attn = MultiHeadAttention::new(t, d, 2, true).unwrap().with_dropout(rate, 5);
                attn.use_products(ProductPath::EmulatedBfloat16);
                attn
            };
            let (mut kept_bf16, mut kept_fp32) = (build(), build());
            assert!(matches!((&kept_bf16.qkv, &kept_bf16.merged), (Kept::Bfloat16(_), Kept::Bfloat16(_))));
            (kept_fp32.qkv, kept_fp32.merged) = (Kept::Float32(Vec::new()), Kept::Float32(Vec::new()));
            let len: usize = kept_bf16.params().iter().map(|p| p.len()).sum();
            let params: Vec<f32> = (0..len).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
            let x: Vec<f32> = (0..n * t * d).map(|i| ((i * 7) % 23) as f32 / 11.0 - 1.0).collect();
            let dy: Vec<f32> = (0..n * t * d).map(|i| ((i * 5) % 13) as f32 / 13.0 - 0.5).collect();
            let want = step(&mut kept_fp32, &params, &x, &dy, n);
            let got = step(&mut kept_bf16, &params, &x, &dy, n);
            for (what, (got, want)) in
                ["output", "parameter gradients", "input gradient"].iter().zip(got.iter().zip(&want))
            {
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(want), "{what}, dropout {rate}");
            }
        }
    }
}

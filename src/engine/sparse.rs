//! Products with a ReLU's output that skip its zeros.
//!
//! Most of what a ReLU puts out is zero: in the tutorial model at the peers' settings (SGD
//! 0.05, momentum 0.9) 88–92 % of the convolution's output (26 × 26 × 32 per image) is zero from
//! the first hundred steps on, and 37–40 % of its columns are zero across a whole batch of 64
//! (measured with TensorFlow's own model on MNIST). A dense layer on top multiplies by those zeros three times a step: forward
//! (`x · kernel`), for the kernel's gradient (`xᵀ · dz`) and for `dx = dz · kernelᵀ`, which the
//! ReLU's derivative then zeroes again wherever `x` is zero. gemm cannot know that, so it does
//! up to ten times the work; here each product walks only the nonzeros. Hand-written because
//! the gemm crate (and XLA's fusion, which JAX's peer step gets) multiplies dense operands only.
//!
//! Each sum keeps one fixed order, whatever the thread count: a row of `x · kernel` sums its
//! nonzeros in column order, a kernel row's gradient sums the examples in batch order, and a
//! `dx` element is one dot product with fixed lanes. Skipping a zero adds nothing a dense sum
//! would not (`0 · w` is `0` for every finite `w`), so the results are gemm's up to rounding
//! order. A `0 · inf` that gemm would turn into NaN is skipped, but a weight that is not finite
//! reaches the loss through the examples that use it, and the step loop stops there. Whether a
//! product goes sparse depends only on the data and on the CPU family's thresholds
//! ([`forward_pays`], [`backward_pays`], [`super::tuning`]), so runs stay reproducible on a
//! CPU of one family.

use super::tuning::Tuning;
use std::ops::Range;

/// Compiles `fn name(args) body` three times, for AVX-512, for AVX2 with FMA, and plain, and
/// runs the widest this CPU has. `f32::mul_add` is one instruction only where the compiler may
/// assume FMA; elsewhere it is a library call that costs ten times more. Every version rounds
/// the same (lanes are independent, and `mul_add` rounds once everywhere), so the bits do not
/// depend on the CPU.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) {
            #[inline(always)]
            fn imp($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn v4($($a: $t),*) {
                    imp($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn v3($($a: $t),*) {
                    imp($($a),*)
                }
                if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: this CPU has every feature `v4` was compiled for.
                    return unsafe { v4($($a),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: as above, for `v3`.
                    return unsafe { v3($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}

/// Whether forward's `x · kernel` should walk `x`'s nonzeros (`nonzeros` of `total` values)
/// rather than call gemm: at or below the density this CPU family's row gives
/// ([`Tuning::sparse_forward`]; 1/5 on a Zen 4, where the walk took 0.93× gemm's time at 20 %,
/// and 1/6 on an AMX Xeon, where it took 1.00× there).
pub fn forward_pays(nonzeros: usize, total: usize) -> bool {
    Tuning::here().sparse_forward.admits(nonzeros, total)
}

/// Whether backward's products for a block of kernel rows should walk the nonzeros of the
/// block's columns of `x`: at or below the density of this CPU family's row
/// ([`Tuning::sparse_backward`]).
pub fn backward_pays(nonzeros: usize, total: usize) -> bool {
    Tuning::here().sparse_backward.admits(nonzeros, total)
}

/// Values counted between checks in [`pays_for`]: 256 KiB, small against the tutorial's
/// 5.5 MB dense input at batch 64, large against the cost of a check.
const CHECK_EVERY: usize = 1 << 16;

/// Whether `pays(nonzeros, x.len())` holds for `x`'s nonzeros, as with [`count_nonzeros`], but
/// counting stops as soon as the nonzeros so far already fail it: `pays` ([`forward_pays`],
/// [`backward_pays`]) must allow fewer nonzeros only, never more, so more cannot make it hold
/// again. A dense input answers after a fraction of it: at the tutorial's 72 % nonzero, a
/// fifth of a batch 64's 1.4 million values instead of all of them, which took 0.21 ms of a
/// 2.2 ms forward pass on 2 threads (measured on the tutorial model, AVX-512). The answer is
/// the whole count's, so which product runs, and so the bits, do not change.
pub fn pays_for(x: &[f32], pays: fn(usize, usize) -> bool) -> bool {
    let mut nonzeros = 0;
    for part in x.chunks(CHECK_EVERY) {
        nonzeros += count_nonzeros(part);
        if !pays(nonzeros, x.len()) {
            return false;
        }
    }
    pays(nonzeros, x.len())
}

/// How many of `x`'s values are not zero (a NaN counts as not zero).
pub fn count_nonzeros(x: &[f32]) -> usize {
    super::simd::vectorized(|| x.chunks(4096).map(|c| c.iter().filter(|v| **v != 0.0).count()).sum())
}

/// Lanes of the accumulators: one AVX-512 register, or two AVX2 ones; only the instruction
/// width changes, not the order of any sum.
const LANES: usize = 16;

/// [`forward_rows_in`] in blocks of this CPU family's [`Tuning::forward_block`] rows.
pub fn forward_rows(x: &[f32], inputs: usize, w: &[f32], units: usize, y: &mut [f32], list: &mut Nonzeros) {
    forward_rows_in(x, inputs, w, units, y, list, Tuning::here().forward_block);
}

multiversion! {
    /// `y = x · w` for the rows of `x` (`rows × inputs`, row-major) into `y` (`rows × units`),
    /// over `x`'s nonzeros, each row's sum in column order; `list` is scratch. The kernel is
    /// taken `block` rows at a time (in L2 while every row of `x` takes its nonzeros in the
    /// block: walking a whole row of `x` at a time read the kernel rows it needs from all over
    /// the 11 MB kernel, once per example); the block does not change any sum's order.
    pub fn forward_rows_in(x: &[f32], inputs: usize, w: &[f32], units: usize, y: &mut [f32], list: &mut Nonzeros, block: usize) {
        y.fill(0.0);
        for start in (0..inputs).step_by(block.max(1)) {
            let end = (start + block.max(1)).min(inputs);
            let w = &w[start * units..end * units];
            for (x, y) in x.chunks_exact(inputs).zip(y.chunks_exact_mut(units)) {
                let (idx, val) = list.of(&x[start..end]);
                for (j, y) in y.chunks_mut(8 * LANES).enumerate() {
                    sum_rows(y, idx, val, w, units, j * 8 * LANES);
                }
            }
        }
    }
}

/// `out += Σ v · w[k, at..at + out.len()]` over `(k, v)` in `(idx, val)`, in list order.
#[inline(always)]
fn sum_rows(out: &mut [f32], idx: &[u32], val: &[f32], w: &[f32], units: usize, at: usize) {
    match out.len() {
        128 => sum_rows_fixed::<128>(out, idx, val, w, units, at),
        64 => sum_rows_fixed::<64>(out, idx, val, w, units, at),
        _ => {
            for (&k, &v) in idx.iter().zip(val) {
                let row = &w[k as usize * units + at..][..out.len()];
                for (a, r) in out.iter_mut().zip(row) {
                    *a = v.mul_add(*r, *a);
                }
            }
        }
    }
}

/// [`sum_rows`] over `N` values, which the compiler keeps in registers (at 128, eight
/// independent multiply-add chains, enough to hide their latency).
#[inline(always)]
fn sum_rows_fixed<const N: usize>(out: &mut [f32], idx: &[u32], val: &[f32], w: &[f32], units: usize, at: usize) {
    let mut acc = [0.0f32; N];
    acc.copy_from_slice(&out[..N]);
    for (&k, &v) in idx.iter().zip(val) {
        let row = &w[k as usize * units + at..][..N];
        for (a, r) in acc.iter_mut().zip(row) {
            *a = v.mul_add(*r, *a);
        }
    }
    out[..N].copy_from_slice(&acc);
}

/// Scratch for the nonzeros of one stretch of a row: their indices and values, in order.
#[derive(Debug, Default)]
pub struct Nonzeros {
    idx: Vec<u32>,
    val: Vec<f32>,
}

impl Nonzeros {
    /// The nonzeros of `x` (a NaN counts as one), as indices into `x` and values.
    #[inline(always)]
    fn of(&mut self, x: &[f32]) -> (&[u32], &[f32]) {
        // Room for a whole vector written past the last nonzero.
        if self.idx.len() < x.len() + 16 {
            self.idx.resize(x.len() + 16, 0);
            self.val.resize(x.len() + 16, 0.0);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, and both buffers hold `x.len() + 16` values.
            let len = unsafe { compress_avx512(x, &mut self.idx, &mut self.val) };
            return (&self.idx[..len], &self.val[..len]);
        }
        // Without a branch per value: a ReLU's zeros fall too irregularly to predict.
        let mut len = 0;
        for (k, &v) in x.iter().enumerate() {
            self.idx[len] = k as u32;
            self.val[len] = v;
            len += usize::from(v != 0.0);
        }
        (&self.idx[..len], &self.val[..len])
    }
}

/// [`Nonzeros::of`] sixteen values at a time: a compare gives the mask of nonzeros, and two
/// compresses pack their values and indices (into registers, then stored: a compress straight
/// to memory is microcoded and slow on AMD's Zen 4).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn compress_avx512(x: &[f32], idx: &mut [u32], val: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    assert!(idx.len() >= x.len() + 16 && val.len() >= x.len() + 16, "compress buffers too small");
    let mut len = 0;
    let mut index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let (sixteen, zero) = (_mm512_set1_epi32(16), _mm512_setzero_ps());
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        // SAFETY: `chunk` holds 16 values, and both stores start at `len`, at most the values
        // seen so far, with 16 more slots behind it (asserted above).
        unsafe {
            let v = _mm512_loadu_ps(chunk.as_ptr());
            // Stored whether or not any is nonzero: a branch on it mispredicts.
            let m = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, zero);
            _mm512_storeu_ps(val.as_mut_ptr().add(len), _mm512_maskz_compress_ps(m, v));
            _mm512_storeu_si512(idx.as_mut_ptr().add(len).cast(), _mm512_maskz_compress_epi32(m, index));
            len += m.count_ones() as usize;
        }
        index = _mm512_add_epi32(index, sixteen);
    }
    let at = x.len() - chunks.remainder().len();
    for (k, &v) in chunks.remainder().iter().enumerate() {
        idx[len] = (at + k) as u32;
        val[len] = v;
        len += usize::from(v != 0.0);
    }
    len
}

/// The nonzeros of a block of `x`'s columns, column by column (each column's in row order):
/// the kernel rows of the block and the examples that touch them.
#[derive(Debug, Default)]
pub struct Columns {
    /// Column `c`'s entries are at `start[c]..start[c] + len[c]` of `rows` and `vals`.
    start: Vec<usize>,
    len: Vec<u32>,
    rows: Vec<u32>,
    vals: Vec<f32>,
    /// One row's nonzeros in the block.
    row: Nonzeros,
    /// The number of nonzeros [`Columns::count`] counted.
    nonzeros: usize,
}

impl Columns {
    /// Counts the nonzeros of columns `cols` of the `n × inputs` row-major `x`, column by
    /// column; [`Columns::fill`] then gathers them.
    pub fn count(&mut self, x: &[f32], n: usize, inputs: usize, cols: Range<usize>) -> usize {
        self.len.clear();
        self.len.resize(cols.len(), 0);
        super::simd::vectorized(|| {
            for row in x.chunks_exact(inputs).take(n) {
                for (l, v) in self.len.iter_mut().zip(&row[cols.clone()]) {
                    *l += u32::from(*v != 0.0);
                }
            }
        });
        self.start.clear();
        let mut at = 0;
        for l in &self.len {
            self.start.push(at);
            at += *l as usize;
        }
        self.nonzeros = at;
        at
    }

    /// Gathers the columns [`Columns::count`] counted, handing each row's nonzeros (indices
    /// within the columns, and values) to `each_row` on the way.
    pub fn fill(
        &mut self,
        x: &[f32],
        n: usize,
        inputs: usize,
        cols: Range<usize>,
        mut each_row: impl FnMut(usize, &[u32], &[f32]),
    ) {
        self.rows.resize(self.nonzeros, 0);
        self.vals.resize(self.nonzeros, 0.0);
        self.len.fill(0);
        for (b, row) in x.chunks_exact(inputs).take(n).enumerate() {
            let (idx, val) = self.row.of(&row[cols.clone()]);
            each_row(b, idx, val);
            for (&c, &v) in idx.iter().zip(val) {
                let (c, slot) = (c as usize, self.start[c as usize] + self.len[c as usize] as usize);
                (self.rows[slot], self.vals[slot]) = (b as u32, v);
                self.len[c] += 1;
            }
        }
    }

    /// Column `c`'s rows and values.
    fn column(&self, c: usize) -> (&[u32], &[f32]) {
        let at = self.start[c]..self.start[c] + self.len[c] as usize;
        (&self.rows[at.clone()], &self.vals[at])
    }

    /// The block's kernel rows (`width × units`) take `target = keep·target + scale·g` with
    /// `g[c] = Σ_b x[b, c] · dz[b]`, summed in row order.
    pub fn product(&self, target: &mut [f32], dz: &[f32], units: usize, keep: Option<f32>, scale: f32) {
        product(self, target, dz, units, keep, scale);
    }
}

multiversion! {
    /// [`Columns::product`].
    fn product(columns: &Columns, target: &mut [f32], dz: &[f32], units: usize, keep: Option<f32>, scale: f32) {
        for (c, t) in target.chunks_exact_mut(units).enumerate() {
            let (idx, val) = columns.column(c);
            for (j, t) in t.chunks_mut(8 * LANES).enumerate() {
                match t.len() {
                    128 => {
                        // 128 values: the sum stays in registers ([`sum_rows_fixed`]).
                        let mut acc = [0.0f32; 128];
                        sum_rows_fixed::<128>(&mut acc, idx, val, dz, units, j * 8 * LANES);
                        combine(&mut t[..128], &acc, keep, scale);
                    }
                    _ => {
                        let mut acc = [0.0f32; 8 * LANES];
                        let acc = &mut acc[..t.len()];
                        sum_rows(acc, idx, val, dz, units, j * 8 * LANES);
                        combine(t, acc, keep, scale);
                    }
                }
            }
        }
    }
}

/// `t = keep·t + scale·g` (`scale·g` without `keep`).
#[inline(always)]
fn combine(t: &mut [f32], g: &[f32], keep: Option<f32>, scale: f32) {
    match keep {
        None => t.iter_mut().zip(g).for_each(|(t, g)| *t = scale * g),
        Some(keep) => t.iter_mut().zip(g).for_each(|(t, g)| *t = keep * *t + scale * g),
    }
}

/// One row of a block of `dx = dz · wᵀ` through ReLU's derivative: `d[c] = dz · w[c]` where
/// `x[c] > 0`, and 0 elsewhere, given the nonzeros `(idx, val)` of the row's stretch `x` of the
/// ReLU output; `w` is the block's kernel rows (`d.len() × units`), `dz` the row's gradient.
pub fn masked_dx_row(d: &mut [f32], idx: &[u32], val: &[f32], dz: &[f32], w: &[f32], units: usize) {
    d.fill(0.0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        unsafe {
            match units {
                128 => dots_avx512::<4>(d, idx, val, dz, w),
                _ => dots_avx512_any(d, idx, val, dz, w, units),
            }
        }
        return;
    }
    dots(d, idx, val, dz, w, units);
}

multiversion! {
    /// [`masked_dx_row`]'s dot products where `v > 0`, with [`dot`].
    fn dots(d: &mut [f32], idx: &[u32], val: &[f32], dz: &[f32], w: &[f32], units: usize) {
        for (&c, &v) in idx.iter().zip(val) {
            if v > 0.0 {
                d[c as usize] = dot(dz, &w[c as usize * units..][..units]);
            }
        }
    }
}

/// [`dots`] with [`dot`]'s sums in AVX-512 registers, the same bits (the compiler made slow
/// 128-bit code of the portable version), for rows of `PAIRS · 32` values: `dz` stays in
/// registers across the row's dot products.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512<const PAIRS: usize>(d: &mut [f32], idx: &[u32], val: &[f32], dz: &[f32], w: &[f32]) {
    use std::arch::x86_64::*;
    let units = PAIRS * 2 * LANES;
    let dz = &dz[..units];
    // SAFETY: each load reads 16 of `dz`'s `units` values.
    let a: [[__m512; 2]; PAIRS] = std::array::from_fn(|p| unsafe {
        [_mm512_loadu_ps(dz.as_ptr().add(2 * p * LANES)), _mm512_loadu_ps(dz.as_ptr().add((2 * p + 1) * LANES))]
    });
    for (&c, &v) in idx.iter().zip(val) {
        if !(v > 0.0) {
            continue;
        }
        let w = &w[c as usize * units..][..units];
        // SAFETY: each load reads 16 of `w`'s `units` values.
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for (p, a) in a.iter().enumerate() {
            unsafe {
                s0 = _mm512_fmadd_ps(a[0], _mm512_loadu_ps(w.as_ptr().add(2 * p * LANES)), s0);
                s1 = _mm512_fmadd_ps(a[1], _mm512_loadu_ps(w.as_ptr().add((2 * p + 1) * LANES)), s1);
            }
        }
        d[c as usize] = reduce_avx512(s0, s1);
    }
}

/// [`dots_avx512`] for any row length: `dz` is loaded per product, and the remainder past
/// the last 32 values goes through masked loads into the same lanes as [`dot`]'s.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512_any(d: &mut [f32], idx: &[u32], val: &[f32], dz: &[f32], w: &[f32], units: usize) {
    use std::arch::x86_64::*;
    let (pairs, rest) = (units / (2 * LANES), units % (2 * LANES));
    let (m0, m1) = (lanes_mask(rest.min(LANES)), lanes_mask(rest.saturating_sub(LANES)));
    let dz = &dz[..units];
    for (&c, &v) in idx.iter().zip(val) {
        if !(v > 0.0) {
            continue;
        }
        let w = &w[c as usize * units..][..units];
        // SAFETY: every load reads within `units` values of `w` and `dz` (the masked loads of
        // the remainder read only their unmasked lanes).
        unsafe {
            let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for p in 0..pairs {
                let (a, b) = (dz.as_ptr().add(p * 2 * LANES), w.as_ptr().add(p * 2 * LANES));
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b), s0);
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(LANES)), _mm512_loadu_ps(b.add(LANES)), s1);
            }
            if rest > 0 {
                let (a, b) = (dz.as_ptr().add(pairs * 2 * LANES), w.as_ptr().add(pairs * 2 * LANES));
                let (a0, b0) = (_mm512_maskz_loadu_ps(m0, a), _mm512_maskz_loadu_ps(m0, b));
                s0 = _mm512_mask3_fmadd_ps(a0, b0, s0, m0);
                let (a1, b1) = (_mm512_maskz_loadu_ps(m1, a.add(LANES)), _mm512_maskz_loadu_ps(m1, b.add(LANES)));
                s1 = _mm512_mask3_fmadd_ps(a1, b1, s1, m1);
            }
            d[c as usize] = reduce_avx512(s0, s1);
        }
    }
}

/// `s0 + s1` lane by lane, then lane l + 8 onto lane l, + 4, + 2, + 1: [`dot`]'s tree.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce_avx512(s0: std::arch::x86_64::__m512, s1: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm512_add_ps(s0, s1);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)));
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(s), high);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// The mask of the first `n` of 16 lanes.
#[cfg(target_arch = "x86_64")]
fn lanes_mask(n: usize) -> u16 {
    ((1u32 << n) - 1) as u16
}

/// `a · b` in two sets of `LANES` partial sums (chunks alternate between them, so two chains
/// of multiply-adds run at once), added lane by lane and then pairwise.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (mut s0, mut s1) = ([0.0f32; LANES], [0.0f32; LANES]);
    let (mut ac, mut bc) = (a.chunks_exact(2 * LANES), b.chunks_exact(2 * LANES));
    for (a, b) in (&mut ac).zip(&mut bc) {
        for l in 0..LANES {
            s0[l] = a[l].mul_add(b[l], s0[l]);
            s1[l] = a[LANES + l].mul_add(b[LANES + l], s1[l]);
        }
    }
    for (l, (a, b)) in ac.remainder().iter().zip(bc.remainder()).enumerate() {
        let s = if l < LANES { &mut s0[l] } else { &mut s1[l - LANES] };
        *s = a.mul_add(*b, *s);
    }
    for l in 0..LANES {
        s0[l] += s1[l];
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            s0[l] += s0[l + width];
        }
        width /= 2;
    }
    s0[0]
}

#[path = "sparse_timing.rs"]
pub mod timing;

#[cfg(test)]
#[path = "sparse_tests.rs"]
mod tests;

//! The AVX512-BF16 product: `vdpbf16ps` multiplies 16 pairs of bf16 values and adds both
//! products of each pair to an fp32 lane. A micro-kernel keeps an [`MR`] × [`NR`] block of
//! the output in 16 vector registers over the whole summed axis, reading the left operand
//! as broadcast pairs and the right as two vectors of pairs per step ([`super::pack`]'s
//! layouts). Each output value is one register's sum over all of `k`, in `k`'s order, so
//! the bits do not depend on how rows are split across threads.
//!
//! Hand-written because no crate has a bf16 product (`gemm` has none; a request upstream was
//! closed); the intrinsics are stable since Rust 1.89.

use super::pack::{self, MR, NR, pairs};
use super::{ProductPath, scratch};
use crate::engine::strided::{MatMut, MatRef};
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of the left operand one task packs and multiplies (its pairs stay in L2).
const MC: usize = 64;

/// Whether this CPU runs `vdpbf16ps`.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c = keep·c + scale · a · b` (`c` overwritten when `keep` is `None`) with bf16 inputs and
/// fp32 sums. Panics on a CPU without AVX512-BF16: the plan picks this path only where
/// [`available`] says so.
pub fn product(c: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, keep: Option<f32>, scale: f32, threads: usize) {
    assert!(available(), "the AVX512-BF16 product was planned on a CPU without AVX512-BF16");
    let Some((m, k, n)) = super::product_shape(ProductPath::Avx512Bf16, &c, &a, &b) else { return };
    scratch::with_words(1, |packed_b| {
        pack::pack_b(b, pairs(k), threads, packed_b);
        let job = ProductJob { a, packed_b, m, n, kp: pairs(k), threads };
        super::into_rows(c, keep, scale, |data, rs, keep, scale| job.run(data, rs, keep, scale));
    });
}

/// One product's operands, packed right-hand side and sizes.
struct ProductJob<'a> {
    a: MatRef<'a>,
    packed_b: &'a [u32],
    m: usize,
    n: usize,
    kp: usize,
    threads: usize,
}

impl ProductJob<'_> {
    /// Writes the product into the row-major `data` (row stride `rs` ≥ `n`), [`MC`] rows per
    /// task.
    fn run(&self, data: &mut [f32], rs: usize, keep: Option<f32>, scale: f32) {
        let blocks = self.m.div_ceil(MC);
        let task = |(block, rows): (usize, &mut [f32])| self.block(block, rows, rs, keep, scale);
        if self.threads > 1 {
            data.par_chunks_mut(MC * rs).take(blocks).enumerate().for_each(task);
        } else {
            data.chunks_mut(MC * rs).take(blocks).enumerate().for_each(task);
        }
    }

    /// Rows `block·MC ..` of the product into `out` (those rows of the destination).
    fn block(&self, block: usize, out: &mut [f32], rs: usize, keep: Option<f32>, scale: f32) {
        let rows = block * MC..((block + 1) * MC).min(self.m);
        let live_rows = rows.len();
        scratch::with_words(0, |packed_a| {
            pack::pack_a(self.a, rows, packed_a);
            let kp = self.kp;
            for q in 0..self.n.div_ceil(NR) {
                let cols = (self.n - q * NR).min(NR);
                let panel = &self.packed_b[q * kp * NR..(q + 1) * kp * NR];
                for g in 0..live_rows.div_ceil(MR) {
                    let group = &packed_a[g * kp * MR..(g + 1) * kp * MR];
                    let tile = Tile { rows: (live_rows - g * MR).min(MR), cols, rs, keep, scale };
                    let start = g * MR * rs + q * NR;
                    let last = start + (tile.rows - 1) * rs + cols;
                    assert!(last <= out.len(), "bf16 tile outside its rows");
                    // SAFETY: the tile's rows and columns lie in `out` (checked just above),
                    // and the packed operands hold `kp` pairs of MR rows and NR columns.
                    unsafe { tile.multiply(kp, group, panel, out[start..].as_mut_ptr()) }
                }
            }
        });
    }
}

/// Where one micro-kernel call writes: `rows × cols` (at most [`MR`] × [`NR`]) values at row
/// stride `rs`, as `keep·c + scale·sum`.
#[derive(Clone, Copy)]
struct Tile {
    rows: usize,
    cols: usize,
    rs: usize,
    keep: Option<f32>,
    scale: f32,
}

impl Tile {
    /// # Safety
    /// The CPU must have AVX512-BF16; `a` and `b` hold `kp · MR` and `kp · NR` words;
    /// `c + i·rs + j` is valid for reads and writes for every `i < rows`, `j < cols`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn multiply(self, kp: usize, a: &[u32], b: &[u32], c: *mut f32) {
        assert!(a.len() >= kp * MR && b.len() >= kp * NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..kp {
            // SAFETY: `b` holds NR (= 32) words for pair `p`, read as two 16-word vectors;
            // `__m512bh` is 32 bf16 in the same 64 bytes as `__m512i`.
            let (b0, b1): (__m512bh, __m512bh) = unsafe {
                let at = b.as_ptr().add(p * NR);
                (
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.cast())),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.add(16).cast())),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the same 64 bytes read as 32 bf16.
                let av: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(a[p * MR + r] as i32)) };
                acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
            }
        }
        let masks = [lanes(self.cols.min(16)), lanes(self.cols.saturating_sub(16))];
        let scale = _mm512_set1_ps(self.scale);
        for (r, acc) in acc.iter().enumerate().take(self.rows) {
            for half in 0..2 {
                if masks[half] == 0 {
                    continue;
                }
                // SAFETY: row `r` < rows and the masked columns < cols are valid (contract).
                unsafe {
                    let at = c.add(r * self.rs + 16 * half);
                    let mut v = _mm512_mul_ps(acc[half], scale);
                    if let Some(f) = self.keep {
                        v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(masks[half], at), _mm512_set1_ps(f), v);
                    }
                    _mm512_mask_storeu_ps(at, masks[half], v);
                }
            }
        }
    }

    /// # Safety
    /// Never called: [`available`] is false off x86-64, and [`product`] checks it.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn multiply(self, _kp: usize, _a: &[u32], _b: &[u32], _c: *mut f32) {
        unreachable!("AVX512-BF16 off x86-64")
    }
}

/// The first `n` (≤ 16) lanes (of a 16-lane mask).
pub(super) fn lanes(n: usize) -> u16 {
    if n >= 16 { u16::MAX } else { (1u16 << n) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bf16::round::{reference, tolerance};

    #[test]
    fn matches_the_reference_in_every_transpose_and_edge() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16 (the packing is tested in pack.rs)");
            return;
        }
        for (m, n, k) in [(1, 1, 1), (7, 33, 5), (64, 32, 64), (130, 70, 131), (9, 65, 384)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 17.0 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 13.0 - 3.5).collect();
            let (want, tol) = (reference(m, n, k, &a, &b), tolerance(m, n, k, &a, &b));
            let bt: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
            for (b_m, threads) in [(MatRef::rows(&b, k, n), 1), (MatRef::rows(&bt, n, k).t(), 2)] {
                let mut c = vec![0.5; m * n];
                product(MatMut::rows(&mut c, m, n), MatRef::rows(&a, m, k), b_m, None, 1.0, threads);
                for i in 0..m * n {
                    assert!((c[i] - want[i]).abs() <= tol[i], "{m}×{n}×{k} at {i}: {} vs {}", c[i], want[i]);
                }
                // keep·c + scale·ab, into a strided (column-major) destination.
                let mut d = vec![2.0; m * n];
                product(MatMut::new(&mut d, m, n, 1, m), MatRef::rows(&a, m, k), b_m, Some(0.5), -2.0, threads);
                for i in 0..m {
                    for j in 0..n {
                        let (got, w) = (d[j * m + i], 1.0 - 2.0 * want[i * n + j]);
                        assert!((got - w).abs() <= 2.0 * tol[i * n + j] + 1e-6, "strided {m}×{n}×{k}");
                    }
                }
            }
        }
    }
}

//! Packing for the bf16 products, plain Rust so it runs and is tested on any CPU: operands
//! are rounded to bf16 (software, [`super::round`]) as they are copied, two consecutive
//! values along the summed axis `k` per 32-bit word ("pair" or VNNI layout), which is what
//! `vdpbf16ps` and AMX's `tdpbf16ps` multiply. An odd `k` and ragged edges pad with zeros,
//! which add nothing to any sum.

use super::round::{round, to_bf16};
use crate::engine::simd::vectorized;
use crate::engine::strided::MatRef;
use std::ops::Range;

/// Rows of the left operand one micro-kernel call multiplies.
pub const MR: usize = 8;
/// Columns of the right operand one micro-kernel call multiplies (two 16-lane vectors).
pub const NR: usize = 32;

/// Pairs along a summed axis of `k` values.
pub fn pairs(k: usize) -> usize {
    k.div_ceil(2)
}

/// Two values as one word of bf16 bits, the first in the low half (the lower `k` index).
#[inline(always)]
pub fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(to_bf16(lo)) | (u32::from(to_bf16(hi)) << 16)
}

/// `m[i][j]`, or 0 past the last row or column (the padding of an odd `k`).
#[inline(always)]
fn at_or_zero(m: &MatRef<'_>, i: usize, j: usize) -> f32 {
    let (rows, cols) = m.shape();
    if i < rows && j < cols { m.at(i, j) } else { 0.0 }
}

/// Writes `dst[x] = pair(lo[x], hi[x])`, `hi` missing past its end (an odd `k`'s last pair).
#[inline(always)]
fn pair_lanes(dst: &mut [u32], lo: &[f32], hi: Option<&[f32]>) {
    match hi {
        Some(hi) => dst.iter_mut().zip(lo).zip(hi).for_each(|((d, &l), &h)| *d = pair(l, h)),
        None => dst.iter_mut().zip(lo).for_each(|(d, &l)| *d = pair(l, 0.0)),
    }
}

/// Packs `b` (`k × n`) into panels of [`NR`] columns: panel `q` holds, for each pair `p`,
/// the words `(b[2p][j], b[2p+1][j])` of its columns `j` in order (zero past `n`). `out` is
/// reused.
pub fn pack_b(b: MatRef<'_>, out: &mut Vec<u32>) {
    let (k, n) = b.shape();
    let kp = pairs(k);
    out.clear();
    out.resize(n.div_ceil(NR) * kp * NR, 0);
    vectorized(|| {
        if b.contiguous_row(0).is_some() {
            // Activations: two rows at a time, a panel's columns at once.
            for p in 0..kp {
                let (lo, hi) = (b.contiguous_row(2 * p).unwrap_or_default(), b.contiguous_row(2 * p + 1));
                for (q, dst) in out.chunks_exact_mut(kp * NR).enumerate() {
                    let cols = q * NR..((q + 1) * NR).min(n);
                    pair_lanes(&mut dst[p * NR..p * NR + cols.len()], &lo[cols.clone()], hi.map(|h| &h[cols]));
                }
            }
        } else {
            // A weight read transposed: down each column.
            for j in 0..n {
                let dst = &mut out[(j / NR) * kp * NR + j % NR..];
                for p in 0..kp {
                    dst[p * NR] = pair(b.at(2 * p, j), at_or_zero(&b, 2 * p + 1, j));
                }
            }
        }
    });
}

/// Packs rows `rows` of `a` (`m × k`) into groups of [`MR`] rows: group `g` holds, for each
/// pair `p`, the words `(a[i][2p], a[i][2p+1])` of its rows `i` in order (zero past the
/// range). `out` is reused.
pub fn pack_a(a: MatRef<'_>, rows: Range<usize>, out: &mut Vec<u32>) {
    let k = a.shape().1;
    let kp = pairs(k);
    out.clear();
    out.resize(rows.len().div_ceil(MR) * kp * MR, 0);
    vectorized(|| {
        if a.contiguous_col(0).is_some() {
            // Read transposed (a weight gradient's `xᵀ`): rows of a group lie side by side.
            for (g, group) in out.chunks_exact_mut(kp * MR).enumerate() {
                let live = (rows.start + g * MR)..(rows.start + (g + 1) * MR).min(rows.end);
                for p in 0..kp {
                    let lo = &a.contiguous_col(2 * p).unwrap_or_default()[live.clone()];
                    let hi = a.contiguous_col(2 * p + 1).map(|h| &h[live.clone()]);
                    pair_lanes(&mut group[p * MR..p * MR + live.len()], lo, hi);
                }
            }
        } else {
            for (r, i) in rows.clone().enumerate() {
                let group = &mut out[(r / MR) * kp * MR + r % MR..];
                for p in 0..kp {
                    group[p * MR] = pair(a.at(i, 2 * p), at_or_zero(&a, i, 2 * p + 1));
                }
            }
        }
    });
}

/// A dense row-major copy of `m` with every value rounded to bf16: the inputs of the
/// emulated path, whose fp32 products of bf16 values are exact. `out` is reused.
pub fn rounded(m: MatRef<'_>, out: &mut Vec<f32>) {
    let (rows, cols) = m.shape();
    out.clear();
    out.reserve(rows * cols);
    for i in 0..rows {
        out.extend((0..cols).map(|j| round(m.at(i, j))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bf16::round::from_bf16;

    fn unpair(w: u32) -> (f32, f32) {
        (from_bf16(w as u16), from_bf16((w >> 16) as u16))
    }

    #[test]
    fn b_panels_hold_pairs_down_k_and_pad_with_zeros() {
        // 3 × 35: an odd k (one padded pair) and a ragged second panel.
        let (k, n) = (3, 35);
        let v: Vec<f32> = (0..k * n).map(|i| i as f32).collect();
        let vt: Vec<f32> = (0..k * n).map(|i| v[(i % k) * n + i / k]).collect();
        for b in [MatRef::rows(&v, k, n), MatRef::rows(&vt, n, k).t()] {
            let mut out = Vec::new();
            pack_b(b, &mut out);
            assert_eq!(out.len(), 2 * 2 * NR);
            for q in 0..2 {
                for p in 0..2 {
                    for jj in 0..NR {
                        let j = q * NR + jj;
                        let (lo, hi) = unpair(out[q * 2 * NR + p * NR + jj]);
                        let want_lo = if j < n { round(v[2 * p * n + j]) } else { 0.0 };
                        let want_hi = if j < n && 2 * p + 1 < k { round(v[(2 * p + 1) * n + j]) } else { 0.0 };
                        assert_eq!((lo, hi), (want_lo, want_hi), "panel {q} pair {p} column {jj}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_groups_hold_pairs_along_k_for_a_range_of_rows() {
        let (m, k) = (11, 5);
        let v: Vec<f32> = (0..m * k).map(|i| 1.0 + i as f32 / 7.0).collect();
        let mut out = Vec::new();
        pack_a(MatRef::rows(&v, m, k), 2..11, &mut out);
        assert_eq!(out.len(), 2 * 3 * MR);
        for r in 0..2 * MR {
            for p in 0..3 {
                let (lo, hi) = unpair(out[(r / MR) * 3 * MR + p * MR + r % MR]);
                let i = 2 + r;
                let get = |j: usize| if i < m && j < k { round(v[i * k + j]) } else { 0.0 };
                assert_eq!((lo, hi), (get(2 * p), get(2 * p + 1)), "row {r} pair {p}");
            }
        }
    }

    #[test]
    fn rounded_copies_are_row_major_and_rounded() {
        let v: Vec<f32> = (0..6).map(|i| 1.0 + i as f32 / 3.0).collect();
        let mut out = Vec::new();
        rounded(MatRef::rows(&v, 2, 3).t(), &mut out);
        let want: Vec<f32> = [0, 3, 1, 4, 2, 5].iter().map(|&i| round(v[i])).collect();
        assert_eq!(out, want);
    }
}

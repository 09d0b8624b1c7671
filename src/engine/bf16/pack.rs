//! Packing for the bf16 products, plain Rust so it runs and is tested on any CPU: operands
//! are rounded to bf16 (software, [`super::round`]) as they are copied, two consecutive
//! values along the summed axis `k` per 32-bit word ("pair" or VNNI layout), which is what
//! `vdpbf16ps` and AMX's `tdpbf16ps` multiply. An odd `k` and ragged edges pad with zeros,
//! which add nothing to any sum.

use super::round::{round, to_bf16};
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

/// `m[i][j]`, or 0 past the last row (the padding of an odd `k`).
#[inline(always)]
fn at_or_zero(m: &MatRef<'_>, i: usize, j: usize) -> f32 {
    if i < m.shape().0 { m.at(i, j) } else { 0.0 }
}

/// Packs `b` (`k × n`) into panels of [`NR`] columns: panel `q` holds, for each pair `p`,
/// the words `(b[2p][j], b[2p+1][j])` of its columns `j` in order (zero past `n`). `out` is
/// reused.
pub fn pack_b(b: MatRef<'_>, out: &mut Vec<u32>) {
    let (k, n) = b.shape();
    let kp = pairs(k);
    let panels = n.div_ceil(NR);
    out.clear();
    out.resize(panels * kp * NR, 0);
    let mut put = |p: usize, j: usize| {
        out[(j / NR) * kp * NR + p * NR + j % NR] = pair(b.at(2 * p, j), at_or_zero(&b, 2 * p + 1, j));
    };
    // Walk the operand along its contiguous axis (a weight read transposed is contiguous
    // down its columns).
    if b.strides().1 == 1 {
        (0..kp).for_each(|p| (0..n).for_each(|j| put(p, j)));
    } else {
        (0..n).for_each(|j| (0..kp).for_each(|p| put(p, j)));
    }
}

/// Packs rows `rows` of `a` (`m × k`) into groups of [`MR`] rows: group `g` holds, for each
/// pair `p`, the words `(a[i][2p], a[i][2p+1])` of its rows `i` in order (zero past the
/// range). `out` is reused.
pub fn pack_a(a: MatRef<'_>, rows: Range<usize>, out: &mut Vec<u32>) {
    let k = a.shape().1;
    let kp = pairs(k);
    let groups = rows.len().div_ceil(MR);
    out.clear();
    out.resize(groups * kp * MR, 0);
    let at = |i: usize, j: usize| if j < k { a.at(i, j) } else { 0.0 };
    for (r, i) in rows.enumerate() {
        let group = &mut out[(r / MR) * kp * MR..];
        for p in 0..kp {
            group[p * MR + r % MR] = pair(at(i, 2 * p), at(i, 2 * p + 1));
        }
    }
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

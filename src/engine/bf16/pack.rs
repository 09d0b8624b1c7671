//! Packing for the bf16 products, plain Rust so it runs and is tested on any CPU: operands
//! are rounded to bf16 (software, [`super::round`]) as they are copied, two consecutive
//! values along the summed axis `k` per 32-bit word ("pair" or VNNI layout), which is what
//! `vdpbf16ps` and AMX's `tdpbf16ps` multiply. An odd `k` and ragged edges pad with zeros,
//! which add nothing to any sum.

use super::aligned::Aligned;
use super::convert;
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
    convert::interleave(lo, hi, dst);
}

/// Packs `b` (`k × n`) into panels of [`NR`] columns: panel `q` holds, for each of `kp`
/// (≥ [`pairs`]`(k)`) pairs `p`, the words `(b[2p][j], b[2p+1][j])` of its columns `j` in
/// order (zero past `n` and past `k`). Panels are packed on up to `threads` threads (each
/// word is written once, so the result does not depend on them). `out` is reused.
pub fn pack_b(b: MatRef<'_>, kp: usize, threads: usize, out: &mut Aligned<u32>) {
    let (k, n) = b.shape();
    debug_assert!(kp >= pairs(k));
    out.clear();
    out.resize(n.div_ceil(NR) * kp * NR, 0);
    if b.contiguous_row(0).is_some() {
        // Activations: two rows at a time across every panel, so rows are read in order
        // (panel by panel, a panel's 128 bytes of each row 6 KB apart defeated the
        // prefetcher: 3 GB/s). Tasks take ranges of pairs; each word is written once, so
        // the result does not depend on them.
        let panels = SharedPanels { out: out.as_mut_ptr(), len: out.len(), kp };
        let pair_rows = |ps: std::ops::Range<usize>| {
            // A pair of rows is converted whole, then dealt out a panel's 32 words at a time:
            // converting 32 words per call cost more in calls than in conversion (`perf`).
            let mut words = vec![0u32; n];
            for p in ps {
                let (lo, hi) = (b.contiguous_row(2 * p).unwrap_or_default(), b.contiguous_row(2 * p + 1));
                pair_lanes(&mut words, lo, hi);
                for (q, chunk) in words.chunks(NR).enumerate() {
                    // SAFETY: pair `p` of panel `q` is written by this task alone.
                    unsafe { panels.words(q, p, chunk.len()) }.copy_from_slice(chunk);
                }
            }
        };
        let per_task = pairs(k).div_ceil(4 * threads.max(1)).max(16);
        if threads > 1 && pairs(k) > per_task {
            use rayon::prelude::*;
            (0..pairs(k).div_ceil(per_task))
                .into_par_iter()
                .for_each(|t| pair_rows(t * per_task..((t + 1) * per_task).min(pairs(k))));
        } else {
            pair_rows(0..pairs(k));
        }
    } else {
        let panel = |(q, dst): (usize, &mut [u32])| vectorized(|| pack_panel(b, q, dst));
        if threads > 1 && n > NR {
            use rayon::prelude::*;
            out.par_chunks_exact_mut(kp * NR).enumerate().for_each(panel);
        } else {
            out.chunks_exact_mut(kp * NR).enumerate().for_each(panel);
        }
    }
}

/// [`pack_b`]'s output, written by tasks that each own a range of pairs in every panel.
struct SharedPanels {
    out: *mut u32,
    len: usize,
    kp: usize,
}

// SAFETY: tasks write disjoint words (their own pairs), and the buffer outlives them.
unsafe impl Sync for SharedPanels {}

impl SharedPanels {
    /// The `cols` words of pair `p` in panel `q`.
    ///
    /// # Safety
    /// No other live reference may cover them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn words(&self, q: usize, p: usize, cols: usize) -> &mut [u32] {
        let start = (q * self.kp + p) * NR;
        assert!(p < self.kp && cols <= NR && start + cols <= self.len);
        // SAFETY: inside the buffer (checked); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.out.add(start), cols) }
    }
}

/// Panel `q` of a [`pack_b`] of a weight read transposed, into `dst` (zeroed, `kp · NR`
/// words).
#[inline(always)]
fn pack_panel(b: MatRef<'_>, q: usize, dst: &mut [u32]) {
    let (k, n) = b.shape();
    let cols = q * NR..((q + 1) * NR).min(n);
    // Down each column, whose pairs lie side by side (a column's bf16 values in order are
    // its pair words, little-endian), converted whole, then spread.
    let mut words = vec![0u32; pairs(k)];
    for (jj, j) in cols.enumerate() {
        match b.contiguous_col(j) {
            Some(col) => {
                convert::row(col, bytemuck::cast_slice_mut::<u32, u16>(&mut words));
                if k % 2 == 1 {
                    words[k / 2] &= 0xffff;
                }
                words.iter().enumerate().for_each(|(p, &w)| dst[p * NR + jj] = w);
            }
            None => (0..pairs(k)).for_each(|p| dst[p * NR + jj] = pair(b.at(2 * p, j), at_or_zero(&b, 2 * p + 1, j))),
        }
    }
}

/// Packs rows `rows` of `a` (`m × k`) into groups of [`MR`] rows: group `g` holds, for each
/// pair `p`, the words `(a[i][2p], a[i][2p+1])` of its rows `i` in order (zero past the
/// range). `out` is reused.
pub fn pack_a(a: MatRef<'_>, rows: Range<usize>, out: &mut Aligned<u32>) {
    let k = a.shape().1;
    let kp = pairs(k);
    out.clear();
    out.resize(rows.len().div_ceil(MR) * kp * MR, 0);
    vectorized(|| {
        if a.contiguous_col(0).is_some() {
            // Read transposed (a weight gradient's `xᵀ`): a pair's values for every row of
            // the range lie side by side in two columns, interleaved whole, then dealt out a
            // group's MR words at a time. Group by group, each call interleaved 8 values and
            // read a column's cache lines once per group (`perf`, Zen 4, 2026-11-30).
            let mut words = vec![0u32; rows.len()];
            for p in 0..kp {
                let lo = &a.contiguous_col(2 * p).unwrap_or_default()[rows.clone()];
                let hi = a.contiguous_col(2 * p + 1).map(|h| &h[rows.clone()]);
                pair_lanes(&mut words, lo, hi);
                for (g, chunk) in words.chunks(MR).enumerate() {
                    out[g * kp * MR + p * MR..][..chunk.len()].copy_from_slice(chunk);
                }
            }
        } else {
            // A row's bf16 values in order are its pair words (little-endian), converted
            // whole, then spread: value by value, the software rounding took a tenth of a
            // `mixed_bfloat16` GPT step on a Zen 4 (`perf`, 2026-11-30).
            let mut words = vec![0u32; kp];
            for (r, i) in rows.clone().enumerate() {
                let group = &mut out[(r / MR) * kp * MR + r % MR..];
                match a.contiguous_row(i) {
                    Some(row) => {
                        convert::row(row, &mut bytemuck::cast_slice_mut::<u32, u16>(&mut words)[..k]);
                        if k % 2 == 1 {
                            words[k / 2] &= 0xffff;
                        }
                        words.iter().enumerate().for_each(|(p, &w)| group[p * MR] = w);
                    }
                    None => {
                        for p in 0..kp {
                            group[p * MR] = pair(a.at(i, 2 * p), at_or_zero(&a, i, 2 * p + 1));
                        }
                    }
                }
            }
        }
    });
}

/// Packs rows `rows` of `a` (`m × k`) into AMX tiles: groups of 16 rows, each `blocks` tiles
/// of 16 rows × 16 pairs along `k` (64-byte rows), row `r` of the range and pair `p` at word
/// `((r/16 · blocks + p/16) · 16 + r%16) · 16 + p%16`; zero past the range and past `k`.
/// `out` is reused.
pub fn pack_a_tiles(a: MatRef<'_>, rows: Range<usize>, blocks: usize, out: &mut Aligned<u32>) {
    const T: usize = super::amx::TILE;
    let k = a.shape().1;
    let kp = pairs(k);
    debug_assert!(blocks * T >= kp);
    let len = rows.len().div_ceil(T) * blocks * T * T;
    let at = |r: usize, p: usize| ((r / T * blocks + p / T) * T + r % T) * T + p % T;
    if a.contiguous_row(rows.start).is_some() && a.contiguous_col(0).is_none() {
        // Activations, the common case: every word is written below (padding included), so
        // the buffer is not cleared first (the clearing showed in `perf` beside the copies).
        out.resize(len, 0);
        pack_a_tile_rows(a, rows, blocks, out);
        return;
    }
    if a.contiguous_col(0).is_some() {
        // Read transposed (a weight gradient's `xᵀ`): whole tiles at once where the CPU
        // converts in registers, every word written.
        out.resize(len, 0);
        let cols: Vec<&[f32]> = (0..k).map_while(|j| a.contiguous_col(j)).collect();
        if convert::transposed_tiles(&cols, rows.clone(), blocks, out) {
            return;
        }
    }
    out.clear();
    out.resize(len, 0);
    vectorized(|| {
        if a.contiguous_col(0).is_some() {
            // Read transposed (a weight gradient's `xᵀ`): a pair's rows lie side by side,
            // interleaved whole, then spread down the tiles.
            let mut words = vec![0u32; rows.len()];
            for p in 0..kp {
                let lo = &a.contiguous_col(2 * p).unwrap_or_default()[rows.clone()];
                let hi = a.contiguous_col(2 * p + 1).map(|h| &h[rows.clone()]);
                convert::interleave(lo, hi, &mut words);
                words.iter().enumerate().for_each(|(r, &w)| out[at(r, p)] = w);
            }
        } else {
            for (r, i) in rows.clone().enumerate() {
                match a.contiguous_row(i) {
                    // Activations: a row's bf16 values in order are its pair words, a tile
                    // row (32 values) at once.
                    Some(row) => {
                        for (t, src) in row.chunks(2 * T).enumerate() {
                            let dst = &mut out[at(r, t * T)..at(r, t * T) + T];
                            convert::row(src, bytemuck::cast_slice_mut::<u32, u16>(dst));
                        }
                    }
                    None => (0..kp).for_each(|p| out[at(r, p)] = pair(a.at(i, 2 * p), at_or_zero(&a, i, 2 * p + 1))),
                }
            }
        }
    });
}

/// [`pack_a_tiles`] of contiguous rows into `out` (`len` words, any contents): each row is
/// converted whole into a zero-padded line of `blocks` tile rows, which are then copied into
/// place; the rows past the range are zeroed.
fn pack_a_tile_rows(a: MatRef<'_>, rows: Range<usize>, blocks: usize, out: &mut [u32]) {
    const T: usize = super::amx::TILE;
    let k = a.shape().1;
    // Past `k` the line stays zero: every row converts only its first `k` values into it.
    let mut line = vec![0u32; blocks * T];
    let lines = rows.len().div_ceil(T) * T;
    for r in 0..lines {
        let group = &mut out[(r / T * blocks * T + r % T) * T..];
        match rows.start.checked_add(r).filter(|i| *i < rows.end).and_then(|i| a.contiguous_row(i)) {
            Some(row) => {
                // An odd `k`'s last high half is past `k`, so it stays zero too.
                convert::row(&row[..k], &mut bytemuck::cast_slice_mut::<u32, u16>(&mut line)[..k]);
                for (t, tile_row) in line.chunks_exact(T).enumerate() {
                    group[t * T * T..][..T].copy_from_slice(tile_row);
                }
            }
            None => (0..blocks).for_each(|t| group[t * T * T..][..T].fill(0)),
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
            let mut out = Aligned::new();
            pack_b(b, pairs(k), 2, &mut out);
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
        // The same matrix held by columns (a weight gradient's `xᵀ`).
        let vt: Vec<f32> = (0..m * k).map(|x| v[(x % m) * k + x / m]).collect();
        for a in [MatRef::rows(&v, m, k), MatRef::rows(&vt, k, m).t()] {
            let mut out = Aligned::new();
            pack_a(a, 2..11, &mut out);
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
    }

    #[test]
    fn a_tiles_hold_16_pairs_a_row_and_pad_rows_and_k_with_zeros() {
        // 19 rows (2..21) of 35: two groups (one ragged), k padded to 2 tiles of 16 pairs, read both
        // row-major and transposed.
        let (m, k, blocks) = (21, 35, 2);
        let v: Vec<f32> = (0..m * k).map(|i| 1.0 + i as f32 / 7.0).collect();
        let vt: Vec<f32> = (0..m * k).map(|i| v[(i % m) * k + i / m]).collect();
        for a in [MatRef::rows(&v, m, k), MatRef::rows(&vt, k, m).t()] {
            // A reused buffer's old words must not show through anywhere.
            let mut out = Aligned::new();
            out.resize(5000, 0xdead_beef);
            pack_a_tiles(a, 2..21, blocks, &mut out);
            assert_eq!(out.len(), 2 * blocks * 16 * 16);
            for r in 0..32 {
                for p in 0..blocks * 16 {
                    let (lo, hi) = unpair(out[((r / 16 * blocks + p / 16) * 16 + r % 16) * 16 + p % 16]);
                    let i = 2 + r;
                    let get = |j: usize| if i < m && j < k { round(v[i * k + j]) } else { 0.0 };
                    assert_eq!((lo, hi), (get(2 * p), get(2 * p + 1)), "row {r} pair {p}");
                }
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

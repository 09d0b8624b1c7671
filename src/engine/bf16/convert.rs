//! fp32 → bf16 conversion of whole slices, the inner loop of packing: `vcvtneps2bf16`
//! (AVX512-BF16) sixteen values at a time where the CPU has it, [`super::round::to_bf16`]
//! elsewhere. Both round to nearest even, flush denormals to a signed zero and quiet NaNs,
//! so packing gives the same bits on every CPU (tested value by value below).
//!
//! Why intrinsics: the portable loops, called through closures, compiled to SSE only (no
//! wider instructions without a target feature), and packing then took as long as AMX's
//! products themselves at nanoGPT's shapes (`perf`, 2026-11-29).

use super::round::to_bf16;

/// `dst[i]` = `src[i]` as bf16 bits (`dst` at least as long as `src`).
pub fn row(src: &[f32], dst: &mut [u16]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: the CPU has AVX512F and AVX512-BF16 (checked by `fast`).
        unsafe { x86::row(src, dst) };
        return;
    }
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d = to_bf16(s));
}

/// `dst[i]` = the pair word of `lo[i]` (low half) and `hi[i]` (high half; 0 where `hi` is
/// missing, an odd `k`'s last pair), `dst` at least as long as `lo`.
pub fn interleave(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
    let dst = &mut dst[..lo.len()];
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: the CPU has AVX512F and AVX512-BF16 (checked by `fast`).
        unsafe { x86::interleave(lo, hi, dst) };
        return;
    }
    let word = |l: f32, h: f32| u32::from(to_bf16(l)) | (u32::from(to_bf16(h)) << 16);
    match hi {
        Some(hi) => dst.iter_mut().zip(lo).zip(hi).for_each(|((d, &l), &h)| *d = word(l, h)),
        None => dst.iter_mut().zip(lo).for_each(|(d, &l)| *d = word(l, 0.0)),
    }
}

/// AMX left-operand tiles of the rows `rows` of a matrix held by columns (`cols[j]` is column
/// `j`, the summed axis running over `j`: a weight gradient's `xᵀ`), into `out`: group `g` of
/// 16 rows, tile `t` of 16 pairs, row `r` and pair `p` at word `((g·blocks + t)·16 + r)·16 +
/// p`, zero past the range and past `cols.len()`; every word of the `groups × blocks` tiles
/// is written. Returns false, writing nothing, where the CPU lacks the instructions (the
/// caller then packs word by word): 16 pairs of 16 rows are converted, interleaved and
/// transposed in registers, where spreading each word to its tile one at a time cost more
/// than the conversion (`perf`, 2026-11-29).
pub fn transposed_tiles(cols: &[&[f32]], rows: std::ops::Range<usize>, blocks: usize, out: &mut [u32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fast() && is_x86_feature_detected!("avx512bw") {
        let groups = rows.len().div_ceil(16);
        assert!(out.len() >= groups * blocks * 256 && cols.len() <= blocks * 32);
        assert!(cols.iter().all(|c| c.len() >= rows.end));
        // SAFETY: the CPU has AVX512F, BW and BF16 (checked just above); `out` holds every
        // tile and each column every row of the range (asserted).
        unsafe { x86::transposed_tiles(cols, rows, blocks, out) };
        return true;
    }
    let _ = (cols, rows, blocks, out);
    false
}

/// Whether the conversion instructions are there (the check is cached by `std`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fast() -> bool {
    !cfg!(miri) && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::to_bf16;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have AVX512F and AVX512-BF16; `dst.len() == src.len()`.
    #[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
    pub unsafe fn row(src: &[f32], dst: &mut [u16]) {
        let whole = src.len() / 16 * 16;
        for i in (0..whole).step_by(16) {
            // SAFETY: 16 values from `i` < `whole` lie in both slices.
            unsafe {
                let v = _mm512_loadu_ps(src.as_ptr().add(i));
                let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        dst[whole..].iter_mut().zip(&src[whole..]).for_each(|(d, &s)| *d = to_bf16(s));
    }

    /// `permutexvar_epi16` indices taking 16 low and then 16 high halves into pairs: lane
    /// `2i` from lane `i`, lane `2i + 1` from lane `16 + i`.
    const PAIRS: [i16; 32] = {
        let mut idx = [0i16; 32];
        let mut i = 0;
        while i < 16 {
            idx[2 * i] = i as i16;
            idx[2 * i + 1] = 16 + i as i16;
            i += 1;
        }
        idx
    };

    /// `permutex2var_epi32` indices of one step of a 16 × 16 transpose by blocks of `b`: the
    /// upper row of a pair takes the lower row's left block into its right one (`upper` false
    /// builds the upper row, true the lower).
    const fn swap(b: usize, upper: bool) -> [i32; 16] {
        let mut idx = [0i32; 16];
        let mut j = 0;
        while j < 16 {
            let left = j & b == 0;
            idx[j] = match (upper, left) {
                (false, true) => j,
                (false, false) => 16 + j - b,
                (true, true) => j + b,
                (true, false) => 16 + j,
            } as i32;
            j += 1;
        }
        idx
    }
    const SWAPS: [[[i32; 16]; 2]; 4] = [
        [swap(8, false), swap(8, true)],
        [swap(4, false), swap(4, true)],
        [swap(2, false), swap(2, true)],
        [swap(1, false), swap(1, true)],
    ];

    /// Transposes 16 rows of 16 words in place: the off-diagonal blocks of 8, then of 4, 2
    /// and 1 trade places.
    ///
    /// # Safety
    /// The CPU must have AVX512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose16(v: &mut [__m512i; 16]) {
        for (step, b) in [8usize, 4, 2, 1].into_iter().enumerate() {
            // SAFETY: 64 bytes of an index table each.
            let (lo, hi) = unsafe {
                (_mm512_loadu_si512(SWAPS[step][0].as_ptr().cast()), _mm512_loadu_si512(SWAPS[step][1].as_ptr().cast()))
            };
            for i in (0..16).filter(|i| i & b == 0) {
                let (a, c) = (v[i], v[i + b]);
                v[i] = _mm512_permutex2var_epi32(a, lo, c);
                v[i + b] = _mm512_permutex2var_epi32(a, hi, c);
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX512F, BW and BF16; `out` holds `groups × blocks` tiles and every
    /// column every row of the range (see [`super::transposed_tiles`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx512vl")]
    pub unsafe fn transposed_tiles(cols: &[&[f32]], rows: std::ops::Range<usize>, blocks: usize, out: &mut [u32]) {
        let k = cols.len();
        // SAFETY: 64 bytes of the index table.
        let pairs = unsafe { _mm512_loadu_si512(PAIRS.as_ptr().cast()) };
        for g in 0..rows.len().div_ceil(16) {
            let r0 = rows.start + 16 * g;
            let live = (rows.end - r0).min(16);
            let mask: __mmask16 = if live == 16 { !0 } else { (1 << live) - 1 };
            for t in 0..blocks {
                let mut v = [_mm512_setzero_si512(); 16];
                for (pp, v) in v.iter_mut().enumerate() {
                    let p = 16 * t + pp;
                    // Written out rather than as a closure, which would be compiled without
                    // this function's features. SAFETY (the loads): the masked lanes are rows
                    // `r0 ..< r0 + live` of the column, inside it (the caller's contract);
                    // masked-off lanes are not read.
                    let lo = if 2 * p < k {
                        unsafe { _mm512_maskz_loadu_ps(mask, cols[2 * p].as_ptr().add(r0)) }
                    } else {
                        _mm512_setzero_ps()
                    };
                    let hi = if 2 * p + 1 < k {
                        unsafe { _mm512_maskz_loadu_ps(mask, cols[2 * p + 1].as_ptr().add(r0)) }
                    } else {
                        _mm512_setzero_ps()
                    };
                    // Low 16 halves from the pair's first column, high 16 from its second.
                    let both: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) };
                    *v = _mm512_permutexvar_epi16(pairs, both);
                }
                // SAFETY: register operations on this function's features.
                unsafe { transpose16(&mut v) };
                for (r, v) in v.iter().enumerate() {
                    // SAFETY: tile `(g, t)` row `r` lies in `out` (the caller's contract).
                    unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(((g * blocks + t) * 16 + r) * 16).cast(), *v) };
                }
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX512F and AVX512-BF16; `dst.len() == lo.len()` ≤ `hi.len()`.
    #[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
    pub unsafe fn interleave(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
        let whole = lo.len() / 16 * 16;
        for i in (0..whole).step_by(16) {
            // SAFETY: 16 values from `i` < `whole` lie in `lo`, `hi` and `dst`.
            unsafe {
                let l: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(lo.as_ptr().add(i))));
                let mut w = _mm512_cvtepu16_epi32(l);
                if let Some(hi) = hi {
                    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(hi.as_ptr().add(i))));
                    w = _mm512_or_si512(w, _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                }
                _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), w);
            }
        }
        // The last values under a mask, not one by one: when packing a weight gradient's
        // `xᵀ` interleaved 8 values a call (one group of rows), all of them this tail, those
        // software conversions were a seventh of a `mixed_bfloat16` GPT step on a Zen 4
        // (`perf`, 2026-11-30); short rows and ragged blocks still end here.
        let rest = lo.len() - whole;
        if rest > 0 {
            let mask: __mmask16 = super::super::dot::lanes(rest);
            // SAFETY: the masked lanes are the `rest` values from `whole` in `lo`, `hi` (at
            // least as long) and `dst`; masked-off lanes are neither read nor written.
            unsafe {
                let l: __m256i =
                    std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, lo.as_ptr().add(whole))));
                let mut w = _mm512_cvtepu16_epi32(l);
                if let Some(hi) = hi {
                    let h: __m256i =
                        std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, hi.as_ptr().add(whole))));
                    w = _mm512_or_si512(w, _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                }
                _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(whole).cast(), mask, w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class of value: normals around each exponent with every kind of tail (ties,
    /// just above and below), denormals, zeros, infinities, NaNs with payloads, and the
    /// largest finite values (which round to infinity).
    fn values() -> Vec<f32> {
        let mut bits: Vec<u32> = Vec::new();
        for exp in [0u32, 1, 2, 100, 126, 127, 128, 200, 253, 254, 255] {
            for mant in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0x7f_ffff, 0x40_0000, 0x12_3456]
            {
                for sign in [0u32, 1] {
                    bits.push(sign << 31 | exp << 23 | mant);
                }
            }
        }
        bits.extend((0..5000u32).map(|i| i.wrapping_mul(2_654_435_761)));
        bits.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn rows_give_the_software_bits() {
        let src = values();
        let want: Vec<u16> = src.iter().map(|&x| to_bf16(x)).collect();
        let mut got = vec![0u16; src.len()];
        row(&src, &mut got);
        assert_eq!(got, want);
    }

    /// The tiles of a transposed left operand: every value class, ragged rows and an odd
    /// number of columns (a padded pair), against the word-by-word layout.
    #[test]
    fn transposed_tiles_give_the_software_bits_in_the_tile_layout() {
        let vals = values();
        let (m, k, blocks) = (45, 37, 2);
        let cols: Vec<Vec<f32>> =
            (0..k).map(|j| (0..m).map(|i| vals[(j * m + i) * 7 % vals.len()]).collect()).collect();
        let cols: Vec<&[f32]> = cols.iter().map(|c| &c[..]).collect();
        let rows = 3..40;
        let mut got = vec![7u32; rows.len().div_ceil(16) * blocks * 256];
        if !transposed_tiles(&cols, rows.clone(), blocks, &mut got) {
            eprintln!("skipped: this CPU lacks AVX512-BF16 or AVX512BW (the packing falls back word by word)");
            return;
        }
        let half = |i: usize, j: usize| if i < rows.end && j < k { to_bf16(cols[j][i]) } else { 0 };
        for (w, &g) in got.iter().enumerate() {
            let (tile, r, p) = (w / 256, w / 16 % 16, w % 16);
            let (group, t) = (tile / blocks, tile % blocks);
            let (i, pair) = (rows.start + 16 * group + r, 16 * t + p);
            let want = u32::from(half(i, 2 * pair)) | (u32::from(half(i, 2 * pair + 1)) << 16);
            assert_eq!(g, want, "group {group} tile {t} row {r} pair {p}");
        }
    }

    #[test]
    fn interleaved_pairs_give_the_software_bits() {
        let lo = values();
        let hi: Vec<f32> = lo.iter().rev().copied().collect();
        let word = |l: f32, h: f32| u32::from(to_bf16(l)) | (u32::from(to_bf16(h)) << 16);
        let mut got = vec![0u32; lo.len()];
        interleave(&lo, Some(&hi), &mut got);
        assert!(got.iter().zip(lo.iter().zip(&hi)).all(|(&g, (&l, &h))| g == word(l, h)));
        interleave(&lo[3..], None, &mut got);
        assert!(got.iter().zip(&lo[3..]).all(|(&g, &l)| g == word(l, 0.0)));
        // Every length a mask covers (a group of rows is 8 values), at every offset of the
        // values, leaving the words past the end alone.
        for len in 1..=33 {
            for start in (0..lo.len() - len).step_by(97) {
                let mut got = vec![7u32; len + 1];
                interleave(&lo[start..start + len], Some(&hi[start..]), &mut got);
                assert!((0..len).all(|i| got[i] == word(lo[start + i], hi[start + i])), "{len} from {start}");
                assert_eq!(got[len], 7, "{len}: a word past the end was written");
            }
        }
    }
}

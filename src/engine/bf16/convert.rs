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
        for i in whole..lo.len() {
            let h = hi.map_or(0.0, |h| h[i]);
            dst[i] = u32::from(to_bf16(lo[i])) | (u32::from(to_bf16(h)) << 16);
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
    }
}

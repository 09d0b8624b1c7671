//! bf16 in software: fp32 → bf16 rounding to nearest even (what `vcvtne2ps2bf16` and
//! oneDNN do), and the portable reference product every bf16 path is checked against.
//!
//! Zero and denormal inputs become a signed zero, as the hardware paths treat denormals
//! (AVX512-BF16 and AMX flush them), so packing gives the same bits on every CPU.

/// `x` as bf16 bits, rounded to nearest even; NaN stays a (quiet) NaN, denormals flush to zero.
/// Branch-free, so packing loops vectorize.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the
    // dropped half is above one half, or equal to it with an odd kept half (ties to even);
    // a carry out of the largest finite value gives infinity, as it should.
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    let signed_zero = (bits >> 16) & 0x8000;
    let out = if x.is_nan() {
        quiet_nan
    } else if bits & 0x7f80_0000 == 0 {
        signed_zero
    } else {
        rounded
    };
    out as u16
}

/// The fp32 value of bf16 bits (exact: bf16 is fp32's upper half).
#[inline(always)]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to the nearest bf16 value, as fp32.
#[inline(always)]
pub fn round(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

/// The reference product `a · b` (row-major `m × k` and `k × n`) of bf16-rounded inputs:
/// each product of two bf16 values is exact in fp32, and the sums run in f64, so a path's
/// result differs from it only by its own fp32 accumulation (and denormal flushing).
pub fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum: f64 = (0..k).map(|p| f64::from(round(a[i * k + p]) * round(b[p * n + j]))).sum();
            c[i * n + j] = sum as f32;
        }
    }
    c
}

/// How far a path's `got` may lie from [`reference`]'s `want`: fp32 accumulation over `k`
/// terms errs by at most about `k · 2⁻²⁴` of the sum of the terms' magnitudes.
pub fn tolerance(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mag: f64 = (0..k).map(|p| f64::from((round(a[i * k + p]) * round(b[p * n + j])).abs())).sum();
            t[i * n + j] = (mag * (k as f64 + 2.0) * f64::from(f32::EPSILON)) as f32 + 1e-30;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even_and_flushes_denormals() {
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties go to the even (1.0).
        assert_eq!(round(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3·2⁻⁸ is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: ties go to the even (1 + 2⁻⁶).
        assert_eq!(round(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        // Just above half rounds up.
        assert_eq!(round(f32::from_bits(0x3f80_8001)), f32::from_bits(0x3f81_0000));
        assert_eq!(round(-2.5), -2.5);
        assert_eq!(to_bf16(f32::MIN_POSITIVE / 2.0), 0);
        assert_eq!(to_bf16(-f32::MIN_POSITIVE / 4.0), 0x8000);
        assert!(round(f32::NAN).is_nan());
        assert_eq!(round(f32::MAX), f32::INFINITY);
        assert_eq!(round(f32::INFINITY), f32::INFINITY);
        assert_eq!(round(1.0e-3), f32::from_bits(0x3a83_0000));
    }

    #[test]
    fn every_bf16_value_survives_a_round_trip() {
        for h in 0..=u16::MAX {
            let x = from_bf16(h);
            if x.is_nan() || (x != 0.0 && !x.is_normal()) {
                continue;
            }
            assert_eq!(to_bf16(x), h, "{h:#06x}");
        }
    }
}

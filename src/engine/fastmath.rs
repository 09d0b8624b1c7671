//! Branch-free f32 `exp`, `erfc`, `erf` and the normal distribution, for GELU, softmax and
//! their gradients.
//!
//! `f32::exp` is a libm call per value, which the compiler cannot vectorize: GELU over a GPT
//! block's MLP (4 × 12 × 64 × 512 values, twice in backward) spent more time in it than in the
//! matrix products. These functions have no branches or calls, so loops over them run at full
//! vector width under [`crate::engine::simd::vectorized`] (they are `#[inline(always)]` so they
//! compile inside it). Accuracy: `exp` within 2 ulp (Cephes `expf`); `erfc` within 1.2e-7
//! relative in exact arithmetic (Numerical Recipes' Chebyshev fit `erfcc`), about 1e-6 in f32
//! for arguments below 6; `erf` uses its Taylor series below 0.5 so it stays relative-accurate
//! near zero. Tests compare with Python's `math.erf`/`math.erfc` (tests/fixtures/gpt).

use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

/// 1.5 · 2²³: adding it rounds a float below 2²² to an integer held in the low mantissa bits.
const SHIFTER: f32 = 12_582_912.0;

/// `e^x`; saturates to `e^-87` ≈ 1.6e-38 below −87 and to `e^88` above 88 (callers pass
/// arguments ≤ 0 or use the result only through `1 / (1 + e^x)`), NaN stays NaN.
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' coefficients as published.
pub fn exp(x: f32) -> f32 {
    // Cephes: x = n·ln2 + r with |r| ≤ ln2/2, ln2 split in two so n·ln2 is exact enough.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + SHIFTER;
    let n = shifted - SHIFTER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    // 2^n built in the exponent field; n ∈ [−126, 127] after the clamp.
    let k = (shifted.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    y * f32::from_bits(((k + 127) as u32) << 23)
}

/// `erfc(z)` for `z ≥ 0` (Numerical Recipes' `erfcc`: `t·exp(−z² + P(t))`, `t = 1/(1 + z/2)`).
#[inline(always)]
fn erfc_nonneg(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    t * exp(erfcc_poly(t) - z * z)
}

/// `P(t)` of [`erfc_nonneg`].
#[inline(always)]
#[allow(clippy::excessive_precision)] // Numerical Recipes' coefficients as published.
fn erfcc_poly(t: f32) -> f32 {
    let mut p = 0.170_872_77;
    p = p * t - 0.822_152_23;
    p = p * t + 1.488_515_87;
    p = p * t - 1.135_203_98;
    p = p * t + 0.278_868_07;
    p = p * t - 0.186_288_06;
    p = p * t + 0.096_784_18;
    p = p * t + 0.374_091_96;
    p = p * t + 1.000_023_68;
    p * t - 1.265_512_23
}

/// The complementary error function, relative-accurate in both tails.
#[inline(always)]
pub fn erfc(x: f32) -> f32 {
    let e = erfc_nonneg(x.abs());
    if x < 0.0 { 2.0 - e } else { e }
}

/// The error function.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let far = 1.0 - erfc_nonneg(a);
    // 2/√π · Σ (−1)ⁿ x²ⁿ⁺¹ / (n! (2n + 1)) to n = 6: below 3e-8 relative for |x| ≤ 0.5.
    let s = x * x;
    let mut p = -1.0 / 9360.0;
    p = p * s + 1.0 / 1320.0;
    p = p * s - 1.0 / 216.0;
    p = p * s + 1.0 / 42.0;
    p = p * s - 1.0 / 10.0;
    p = p * s + 1.0 / 3.0;
    p = p * s - 1.0;
    let near = -std::f32::consts::FRAC_2_SQRT_PI * a * p;
    let v = if a < 0.5 { near } else { far };
    v.copysign(x)
}

/// Φ(x), the standard normal CDF `½·erfc(−x/√2)`: relative-accurate for negative `x` too.
#[inline(always)]
pub fn normal_cdf(x: f32) -> f32 {
    let half = 0.5 * erfc_nonneg(x.abs() * FRAC_1_SQRT_2);
    if x < 0.0 { half } else { 1.0 - half }
}

/// `(Φ(x), φ(x))` together, sharing `e^(−x²/2)` (GELU's forward keeps its derivative
/// `Φ + x·φ` for backward).
#[inline(always)]
pub fn normal_cdf_pdf(x: f32) -> (f32, f32) {
    // 1/√(2π).
    const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
    let z = x.abs() * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let gauss = exp(-0.5 * x * x);
    let half = 0.5 * t * gauss * exp(erfcc_poly(t));
    (if x < 0.0 { half } else { 1.0 - half }, FRAC_1_SQRT_2PI * gauss)
}

/// φ(x), the standard normal density.
#[inline(always)]
pub fn normal_pdf(x: f32) -> f32 {
    // 1/√(2π).
    const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
    FRAC_1_SQRT_2PI * exp(-0.5 * x * x)
}

/// The logistic function `1 / (1 + e^−x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Independent partial sums [`sum`] and [`dot`] keep, so the compiler can vectorize them
/// without reordering anything itself (the order is fixed, the result the same every run).
const LANES: usize = 16;

/// `Σ x`, in a fixed order of [`LANES`] partial sums.
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    // Plain loops, no closures: everything must inline into `vectorized`'s wide copy.
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += v;
    }
    let mut total = 0.0;
    for a in acc {
        total += a;
    }
    total
}

/// The largest value (−∞ for none), in [`LANES`] partial maxima.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] = acc[j].max(c[j]);
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = a.max(*v);
    }
    let mut top = f32::NEG_INFINITY;
    for a in acc {
        top = top.max(a);
    }
    top
}

/// `Σ a·b`, in a fixed order of [`LANES`] partial sums.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for j in 0..LANES {
            acc[j] += x[j] * y[j];
        }
    }
    for ((s, x), y) in acc.iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
        *s += x * y;
    }
    let mut total = 0.0;
    for a in acc {
        total += a;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f32, b: f64) -> f64 {
        (f64::from(a) - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let want = f64::from(x).exp();
            worst = worst.max(rel(exp(x), want));
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) >= 0.0);
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn normal_cdf_pdf_and_sigmoid_are_relative_accurate_in_the_tails() {
        for i in 0..=2000 {
            let x = -12.0 + 24.0 * i as f32 / 2000.0;
            let xd = f64::from(x);
            let pdf = (-0.5 * xd * xd).exp() / (2.0 * std::f64::consts::PI).sqrt();
            assert!(rel(normal_pdf(x), pdf) < 1e-5, "pdf({x})");
            let sig = 1.0 / (1.0 + (-xd).exp());
            assert!(rel(sigmoid(x), sig) < 1e-6, "sigmoid({x})");
            let (cdf, density) = normal_cdf_pdf(x);
            assert!(rel(density, pdf) < 1e-5, "normal_cdf_pdf({x}).1");
            // Both round `x²` in the exponent: they part by ~1e-5 relative only where Φ < 1e-19.
            if x > -9.0 {
                assert!(rel(cdf, f64::from(normal_cdf(x))) < 1e-5, "normal_cdf_pdf({x}).0");
            }
        }
        // Φ(−5) = 2.866515718791939e-7 (scipy.stats.norm.cdf), where 1 − Φ(5) in f32 is 0.
        assert!(rel(normal_cdf(-5.0), 2.866_515_718_791_939e-7) < 5e-6);
        assert!(rel(normal_cdf(0.0), 0.5) < 1e-7);
    }

    #[test]
    fn sums_and_dots_match_f64() {
        for len in [0, 1, 15, 16, 17, 128, 131] {
            let a: Vec<f32> = (0..len).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..len).map(|i| ((i * 3) % 5) as f32 * 0.25).collect();
            let want: f64 = a.iter().map(|v| f64::from(*v)).sum();
            assert_eq!(f64::from(sum(&a)), want);
            let want: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            assert_eq!(f64::from(dot(&a, &b)), want);
        }
    }
}

//! `mixed_bfloat16` matrix products (Keras's policy name): the inputs of a product are
//! rounded to bf16, the sums and the output stay fp32. Master weights, optimizer state,
//! gradients, all-reduce sums, losses, softmax and layer-norm statistics never leave fp32;
//! only the layers' products take a [`ProductPath`].
//!
//! Paths, chosen once per run by the plan from what the CPU has ([`Bf16Support`]):
//! - `float32`: `gemm` on fp32 inputs (the `float32` policy, or no bf16 on this CPU).
//! - `amx_bf16`: `tdpbf16ps` on 16 × 32 tiles of bf16 ([`amx`]), where the CPU has AMX.
//! - `avx512_bf16`: `vdpbf16ps` on packed bf16 pairs ([`dot`]).
//! - `fp32-emulated-storage`: inputs rounded to bf16 while copied, multiplied by `gemm`'s
//!   fp32 kernel (the products of bf16 values are exact in fp32): bf16's numbers at fp32's
//!   speed, for CPUs whose `vdpbf16ps` is slower than their fp32 FMA.
//!
//! Every path splits output rows, never a sum, across threads, so one path gives the same
//! bits on any thread count; different paths differ in the last bits of their sums.

mod aligned;
mod amx;
mod convert;
mod dot;
mod pack;
pub mod round;
mod scratch;

use crate::engine::strided::{MatMut, MatRef, gemm_scaled};
use crate::engine::tuning::{Tuning, Vdpbf16ps};
use serde::Serialize;

/// How a layer's matrix products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProductPath {
    /// fp32 inputs through `gemm`.
    #[default]
    Float32,
    /// bf16-rounded inputs, stored as fp32, through `gemm`.
    EmulatedBfloat16,
    /// bf16 pairs through `vdpbf16ps`.
    Avx512Bf16,
    /// bf16 tiles through AMX's `tdpbf16ps`.
    Amx,
}

impl ProductPath {
    /// The path's name as `trainrun check` and `trainrun bench` print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::EmulatedBfloat16 => "fp32-emulated-storage",
            Self::Avx512Bf16 => "avx512_bf16",
            Self::Amx => "amx_bf16",
        }
    }

    /// The smallest model dimension at which this path beat `gemm`'s fp32 kernel on the CPU
    /// it was measured on ([`Bf16Support::mixed_path`]).
    pub fn pays_from(self) -> usize {
        match self {
            Self::Float32 | Self::EmulatedBfloat16 => 0,
            // Per CPU family: the conversion while packing costs more or less against the
            // core's fp32 rate. Only planned where the family's row has a width.
            Self::Avx512Bf16 => match Tuning::here().vdpbf16ps {
                Vdpbf16ps::PaysFrom(width) => width,
                Vdpbf16ps::Slower => usize::MAX,
            },
            Self::Amx => amx::PAYS_FROM,
        }
    }

    /// The path for a layer whose products multiply `inputs` by `units` (its two model
    /// dimensions: never the batch, so replicas of any size take the same path): this path
    /// where it pays, fp32 where fp32 measured faster. `vdpbf16ps` needs both dimensions of
    /// at least [`ProductPath::pays_from`].
    pub fn for_dims(self, inputs: usize, units: usize) -> Self {
        if inputs.min(units) >= self.pays_from() { self } else { Self::Float32 }
    }

    /// Whether products run in fp32 (for leaving the field out of a serialized plan).
    pub fn is_float32(&self) -> bool {
        *self == Self::Float32
    }
}

/// What this CPU offers for bf16 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Support {
    /// AMX tiles (AMX-BF16), granted to this process.
    Amx,
    /// `vdpbf16ps` (AVX512-BF16).
    Avx512Bf16,
    /// No bf16 instructions.
    None,
}

impl Bf16Support {
    /// This CPU's support, detected at run time.
    pub fn detect() -> Self {
        if amx::available() {
            Self::Amx
        } else if dot::available() {
            Self::Avx512Bf16
        } else {
            Self::None
        }
    }

    /// The path `mixed_bfloat16` takes here: `None` where the products run in fp32.
    ///
    /// With AVX512-BF16, `vdpbf16ps` for the layers large enough ([`ProductPath::for_dims`]).
    /// Chosen by measurement (`trainrun bench --only products`, 2 threads, 2026-11-29, AMD
    /// EPYC family 26, full-width AVX-512): at nanoGPT's shapes `vdpbf16ps` ran 655–700
    /// GFLOP/s against `gemm`'s fp32 440–458 where the output is 1,152–1,536 wide, 475–490
    /// against 443–454 at 384 wide, and 461 against 384 for a weight gradient; at width 128
    /// and below (the Shakespeare spec, one head's attention, a 65-token LM head) fp32 was
    /// faster (up to 2×), so those stay fp32 there; on a Zen 4, whose fp32 rate is half a
    /// Zen 5's, `vdpbf16ps` pays from 128 (the width is the family's: [`Tuning::vdpbf16ps`]).
    /// The fp32-emulated path (bf16 values at fp32's speed) was slower than both everywhere
    /// (its copies cost more than they save), so it is never planned; it remains the portable
    /// check.
    ///
    /// With AMX, `tdpbf16ps` (Intel Xeon with AMX-BF16, 2 threads, 2026-11-29): 612–757
    /// GFLOP/s at nanoGPT's layer shapes against `gemm`'s fp32 301–345 and `vdpbf16ps`'s
    /// 146–183 (half the fp32 rate on this CPU, as DEPENDENCIES.md says), 206–446 against
    /// 74–288 at the Shakespeare spec's 128-wide layers; one head's 64-wide products were
    /// level with fp32 (124–136 against 122–133), so AMX pays from 64 ([`amx::PAYS_FROM`]).
    ///
    /// Whether `vdpbf16ps` pays at all, and from what width, is the CPU family's
    /// ([`Tuning::vdpbf16ps`]): on an Intel core it runs at half the fp32 rate, so there
    /// `mixed_bfloat16` without AMX stays fp32.
    pub fn mixed_path(self) -> Option<ProductPath> {
        match self {
            Self::Amx => Some(ProductPath::Amx),
            Self::Avx512Bf16 if matches!(Tuning::here().vdpbf16ps, Vdpbf16ps::PaysFrom(_)) => {
                Some(ProductPath::Avx512Bf16)
            }
            Self::Avx512Bf16 | Self::None => None,
        }
    }

    /// Why [`Bf16Support::mixed_path`] is `None` here, for the warning that says so.
    pub fn why_fp32(self) -> String {
        match self {
            Self::None => "this CPU has neither AVX512-BF16 nor AMX".into(),
            Self::Amx | Self::Avx512Bf16 => format!(
                "this CPU has AVX512-BF16 but no AMX, and on its family ({}) `vdpbf16ps` is slower than the fp32 kernel",
                Tuning::here().family.name()
            ),
        }
    }

    /// The name `trainrun check` prints for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Amx => "amx_bf16",
            Self::Avx512Bf16 => "avx512_bf16",
            Self::None => "none",
        }
    }
}

/// The sizes `(m, k, n)` of `c = a · b` for the `path` product, or `None` when the product
/// is empty; panics on shapes that do not fit (a layer's bug, never the user's).
fn product_shape(path: ProductPath, c: &MatMut<'_>, a: &MatRef<'_>, b: &MatRef<'_>) -> Option<(usize, usize, usize)> {
    let ((m, k), n) = (a.shape(), b.shape().1);
    assert!(
        b.shape().0 == k && c.shape() == (m, n),
        "{} product shapes: {m}×{k} · {:?} into {:?}",
        path.name(),
        b.shape(),
        c.shape()
    );
    (m > 0 && n > 0).then_some((m, k, n))
}

/// Runs `multiply(rows, rs, keep, scale)`, which writes a product into row-major `rows` at
/// row stride `rs` as `keep·c + scale·ab`, on `c`: in place where `c`'s rows are whole,
/// else into a dense block that is then applied (none of the layers' destinations today).
fn into_rows(mut c: MatMut<'_>, keep: Option<f32>, scale: f32, multiply: impl Fn(&mut [f32], usize, Option<f32>, f32)) {
    let (m, n) = c.shape();
    match c.row_major() {
        Some((data, rs)) => multiply(data, rs, keep, scale),
        None => {
            let mut dense = vec![0.0; m * n];
            multiply(&mut dense, n, None, 1.0);
            c.update(|i, j, v| *v = keep.map_or(0.0, |f| f * *v) + scale * dense[i * n + j]);
        }
    }
}

/// Every path this process can run: fp32, the emulated path, and the instructions it has.
pub fn paths_here() -> Vec<ProductPath> {
    let mut paths = vec![ProductPath::Float32, ProductPath::EmulatedBfloat16];
    paths.extend(dot::available().then_some(ProductPath::Avx512Bf16));
    paths.extend(amx::available().then_some(ProductPath::Amx));
    paths
}

/// The bf16 paths a layer's tests should see taken on this CPU: [`paths_here`] but fp32 and
/// those its family never plans (`vdpbf16ps` on an Intel core, slower than fp32 there),
/// saying which are left out.
#[cfg(test)]
pub(crate) fn bf16_paths_to_test() -> Vec<ProductPath> {
    let (planned, slower): (Vec<_>, Vec<_>) =
        paths_here().into_iter().filter(|p| !p.is_float32()).partition(|p| p.pays_from() < usize::MAX);
    for path in slower {
        eprintln!("{} is never planned on this CPU family (slower than fp32 here): not tested", path.name());
    }
    planned
}

/// `c = (accumulate ? c : 0) + scale · a · b` on `path` (see [`crate::engine::strided::gemm`]).
pub fn gemm(
    path: ProductPath,
    c: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
    scale: f32,
    threads: usize,
) {
    product(path, c, a, b, accumulate.then_some(1.0), scale, threads);
}

/// `c = keep·c + scale · a · b` (`c` overwritten when `keep` is `None`) on `path`.
pub fn product(
    path: ProductPath,
    c: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    keep: Option<f32>,
    scale: f32,
    threads: usize,
) {
    match path {
        ProductPath::Float32 => gemm_scaled(c, a, b, keep, scale, threads),
        ProductPath::EmulatedBfloat16 => scratch::with_floats(|ra, rb| {
            let ((m, k), n) = (a.shape(), b.shape().1);
            pack::rounded(a, ra);
            pack::rounded(b, rb);
            gemm_scaled(c, MatRef::rows(ra, m, k), MatRef::rows(rb, k, n), keep, scale, threads)
        }),
        ProductPath::Avx512Bf16 => dot::product(c, a, b, keep, scale, threads),
        ProductPath::Amx => amx::product(c, a, b, keep, scale, threads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use round::{reference, tolerance};

    /// Every path this CPU runs, checked against the software reference; the `float32`
    /// path is the one the reference does not describe.
    #[test]
    fn every_path_here_matches_the_reference() {
        let paths: Vec<_> = paths_here().into_iter().filter(|p| *p != ProductPath::Float32).collect();
        for (path, skipped) in
            [(ProductPath::Avx512Bf16, "this CPU has none"), (ProductPath::Amx, "this CPU or kernel gives no AMX")]
        {
            if !paths.contains(&path) {
                eprintln!("skipped {}: {skipped}", path.name());
            }
        }
        let (m, n, k) = (37, 45, 70);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 29) % 97) as f32 / 9.0 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 31) % 83) as f32 / 11.0 - 3.0).collect();
        let (want, tol) = (reference(m, n, k, &a, &b), tolerance(m, n, k, &a, &b));
        for path in paths {
            let mut c = vec![1.0; m * n];
            gemm(path, MatMut::rows(&mut c, m, n), MatRef::rows(&a, m, k), MatRef::rows(&b, k, n), true, 1.0, 2);
            for i in 0..m * n {
                assert!(
                    (c[i] - 1.0 - want[i]).abs() <= tol[i] + 1e-6,
                    "{path:?} at {i}: {} vs {}",
                    c[i] - 1.0,
                    want[i]
                );
            }
        }
    }

    /// Each bf16 instruction path splits rows, never a sum, across threads.
    #[test]
    fn bits_do_not_depend_on_threads() {
        let paths = [ProductPath::Avx512Bf16, ProductPath::Amx];
        let here: Vec<_> = paths.into_iter().filter(|p| paths_here().contains(p)).collect();
        if here.is_empty() {
            eprintln!("skipped: this CPU has neither AVX512-BF16 nor AMX");
        }
        let (m, n, k) = (300, 100, 200);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 89.0 - 0.5).collect();
        for path in here {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut c = vec![0.0f32; m * n];
                let (c_m, a_m, b_m) = (MatMut::rows(&mut c, m, n), MatRef::rows(&a, m, k), MatRef::rows(&b, k, n));
                pool.install(|| gemm(path, c_m, a_m, b_m, false, 1.0, threads));
                c
            };
            let one = run(1);
            assert!([2, 3].iter().all(|&t| run(t) == one), "{path:?}");
        }
    }

    #[test]
    fn float32_is_gemm_bit_for_bit() {
        let (m, n, k) = (9, 7, 11);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32).cos()).collect();
        let (mut c1, mut c2) = (vec![0.0; m * n], vec![0.0; m * n]);
        gemm(
            ProductPath::Float32,
            MatMut::rows(&mut c1, m, n),
            MatRef::rows(&a, m, k),
            MatRef::rows(&b, k, n),
            false,
            0.5,
            1,
        );
        crate::engine::strided::gemm(
            MatMut::rows(&mut c2, m, n),
            MatRef::rows(&a, m, k),
            MatRef::rows(&b, k, n),
            false,
            0.5,
            1,
        );
        assert_eq!(c1, c2);
    }
}

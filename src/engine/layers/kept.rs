//! Activations a layer keeps from forward to backward: fp32, or under `mixed_bfloat16` bf16
//! bits where their only readers are bf16 products (issue 34). A bf16 product rounds its
//! inputs to bf16 as it packs them ([`to_bf16`]), and rounding a value that is bf16 already
//! gives it back, so products of the kept bf16 values are the same bits as products of the
//! fp32 values they were rounded from, for half the bytes. Values with another reader (a
//! softmax, a layer norm, GELU, a residual sum, an fp32 product) stay fp32.

use super::lent::{LentBuffer, lend};
use crate::engine::bf16::ProductPath;
use crate::engine::bf16::round::{from_bf16, to_bf16};
use crate::engine::simd::vectorized;
use rayon::prelude::*;
use std::ops::{Deref, DerefMut};

/// Values kept for backward, as wide as their readers need.
pub(super) enum Kept {
    /// Read by fp32 arithmetic or fp32 products.
    Float32(Vec<f32>),
    /// Read only by bf16 products.
    Bfloat16(Vec<u16>),
}

impl Kept {
    /// Storage for values whose only readers are products on `path`.
    pub(super) fn for_products(path: ProductPath) -> Self {
        match path {
            ProductPath::Float32 => Self::Float32(Vec::new()),
            ProductPath::EmulatedBfloat16 | ProductPath::Avx512Bf16 | ProductPath::Amx => Self::Bfloat16(Vec::new()),
        }
    }

    /// Where forward computes the `len` values to keep: the kept buffer itself when it is
    /// fp32, else a lent fp32 buffer that [`Staging::keep`] rounds into it.
    pub(super) fn staging(&mut self, len: usize) -> Staging<'_> {
        match self {
            Self::Float32(kept) => {
                kept.resize(len, 0.0);
                Staging::Kept(&mut kept[..])
            }
            Self::Bfloat16(kept) => Staging::Lent(lend(len), kept),
        }
    }

    /// Values [`Kept::read`] needs as scratch for `len` kept values.
    pub(super) fn scratch_len(&self, len: usize) -> usize {
        match self {
            Self::Float32(_) => 0,
            Self::Bfloat16(_) => len,
        }
    }

    /// The first `len` kept values as fp32: the kept buffer, or the bf16 values widened
    /// (exactly) into `scratch` (at least [`Kept::scratch_len`] values).
    pub(super) fn read<'a>(&'a self, len: usize, scratch: &'a mut [f32], threads: usize) -> &'a [f32] {
        match self {
            Self::Float32(kept) => &kept[..len],
            Self::Bfloat16(kept) => {
                let (kept, wide) = (&kept[..len], &mut scratch[..len]);
                let chunk = len.div_ceil(threads.max(1)).max(1);
                wide.par_chunks_mut(chunk).zip(kept.par_chunks(chunk)).for_each(|(wide, kept)| {
                    vectorized(
                        #[inline(always)]
                        || wide.iter_mut().zip(kept).for_each(|(w, &k)| *w = from_bf16(k)),
                    )
                });
                wide
            }
        }
    }
}

/// The fp32 values forward computes before they are kept ([`Kept::staging`]).
pub(super) enum Staging<'a> {
    /// Written in place.
    Kept(&'a mut [f32]),
    /// Written here, rounded into the kept bf16 by [`Staging::keep`].
    Lent(LentBuffer, &'a mut Vec<u16>),
}

impl Staging<'_> {
    /// Keeps the values (rounding them to bf16 where they are kept so), on `threads` threads.
    pub(super) fn keep(self, threads: usize) {
        match self {
            Self::Kept(_) => {}
            Self::Lent(values, kept) => {
                kept.resize(values.len(), 0);
                let chunk = values.len().div_ceil(threads.max(1)).max(1);
                kept.par_chunks_mut(chunk).zip(values.par_chunks(chunk)).for_each(|(kept, values)| {
                    vectorized(
                        #[inline(always)]
                        || kept.iter_mut().zip(values).for_each(|(k, &v)| *k = to_bf16(v)),
                    )
                });
            }
        }
    }
}

impl Deref for Staging<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Self::Kept(values) => values,
            Self::Lent(values, _) => values,
        }
    }
}

impl DerefMut for Staging<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            Self::Kept(values) => values,
            Self::Lent(values, _) => values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bf16::round::round;

    #[test]
    fn bf16_keeps_what_a_bf16_product_reads_and_fp32_keeps_every_bit() {
        let values: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.731).sin() * 3.0 + 1e-40 * i as f32).collect();
        for path in [ProductPath::Float32, ProductPath::EmulatedBfloat16, ProductPath::Avx512Bf16, ProductPath::Amx] {
            let mut kept = Kept::for_products(path);
            let mut staging = kept.staging(values.len());
            staging.copy_from_slice(&values);
            staging.keep(3);
            let mut scratch = vec![f32::NAN; kept.scratch_len(values.len())];
            let read = kept.read(values.len(), &mut scratch, 2);
            for (r, v) in read.iter().zip(&values) {
                let want = if path.is_float32() { *v } else { round(*v) };
                assert_eq!(r.to_bits(), want.to_bits(), "{path:?} at {v}");
                // What a bf16 product packs is unchanged by keeping.
                assert_eq!(to_bf16(*r), to_bf16(*v), "{path:?} at {v}");
            }
        }
    }
}

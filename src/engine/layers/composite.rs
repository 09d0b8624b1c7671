//! Helpers for layers built from child layers (`residual`, `transformer_block`) and for
//! layers that keep scratch buffers.

use crate::engine::kernels::par_rows;
use crate::engine::layer::{Layer, ParamSpec};
use std::ops::Range;

/// `buf` resized to `len` values (contents are overwritten by the caller).
pub(super) fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

/// Ranges for consecutive blocks of the given lengths.
pub(super) fn ranges(lens: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    let mut start = 0;
    lens.into_iter()
        .map(|len| {
            start += len;
            start - len..start
        })
        .collect()
}

/// Values in `specs`' tensors.
pub(super) fn total(specs: Vec<ParamSpec>) -> usize {
    specs.iter().map(ParamSpec::len).sum()
}

/// The tensors `of` gives for each child, named `prefix/name` after the child's prefix.
pub(super) fn prefixed<'a>(
    children: impl Iterator<Item = (&'static str, &'a dyn Layer)>,
    of: impl Fn(&dyn Layer) -> Vec<ParamSpec>,
) -> Vec<ParamSpec> {
    children
        .flat_map(|(prefix, layer)| {
            of(layer).into_iter().map(move |mut p| {
                p.name = format!("{prefix}/{}", p.name);
                p
            })
        })
        .collect()
}

/// `a += b` over `rows` rows of `row` values, in parallel.
pub(super) fn add(a: &mut [f32], b: &[f32], rows: usize, row: usize, threads: usize) {
    par_rows(a, rows, row, threads, |_, r, part| {
        crate::engine::simd::vectorized(
            #[inline(always)]
            || {
                for (a, b) in part.iter_mut().zip(&b[r.start * row..r.end * row]) {
                    *a += b;
                }
            },
        )
    });
}

/// `y = (y + bias) + residual` row by row over `rows` rows of `row` values, in parallel: a
/// layer's bias and the residual connection after it in one pass (an empty `bias` adds none).
/// The same bits as adding the bias, then the residual.
pub(super) fn add_bias_residual(
    y: &mut [f32],
    bias: &[f32],
    residual: &[f32],
    rows: usize,
    row: usize,
    threads: usize,
) {
    if bias.is_empty() {
        return add(y, residual, rows, row, threads);
    }
    par_rows(y, rows, row, threads, |_, r, part| {
        let residual = &residual[r.start * row..r.end * row];
        crate::engine::simd::vectorized(
            #[inline(always)]
            || {
                for (y, res) in part.chunks_exact_mut(row.max(1)).zip(residual.chunks_exact(row.max(1))) {
                    y.iter_mut().zip(res).zip(bias).for_each(|((y, r), b)| *y = (*y + b) + r);
                }
            },
        )
    });
}

/// Runs `a` and `b` at once, each with half of `threads` (the thread count it may use is its
/// argument), or one after the other with all of them when there is one. For a layer's two
/// independent backward products (kernel and input gradients, the same multiply-adds each):
/// two products on one thread each wait for each other once, where one after the other on
/// two threads wait inside `gemm` at every block of the shared dimension. `gemm` splits
/// outputs, never sums, so the bits are the same either way.
pub(super) fn both(threads: usize, a: impl FnOnce(usize) + Send, b: impl FnOnce(usize) + Send) {
    if threads < 2 {
        a(threads);
        b(threads);
    } else {
        let half = threads / 2;
        rayon::join(|| a(threads - half), || b(half));
    }
}

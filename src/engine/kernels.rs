//! CPU kernels: im2col / col2im, row-wise adds, and a fixed partition of work across threads
//! (the matrix products are `strided::gemm`).
//!
//! Work is split into a fixed number of contiguous parts (never rayon's adaptive splitting)
//! so sums happen in the same order every run: same spec and seed, bit-identical weights.

use std::ops::Range;

/// Adds `bias` to every row of `y` (rows of `bias.len()` values).
pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    super::simd::vectorized(
        #[inline(always)]
        || {
            for row in y.chunks_exact_mut(bias.len().max(1)) {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
        },
    );
}

/// Adds every row of `rows` (rows of `sum.len()` values) into `sum`, in row order.
pub fn add_rows(sum: &mut [f32], rows: &[f32]) {
    super::simd::vectorized(
        #[inline(always)]
        || {
            for row in rows.chunks_exact(sum.len().max(1)) {
                sum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
            }
        },
    );
}

/// Parts every sum across a batch is split into, whatever the thread count: partial sums
/// combine in the same order on a laptop with 16 cores and on a 2-core CI machine, so a spec
/// gives bit-identical weights on both (gemm itself splits outputs, never sums).
pub const SUM_PARTS: usize = 8;

/// Splits `0..n` into `parts` contiguous ranges, the first ones one longer: a pure function of
/// `(n, parts)`, so per-part partial sums combine in the same order every run.
pub fn partition(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|p| {
            let len = base + usize::from(p < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Splits `data` (`n` rows of `row_len`) into mutable parts along `ranges` of rows.
pub fn split_rows<'a>(mut data: &'a mut [f32], ranges: &[Range<usize>], row_len: usize) -> Vec<&'a mut [f32]> {
    let mut parts = Vec::with_capacity(ranges.len());
    for r in ranges {
        let (head, tail) = std::mem::take(&mut data).split_at_mut(r.len() * row_len);
        parts.push(head);
        data = tail;
    }
    parts
}

/// Runs `f(part_index, rows, part)` over `threads` fixed parts of `data` (`n` rows of
/// `row_len`) in parallel: for elementwise row work such as bias and activation.
pub fn par_rows(
    data: &mut [f32],
    n: usize,
    row_len: usize,
    threads: usize,
    f: impl Fn(usize, Range<usize>, &mut [f32]) + Sync,
) {
    use rayon::prelude::*;
    let ranges = partition(n, threads);
    let parts = split_rows(&mut data[..n * row_len], &ranges, row_len);
    parts.into_par_iter().zip(ranges).enumerate().for_each(|(i, (part, r))| f(i, r, part));
}

/// `dst.copy_from_slice(src)` without a `memcpy` call for the few values one window row holds
/// when images have one or three channels (a call per 3 values dominated im2col).
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) {
        let (d, s): (&mut [f32; N], &[f32; N]) = match (dst.try_into(), src.try_into()) {
            (Ok(d), Ok(s)) => (d, s),
            _ => return dst.copy_from_slice(src),
        };
        *d = *s;
    }
    match dst.len() {
        1 => fixed::<1>(dst, src),
        2 => fixed::<2>(dst, src),
        3 => fixed::<3>(dst, src),
        4 => fixed::<4>(dst, src),
        5 => fixed::<5>(dst, src),
        6 => fixed::<6>(dst, src),
        7 => fixed::<7>(dst, src),
        8 => fixed::<8>(dst, src),
        9 => fixed::<9>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// Geometry of a 2-D window sweep (convolution or pooling) over NHWC images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Input height, width, channels.
    pub h: usize,
    pub w: usize,
    pub c: usize,
    /// Window height and width.
    pub kh: usize,
    pub kw: usize,
    /// Strides.
    pub sh: usize,
    pub sw: usize,
    /// Padding before the first row and column (`same` padding puts any extra after).
    pub pad_top: usize,
    pub pad_left: usize,
    /// Output height and width.
    pub oh: usize,
    pub ow: usize,
}

impl Window {
    /// Keras's geometry for `valid` or `same` padding; `None` when the window does not fit.
    pub fn new(
        (h, w, c): (usize, usize, usize),
        (kh, kw): (usize, usize),
        (sh, sw): (usize, usize),
        same: bool,
    ) -> Option<Self> {
        let axis = |len: usize, k: usize, s: usize| -> Option<(usize, usize)> {
            if same {
                let out = len.div_ceil(s);
                let pad_total = ((out - 1) * s + k).saturating_sub(len);
                Some((out, pad_total / 2))
            } else if len >= k {
                Some(((len - k) / s + 1, 0))
            } else {
                None
            }
        };
        let (oh, pad_top) = axis(h, kh, sh)?;
        let (ow, pad_left) = axis(w, kw, sw)?;
        Some(Self { h, w, c, kh, kw, sh, sw, pad_top, pad_left, oh, ow })
    }

    /// Values in one patch row of im2col: `kh × kw × c`.
    pub fn patch_len(&self) -> usize {
        self.kh * self.kw * self.c
    }

    /// Output positions per image.
    pub fn positions(&self) -> usize {
        self.oh * self.ow
    }

    /// Input rows the window at output row `oy` covers inside the image (padding excluded):
    /// pooling visits real pixels only.
    pub fn rows_at(&self, oy: usize) -> Range<usize> {
        Self::span(oy, self.kh, self.sh, self.pad_top, self.h)
    }

    /// Input columns the window at output column `ox` covers inside the image.
    pub fn cols_at(&self, ox: usize) -> Range<usize> {
        Self::span(ox, self.kw, self.sw, self.pad_left, self.w)
    }

    fn span(o: usize, k: usize, stride: usize, pad: usize, len: usize) -> Range<usize> {
        let end = (o * stride + k).saturating_sub(pad).min(len);
        (o * stride).saturating_sub(pad).min(end)..end
    }

    /// Input row for output row `oy` and window row `ky`, if inside the image.
    #[inline(always)]
    pub(crate) fn source_row(&self, oy: usize, ky: usize) -> Option<usize> {
        Self::source(oy, ky, self.sh, self.pad_top, self.h)
    }

    /// Input column for output column `ox` and window column `kx`, if inside the image.
    #[inline(always)]
    pub(crate) fn source_col(&self, ox: usize, kx: usize) -> Option<usize> {
        Self::source(ox, kx, self.sw, self.pad_left, self.w)
    }

    /// Input row/column for output row/column `o` and window offset `k`, if inside the image.
    #[inline]
    fn source(o: usize, k: usize, stride: usize, pad: usize, len: usize) -> Option<usize> {
        (o * stride + k).checked_sub(pad).filter(|&i| i < len)
    }

    /// Writes the patches of `images` (NHWC, consecutive) as rows of `patches`
    /// (`images × positions` rows of `patch_len`), zero where the window leaves the image.
    pub fn im2col(&self, x: &[f32], images: usize, patches: &mut [f32]) {
        let (c, pl, seg) = (self.c, self.patch_len(), self.kw * self.c);
        let image_len = self.h * self.w * c;
        for e in 0..images {
            let img = &x[e * image_len..(e + 1) * image_len];
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let row = (e * self.positions() + oy * self.ow + ox) * pl;
                    let row = &mut patches[row..row + pl];
                    // A window row's pixels are contiguous in the image: copy the in-image
                    // run of `kx` at once (a few values per copy matter when `c` is 1 or 3).
                    let (kx, ix) = self.kx_span(ox);
                    for ky in 0..self.kh {
                        let dst = &mut row[ky * seg..(ky + 1) * seg];
                        match Self::source(oy, ky, self.sh, self.pad_top, self.h) {
                            Some(iy) if !kx.is_empty() => {
                                let src = (iy * self.w + ix) * c;
                                dst[..kx.start * c].fill(0.0);
                                copy_short(&mut dst[kx.start * c..kx.end * c], &img[src..src + kx.len() * c]);
                                dst[kx.end * c..].fill(0.0);
                            }
                            _ => dst.fill(0.0),
                        }
                    }
                }
            }
        }
    }

    /// Adds patch gradients back onto image gradients: the transpose of [`Window::im2col`].
    /// `dx` must be zeroed by the caller.
    pub fn col2im(&self, patches: &[f32], images: usize, dx: &mut [f32]) {
        let (c, pl, seg) = (self.c, self.patch_len(), self.kw * self.c);
        let image_len = self.h * self.w * c;
        for e in 0..images {
            let img = &mut dx[e * image_len..(e + 1) * image_len];
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let row = (e * self.positions() + oy * self.ow + ox) * pl;
                    let row = &patches[row..row + pl];
                    let (kx, ix) = self.kx_span(ox);
                    for ky in 0..self.kh {
                        let Some(iy) = Self::source(oy, ky, self.sh, self.pad_top, self.h) else {
                            continue;
                        };
                        let src = &row[ky * seg + kx.start * c..ky * seg + kx.end * c];
                        let at = (iy * self.w + ix) * c;
                        let dst = &mut img[at..at + src.len()];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += s;
                        }
                    }
                }
            }
        }
    }

    /// The window offsets `kx` that fall inside the image at output column `ox`, and the input
    /// column of the first.
    fn kx_span(&self, ox: usize) -> (Range<usize>, usize) {
        let cols = self.cols_at(ox);
        let first = cols.start + self.pad_left - ox * self.sw;
        (first..first + cols.len(), cols.start)
    }

    /// For each output position and channel, calls `f(output_index, input_indices)` with the
    /// flat NHWC indices (within one image) the window covers; pooling layers build on this.
    pub fn for_each_window(&self, mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>)) {
        for oy in 0..self.oh {
            for ox in 0..self.ow {
                for ch in 0..self.c {
                    let out = (oy * self.ow + ox) * self.c + ch;
                    let mut it = (0..self.kh)
                        .filter_map(move |ky| Self::source(oy, ky, self.sh, self.pad_top, self.h))
                        .flat_map(move |iy| {
                            (0..self.kw).filter_map(move |kx| {
                                Self::source(ox, kx, self.sw, self.pad_left, self.w)
                                    .map(|ix| (iy * self.w + ix) * self.c + ch)
                            })
                        });
                    f(out, &mut it);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_is_contiguous_and_complete() {
        for (n, parts) in [(10, 3), (2, 4), (0, 2), (64, 2)] {
            let ranges = partition(n, parts);
            assert_eq!(ranges.first().map(|r| r.start), Some(0));
            assert_eq!(ranges.last().map(|r| r.end), Some(n));
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        }
    }

    #[test]
    fn same_padding_matches_keras() {
        let w = Window::new((5, 5, 1), (3, 3), (2, 2), true).unwrap();
        assert_eq!((w.oh, w.ow, w.pad_top, w.pad_left), (3, 3, 1, 1));
        let w = Window::new((4, 4, 1), (3, 3), (2, 2), true).unwrap();
        // TensorFlow pads 1 in total here, all of it after.
        assert_eq!((w.oh, w.pad_top), (2, 0));
        assert!(Window::new((2, 2, 1), (3, 3), (1, 1), false).is_none());
    }

    #[test]
    fn window_spans_match_for_each_window() {
        let win = Window::new((5, 4, 1), (3, 2), (2, 1), true).unwrap();
        let mut visited = Vec::new();
        win.for_each_window(|_, it| visited.push(it.collect::<Vec<_>>()));
        let mut spans = Vec::new();
        for oy in 0..win.oh {
            for ox in 0..win.ow {
                let cols = win.cols_at(ox);
                spans.push(
                    win.rows_at(oy).flat_map(|iy| cols.clone().map(move |ix| iy * win.w + ix)).collect::<Vec<_>>(),
                );
            }
        }
        assert_eq!(visited, spans);
    }

    #[test]
    fn col2im_is_the_transpose_of_im2col() {
        // <im2col(x), p> == <x, col2im(p)> for any x, p.
        let win = Window::new((5, 4, 2), (3, 2), (2, 1), true).unwrap();
        let x: Vec<f32> = (0..2 * 5 * 4 * 2).map(|i| ((i * 7) % 11) as f32).collect();
        let rows = 2 * win.positions();
        let p: Vec<f32> = (0..rows * win.patch_len()).map(|i| ((i * 3) % 5) as f32).collect();
        let mut cols = vec![0.0; p.len()];
        win.im2col(&x, 2, &mut cols);
        let mut back = vec![0.0; x.len()];
        win.col2im(&p, 2, &mut back);
        let lhs: f32 = cols.iter().zip(&p).map(|(a, b)| a * b).sum();
        let rhs: f32 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
        assert_eq!(lhs, rhs);
    }
}

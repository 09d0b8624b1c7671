//! `max_pool2d`: Keras's `MaxPooling2D` (channels last). Forward keeps only the maxima;
//! backward finds, per window and channel, the first input equal to its maximum (the one
//! forward kept: ties go to the first position, as TensorFlow's) and routes the gradient
//! there. Both sweeps are branch-free across channels, so they vectorize; recording argmax
//! indices in forward did not, and cost inference as much as training.

use crate::engine::kernels::Window;
use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::op::Op;
use crate::engine::shape::Shape;
use rayon::prelude::*;

/// Max over each window of real pixels (`same` padding never wins a max, as in TensorFlow).
pub struct MaxPool2d {
    win: Window,
    output: Shape,
}

impl MaxPool2d {
    /// Pooling with the given geometry (`win.kh × win.kw` windows).
    pub fn new(win: Window) -> Self {
        Self { win, output: Shape(vec![win.oh, win.ow, win.c]) }
    }
}

/// Images per parallel part: `threads` contiguous parts, so work does not depend on scheduling.
pub(super) fn images_per_part(n: usize, threads: usize) -> usize {
    n.div_ceil(threads.max(1)).max(1)
}

/// Calls `f(output offset, input offset, first)` for every output position of one image and
/// every input pixel its window covers, in row-major window order (`first` for the first pixel
/// of each window); offsets are in values.
#[inline(always)]
fn sweep(win: &Window, mut f: impl FnMut(usize, usize, bool)) {
    let c = win.c;
    for oy in 0..win.oh {
        let rows = win.rows_at(oy);
        for ox in 0..win.ow {
            let cols = win.cols_at(ox);
            let at = (oy * win.ow + ox) * c;
            let mut first = true;
            for iy in rows.clone() {
                for ix in cols.clone() {
                    f(at, (iy * win.w + ix) * c, first);
                    first = false;
                }
            }
        }
    }
}

/// Whether `v` takes the maximum's place: a strictly larger value, or a NaN, which then stays
/// (as through ReLU, a diverged value reaches the loss instead of vanishing here).
#[inline(always)]
fn replaces(v: f32, max: f32) -> bool {
    v > max || v.is_nan()
}

/// Max-pools one image `x` into `y`; only a strictly larger value (or a NaN) replaces the
/// maximum.
#[inline(always)]
fn forward_image(win: &Window, x: &[f32], y: &mut [f32]) {
    let c = win.c;
    sweep(win, |at, base, first| {
        let (y, src) = (&mut y[at..at + c], &x[base..base + c]);
        if first {
            y.copy_from_slice(src);
        } else {
            y.iter_mut().zip(src).for_each(|(m, &v)| *m = if replaces(v, *m) { v } else { *m });
        }
    });
}

/// Adds each output gradient of one image onto the first input of its window equal to the
/// window's maximum; `left` (one value per channel) holds what is still to route. `dx` must
/// be zeroed.
#[inline(always)]
fn backward_image(win: &Window, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], left: &mut [f32]) {
    let c = win.c;
    sweep(win, |at, base, first| {
        if first {
            left.copy_from_slice(&dy[at..at + c]);
        }
        let (m, src, dst) = (&y[at..at + c], &x[base..base + c], &mut dx[base..base + c]);
        for (((d, l), &v), &m) in dst.iter_mut().zip(left.iter_mut()).zip(src).zip(m) {
            let hit = v == m;
            *d += if hit { *l } else { 0.0 };
            *l = if hit { 0.0 } else { *l };
        }
    });
}

/// Whether the windows tile the image in 2 × 2 blocks inside it (Keras's default pool, and
/// `same` padding on even sizes):
/// then every input belongs to at most one window, and backward writes `dx` once instead of
/// zeroing it and adding into it.
fn tiles_2x2(win: &Window) -> bool {
    (win.kh, win.kw, win.sh, win.sw, win.pad_top, win.pad_left) == (2, 2, 2, 2, 0, 0)
        && 2 * win.oh <= win.h
        && 2 * win.ow <= win.w
}

/// The input offsets of the window at output `(oy, ox)` of a 2 × 2 tiling, in row-major
/// window order.
#[inline(always)]
fn quad(win: &Window, oy: usize, ox: usize) -> [usize; 4] {
    let (c, w) = (win.c, win.w);
    let top = (2 * oy * w + 2 * ox) * c;
    [top, top + c, top + w * c, top + (w + 1) * c]
}

/// [`forward_image`] for a 2 × 2 tiling: the same comparisons in the same order.
#[inline(always)]
fn forward_image_2x2(win: &Window, x: &[f32], y: &mut [f32]) {
    let c = win.c;
    for oy in 0..win.oh {
        for ox in 0..win.ow {
            let [a, b, d, e] = quad(win, oy, ox);
            let y = &mut y[(oy * win.ow + ox) * c..][..c];
            let (a, b, d, e) = (&x[a..a + c], &x[b..b + c], &x[d..d + c], &x[e..e + c]);
            for ((((m, &a), &b), &d), &e) in y.iter_mut().zip(a).zip(b).zip(d).zip(e) {
                let mut v = a;
                for u in [b, d, e] {
                    v = if replaces(u, v) { u } else { v };
                }
                *m = v;
            }
        }
    }
}

/// [`backward_image`] for a 2 × 2 tiling: each input is written once, with the same sum the
/// zeroed-then-added path makes (`0.0 + g`, which keeps its signed zeros); inputs no window
/// covers (an odd last row or column) get zero.
#[inline(always)]
fn backward_image_2x2(win: &Window, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], left: &mut [f32]) {
    let c = win.c;
    dx[2 * win.oh * win.w * c..].fill(0.0);
    for oy in 0..win.oh {
        for iy in [2 * oy, 2 * oy + 1] {
            dx[(iy * win.w + 2 * win.ow) * c..(iy + 1) * win.w * c].fill(0.0);
        }
        for ox in 0..win.ow {
            let at = (oy * win.ow + ox) * c;
            let m = &y[at..at + c];
            left.copy_from_slice(&dy[at..at + c]);
            for base in quad(win, oy, ox) {
                let (src, dst) = (&x[base..base + c], &mut dx[base..base + c]);
                for (((d, l), &v), &m) in dst.iter_mut().zip(left.iter_mut()).zip(src).zip(m) {
                    let hit = v == m;
                    *d = 0.0 + if hit { *l } else { 0.0 };
                    *l = if hit { 0.0 } else { *l };
                }
            }
        }
    }
}

/// One part's images, forward or backward, as a `pulp` operation: its body is inlined under
/// the vector target features (a closure holding these loops was not, and ran scalar).
struct Images<'a> {
    win: &'a Window,
    x: &'a [f32],
    y: &'a [f32],
    /// Forward: the output. Backward: the input gradient.
    out: &'a mut [f32],
    /// Backward: the output gradient; forward: empty.
    dy: &'a [f32],
}

impl pulp::WithSimd for Images<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Images { win, x, y, out, dy } = self;
        let (in_len, out_len) = (win.h * win.w * win.c, win.oh * win.ow * win.c);
        let tiled = tiles_2x2(win);
        if dy.is_empty() {
            for (e, y) in out.chunks_exact_mut(out_len).enumerate() {
                let x = &x[e * in_len..(e + 1) * in_len];
                if tiled { forward_image_2x2(win, x, y) } else { forward_image(win, x, y) }
            }
            return;
        }
        let mut left = vec![0.0; win.c];
        for (e, dx) in out.chunks_exact_mut(in_len).enumerate() {
            let (x, o) = (&x[e * in_len..(e + 1) * in_len], e * out_len..(e + 1) * out_len);
            if tiled {
                backward_image_2x2(win, x, &y[o.clone()], &dy[o], dx, &mut left);
            } else {
                dx.fill(0.0);
                backward_image(win, x, &y[o.clone()], &dy[o], dx, &mut left);
            }
        }
    }
}

impl Layer for MaxPool2d {
    fn op(&self) -> Option<Op> {
        Some(Op::MaxPool2d(self.win))
    }

    fn kind(&self) -> &'static str {
        "max_pool2d"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let win = self.win;
        let (in_len, out_len) = (win.h * win.w * win.c, self.output.numel());
        if n == 0 || out_len == 0 {
            return;
        }
        let per = images_per_part(n, pass.threads);
        y[..n * out_len].par_chunks_mut(per * out_len).enumerate().for_each(|(p, y)| {
            let x = &x[p * per * in_len..(p * per + y.len() / out_len) * in_len];
            pulp::Arch::new().dispatch(Images { win: &win, x, y: &[], out: y, dy: &[] });
        });
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, x, y, dy, n } = cx;
        let Some(dx) = dx else { return };
        let win = self.win;
        let (in_len, out_len) = (win.h * win.w * win.c, self.output.numel());
        if n == 0 || in_len == 0 {
            return;
        }
        if out_len == 0 {
            dx[..n * in_len].fill(0.0);
            return;
        }
        let per = images_per_part(n, pass.threads);
        dx[..n * in_len].par_chunks_mut(per * in_len).enumerate().for_each(|(p, dx)| {
            let (first, count) = (p * per, dx.len() / in_len);
            let (x, o) = (&x[first * in_len..(first + count) * in_len], first * out_len..(first + count) * out_len);
            pulp::Arch::new().dispatch(Images { win: &win, x, y: &y[o.clone()], out: dx, dy: &dy[o] });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2 × 2 path gives the general sweep's bits: ties (few distinct values), signed zeros
    /// in the gradient, odd heights and widths whose last row or column no window covers.
    #[test]
    fn the_2x2_tiling_matches_the_general_sweep_bit_for_bit() {
        for (h, w, c) in [(5, 7, 3), (6, 4, 17), (3, 3, 1)] {
            let win = Window::new((h, w, c), (2, 2), (2, 2), false).unwrap();
            assert!(tiles_2x2(&win));
            let x: Vec<f32> = (0..h * w * c).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
            let out = win.oh * win.ow * c;
            let dy: Vec<f32> = (0..out).map(|i| if i % 3 == 0 { -0.0 } else { i as f32 - 4.5 }).collect();
            let (mut y_fast, mut y_slow) = (vec![9.0; out], vec![9.0; out]);
            forward_image_2x2(&win, &x, &mut y_fast);
            forward_image(&win, &x, &mut y_slow);
            assert_eq!(y_fast, y_slow);
            let (mut dx_fast, mut dx_slow, mut left) = (vec![9.0; x.len()], vec![0.0; x.len()], vec![0.0; c]);
            backward_image_2x2(&win, &x, &y_fast, &dy, &mut dx_fast, &mut left);
            backward_image(&win, &x, &y_slow, &dy, &mut dx_slow, &mut left);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dx_fast), bits(&dx_slow), "{h}×{w}×{c}");
        }
        // `same` padding's last window on an odd side holds one row: the general sweep.
        assert!(!tiles_2x2(&Window::new((5, 4, 1), (2, 2), (2, 2), true).unwrap()));
        assert!(tiles_2x2(&Window::new((4, 4, 1), (2, 2), (2, 2), true).unwrap()));
    }

    /// A NaN anywhere in a window makes that window's maximum NaN, on both paths, so a
    /// diverged value reaches the loss (where the step loop stops the run) instead of being
    /// passed over; other windows keep their maximum.
    #[test]
    fn a_nan_anywhere_in_a_window_is_its_maximum() {
        for same in [false, true] {
            let win = Window::new((4, 4, 1), (2, 2), (2, 2), same).unwrap();
            for at in [0, 1, 4, 5] {
                let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
                x[at] = f32::NAN;
                let (mut fast, mut slow) = (vec![0.0; 4], vec![0.0; 4]);
                forward_image_2x2(&win, &x, &mut fast);
                forward_image(&win, &x, &mut slow);
                for y in [&fast, &slow] {
                    assert!(y[0].is_nan(), "NaN at {at}: {y:?}");
                    assert_eq!(y[1..], [7.0, 13.0, 15.0], "NaN at {at}");
                }
            }
        }
    }
}

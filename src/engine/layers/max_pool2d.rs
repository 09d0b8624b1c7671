//! `max_pool2d`: Keras's `MaxPooling2D` (channels last). Forward records where each maximum
//! came from, so backward routes each gradient to that one input without searching again.

use crate::engine::kernels::Window;
use crate::engine::layer::{Layer, Pass};
use crate::engine::shape::Shape;
use rayon::prelude::*;

/// Max over each window of real pixels (`same` padding never wins a max, as in TensorFlow).
pub struct MaxPool2d {
    win: Window,
    output: Shape,
    /// For every output value of the last forward pass, the flat index of its maximum inside
    /// its own image.
    argmax: Vec<u32>,
}

impl MaxPool2d {
    /// Pooling with the given geometry (`win.kh × win.kw` windows).
    pub fn new(win: Window) -> Self {
        Self { win, output: Shape(vec![win.oh, win.ow, win.c]), argmax: Vec::new() }
    }
}

/// Images per parallel part: `threads` contiguous parts, so work does not depend on scheduling.
pub(super) fn images_per_part(n: usize, threads: usize) -> usize {
    n.div_ceil(threads.max(1)).max(1)
}

/// Max-pools one image `x` into `y`, writing each maximum's index in `x` to `arg`. The window
/// is swept in row-major order and only a strictly larger value replaces the maximum, so ties
/// go to the first position, as TensorFlow's.
#[inline(always)]
fn forward_image(win: &Window, x: &[f32], y: &mut [f32], arg: &mut [u32]) {
    let c = win.c;
    for oy in 0..win.oh {
        let rows = win.rows_at(oy);
        for ox in 0..win.ow {
            let cols = win.cols_at(ox);
            let at = (oy * win.ow + ox) * c;
            let (y, arg) = (&mut y[at..at + c], &mut arg[at..at + c]);
            let mut first = true;
            for iy in rows.clone() {
                for ix in cols.clone() {
                    let base = (iy * win.w + ix) * c;
                    let src = &x[base..base + c];
                    if first {
                        y.copy_from_slice(src);
                        arg.iter_mut().zip(base..).for_each(|(a, i)| *a = i as u32);
                        first = false;
                        continue;
                    }
                    // Branch-free so that it vectorizes across channels.
                    for ((m, a), (&v, i)) in y.iter_mut().zip(arg.iter_mut()).zip(src.iter().zip(base as u32..)) {
                        let gt = v > *m;
                        *m = if gt { v } else { *m };
                        *a = if gt { i } else { *a };
                    }
                }
            }
        }
    }
}

/// [`forward_image`] over consecutive images, as a `pulp` operation: its body is inlined under
/// the vector target features (a closure holding these loops was not, and ran scalar).
struct Images<'a> {
    win: &'a Window,
    x: &'a [f32],
    y: &'a mut [f32],
    arg: &'a mut [u32],
    in_len: usize,
    out_len: usize,
}

impl pulp::WithSimd for Images<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Images { win, x, y, arg, in_len, out_len } = self;
        for (e, (y, arg)) in y.chunks_exact_mut(out_len).zip(arg.chunks_exact_mut(out_len)).enumerate() {
            forward_image(win, &x[e * in_len..(e + 1) * in_len], y, arg);
        }
    }
}

impl Layer for MaxPool2d {
    fn kind(&self) -> &'static str {
        "max_pool2d"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, pass: Pass, _: &[f32], _: &mut [f32], x: &[f32], y: &mut [f32], n: usize) {
        let win = self.win;
        let (in_len, out_len) = (win.h * win.w * win.c, self.output.numel());
        if n == 0 || out_len == 0 {
            return;
        }
        self.argmax.resize(n * out_len, 0);
        let per = images_per_part(n, pass.threads);
        y[..n * out_len]
            .par_chunks_mut(per * out_len)
            .zip(self.argmax.par_chunks_mut(per * out_len))
            .enumerate()
            .for_each(|(p, (y, arg))| {
                let x = &x[p * per * in_len..];
                pulp::Arch::new().dispatch(Images { win: &win, x, y, arg, in_len, out_len });
            });
    }

    fn backward(
        &mut self,
        pass: Pass,
        _: &[f32],
        _: &mut [f32],
        _: &[f32],
        _: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        let Some(dx) = dx else { return };
        let win = self.win;
        let (in_len, out_len) = (win.h * win.w * win.c, self.output.numel());
        if n == 0 || in_len == 0 {
            return;
        }
        let per = images_per_part(n, pass.threads);
        let argmax = &self.argmax;
        dx[..n * in_len].par_chunks_mut(per * in_len).enumerate().for_each(|(p, dx)| {
            for (e, dx) in dx.chunks_exact_mut(in_len).enumerate() {
                let at = (p * per + e) * out_len;
                dx.fill(0.0);
                // Overlapping windows (stride < pool) may pick one input twice: add.
                for (&i, &g) in argmax[at..at + out_len].iter().zip(&dy[at..at + out_len]) {
                    dx[i as usize] += g;
                }
            }
        });
    }
}

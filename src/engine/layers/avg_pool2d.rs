//! `avg_pool2d`: Keras's `AveragePooling2D` (channels last). With `same` padding TensorFlow
//! divides by the number of real pixels under the window, not the window size: so does this.

use super::max_pool2d::images_per_part;
use crate::engine::kernels::Window;
use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::shape::Shape;
use rayon::prelude::*;

/// Mean over each window of real pixels.
pub struct AvgPool2d {
    win: Window,
    output: Shape,
}

impl AvgPool2d {
    /// Pooling with the given geometry (`win.kh × win.kw` windows).
    pub fn new(win: Window) -> Self {
        Self { win, output: Shape(vec![win.oh, win.ow, win.c]) }
    }
}

/// Calls `f(output_offset, input_offset, 1 / count)` for every real pixel of every window of
/// one image (offsets of the pixel's first channel), for backward.
fn sweep(win: &Window, mut f: impl FnMut(usize, usize, f32)) {
    for oy in 0..win.oh {
        let rows = win.rows_at(oy);
        for ox in 0..win.ow {
            let cols = win.cols_at(ox);
            let inv = 1.0 / (rows.len() * cols.len()).max(1) as f32;
            let out = (oy * win.ow + ox) * win.c;
            for iy in rows.clone() {
                for ix in cols.clone() {
                    f(out, (iy * win.w + ix) * win.c, inv);
                }
            }
        }
    }
}

/// Averages one image: sums each window first and scales once, as TensorFlow's kernel does.
fn forward_image(win: &Window, x: &[f32], y: &mut [f32]) {
    let c = win.c;
    for oy in 0..win.oh {
        let rows = win.rows_at(oy);
        for ox in 0..win.ow {
            let cols = win.cols_at(ox);
            let inv = 1.0 / (rows.len() * cols.len()).max(1) as f32;
            let y = &mut y[(oy * win.ow + ox) * c..][..c];
            y.fill(0.0);
            for iy in rows.clone() {
                for ix in cols.clone() {
                    let x = &x[(iy * win.w + ix) * c..][..c];
                    y.iter_mut().zip(x).for_each(|(s, v)| *s += v);
                }
            }
            y.iter_mut().for_each(|s| *s *= inv);
        }
    }
}

impl Layer for AvgPool2d {
    fn kind(&self) -> &'static str {
        "avg_pool2d"
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
            for (e, y) in y.chunks_exact_mut(out_len).enumerate() {
                let x = &x[(p * per + e) * in_len..][..in_len];
                forward_image(&win, x, y);
            }
        });
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, dy, n, .. } = cx;
        let Some(dx) = dx else { return };
        let win = self.win;
        let (c, in_len, out_len) = (win.c, win.h * win.w * win.c, self.output.numel());
        if n == 0 || in_len == 0 {
            return;
        }
        let per = images_per_part(n, pass.threads);
        dx[..n * in_len].par_chunks_mut(per * in_len).enumerate().for_each(|(p, dx)| {
            for (e, dx) in dx.chunks_exact_mut(in_len).enumerate() {
                let dy = &dy[(p * per + e) * out_len..][..out_len];
                dx.fill(0.0);
                sweep(&win, |o, i, inv| {
                    dx[i..i + c].iter_mut().zip(&dy[o..o + c]).for_each(|(d, g)| *d += g * inv);
                });
            }
        });
    }
}

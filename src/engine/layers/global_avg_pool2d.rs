//! `global_avg_pool2d`: Keras's `GlobalAveragePooling2D`, the mean of each channel over
//! height and width (the head of a ResNet).

use super::max_pool2d::images_per_part;
use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::op::Op;
use crate::engine::shape::Shape;
use rayon::prelude::*;

/// Mean over all positions of an `h × w × c` image: `[c]` per example.
pub struct GlobalAvgPool2d {
    positions: usize,
    output: Shape,
}

impl GlobalAvgPool2d {
    /// Pooling over `(h, w, c)` images.
    pub fn new((h, w, c): (usize, usize, usize)) -> Self {
        Self { positions: h * w, output: Shape(vec![c]) }
    }
}

impl Layer for GlobalAvgPool2d {
    fn op(&self) -> Option<Op> {
        Some(Op::GlobalAvgPool2d { positions: self.positions, channels: self.output.numel() })
    }

    fn kind(&self) -> &'static str {
        "global_avg_pool2d"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (c, hw) = (self.output.numel(), self.positions);
        if n == 0 || c == 0 {
            return;
        }
        let inv = 1.0 / hw.max(1) as f32;
        let per = images_per_part(n, pass.threads);
        y[..n * c].par_chunks_mut(per * c).enumerate().for_each(|(p, y)| {
            for (e, y) in y.chunks_exact_mut(c).enumerate() {
                let x = &x[(p * per + e) * hw * c..][..hw * c];
                y.fill(0.0);
                for px in x.chunks_exact(c) {
                    y.iter_mut().zip(px).for_each(|(s, v)| *s += v);
                }
                y.iter_mut().for_each(|s| *s *= inv);
            }
        });
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, dy, n, .. } = cx;
        let Some(dx) = dx else { return };
        let (c, hw) = (self.output.numel(), self.positions);
        if n == 0 || c == 0 || hw == 0 {
            return;
        }
        let inv = 1.0 / hw as f32;
        let per = images_per_part(n, pass.threads);
        dx[..n * hw * c].par_chunks_mut(per * hw * c).enumerate().for_each(|(p, dx)| {
            for (e, dx) in dx.chunks_exact_mut(hw * c).enumerate() {
                let dy = &dy[(p * per + e) * c..][..c];
                for px in dx.chunks_exact_mut(c) {
                    px.iter_mut().zip(dy).for_each(|(d, g)| *d = g * inv);
                }
            }
        });
    }
}

//! `dropout`: Keras's `Dropout`. In training each value is zeroed with probability `rate` and
//! the rest scaled by `1 / (1 − rate)`; in inference it is the identity.
//!
//! The mask is a pure function of `(pass.seed, layer salt, value index)` through a
//! counter-based hash (SplitMix64's output function): no random state to save or restore,
//! backward recomputes the mask instead of storing it, and the same seed gives the same mask
//! on any thread count.

use crate::engine::init::derive_seed;
use crate::engine::kernels::par_rows;
use crate::engine::layer::{Backward, Forward, Layer, Pass};
use crate::engine::shape::Shape;

/// Randomly zeroes inputs in training.
pub struct Dropout {
    rate: f32,
    salt: u64,
    output: Shape,
}

impl Dropout {
    /// Dropout of `rate` (in `[0, 1)`, checked by the caller) over inputs of `shape`. `salt`
    /// tells this layer's mask from other dropout layers' in the same pass (the model builder
    /// gives the layer's position).
    pub fn new(rate: f32, salt: u64, shape: Shape) -> Self {
        Self { rate, salt, output: shape }
    }

    /// `out = input ⊙ mask` over `n` examples, or a copy outside training.
    fn apply(&self, pass: Pass, input: &[f32], out: &mut [f32], n: usize) {
        let row = self.output.numel();
        let len = n * row;
        if !pass.training || self.rate == 0.0 {
            out[..len].copy_from_slice(&input[..len]);
            return;
        }
        let mask = masker(self.rate, self.salt, pass.seed);
        par_rows(out, n, row, pass.threads, |_, rows, part| {
            let start = rows.start * row;
            for ((o, v), i) in part.iter_mut().zip(&input[start..]).zip(start as u64..) {
                *o = v * mask(i);
            }
        });
    }
}

/// The multiplier of value `i`'s mask for dropout of `rate` in the layer salted `salt` on the
/// pass seeded `seed`: 0 (dropped) or `1 / (1 − rate)`. Values are kept when a uniform 32-bit
/// draw is at least `rate · 2³²`. Attention drops its probabilities with the same masks.
pub(crate) fn masker(rate: f32, salt: u64, seed: u64) -> impl Fn(u64) -> f32 + Sync + use<> {
    let key = derive_seed(&[seed, salt]);
    let threshold = (f64::from(rate) * 4_294_967_296.0) as u64;
    let scale = 1.0 / (1.0 - rate);
    move |i| {
        let z = key.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        if mix(z) >> 32 >= threshold { scale } else { 0.0 }
    }
}

/// SplitMix64's finalizer: a bijective mix whose outputs over consecutive counters pass
/// BigCrush.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Layer for Dropout {
    fn kind(&self) -> &'static str {
        "dropout"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        self.apply(pass, x, y, n);
    }

    /// Backward must get the forward pass's `seed` (one `Pass` per step): the mask is
    /// recomputed from it.
    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { pass, dy, n, .. } = cx;
        if let Some(dx) = dx {
            self.apply(pass, dy, dx, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(training: bool, seed: u64, threads: usize) -> Pass {
        Pass { training, seed, accumulate: false, threads }
    }

    #[test]
    fn drops_about_rate_and_keeps_the_mean() {
        let (n, row) = (64, 1000);
        let mut d = Dropout::new(0.25, 3, Shape(vec![row]));
        let x = vec![1.0f32; n * row];
        let mut y = vec![0.0; n * row];
        d.forward(Forward { pass: pass(true, 11, 2), x: &x, n }, &[], &mut [], &mut y);
        let dropped = y.iter().filter(|v| **v == 0.0).count() as f64 / y.len() as f64;
        assert!((dropped - 0.25).abs() < 0.01, "dropped {dropped}");
        let mean = y.iter().map(|v| f64::from(*v)).sum::<f64>() / y.len() as f64;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        assert!(y.iter().all(|v| *v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    }

    #[test]
    fn mask_depends_on_seed_and_salt_only() {
        let x: Vec<f32> = (0..600).map(|i| i as f32).collect();
        let run = |salt: u64, seed: u64, threads: usize| {
            let mut y = vec![0.0; x.len()];
            Dropout::new(0.5, salt, Shape(vec![100])).forward(
                Forward { pass: pass(true, seed, threads), x: &x, n: 6 },
                &[],
                &mut [],
                &mut y,
            );
            y
        };
        assert_eq!(run(1, 5, 1), run(1, 5, 2));
        assert_ne!(run(1, 5, 1), run(1, 6, 1));
        assert_ne!(run(1, 5, 1), run(2, 5, 1));
    }

    #[test]
    fn inference_is_the_identity() {
        let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let mut y = vec![0.0; 20];
        Dropout::new(0.9, 0, Shape(vec![10])).forward(
            Forward { pass: pass(false, 1, 2), x: &x, n: 2 },
            &[],
            &mut [],
            &mut y,
        );
        assert_eq!(x, y);
    }
}

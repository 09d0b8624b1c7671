//! Global-norm gradient clipping, Keras's `global_clipnorm`: every gradient is scaled by
//! `min(1, clip_norm / ‖g‖)`, `‖g‖` the L2 norm of the whole flat gradient buffer, before the
//! update.
//!
//! The norm is summed in f64 over the fixed chunks the optimizers use, in lanes of fixed
//! order, and the chunk sums are combined in chunk order: the same bits on any thread count.

use super::CHUNK;
use rayon::prelude::*;

/// f64 partial sums per chunk: enough to keep the adds vectorized in a fixed order.
const LANES: usize = 8;

/// Values of a chunk summed at a time by [`global_norm_of_sum`]: a stack block that stays in
/// L1, a multiple of [`LANES`] so lanes see the same values as in [`global_norm`].
const SUM_BLOCK: usize = 1 << 10;

/// `‖grads‖₂`, accumulated in f64.
pub fn global_norm(grads: &[f32]) -> f64 {
    let sums: Vec<f64> = grads
        .par_chunks(CHUNK)
        .map(|c| {
            crate::engine::simd::vectorized(
                #[inline(always)]
                || {
                    let mut acc = [0.0f64; LANES];
                    add_squares(&mut acc, c);
                    acc.iter().sum::<f64>()
                },
            )
        })
        .collect();
    sums.iter().sum::<f64>().sqrt()
}

/// `‖Σ grads‖₂` of equally long buffers summed elementwise in buffer order, the sum never
/// stored: the same bits as [`global_norm`] of a summed copy (mirrored's two replicas used to
/// copy the 3.2 MB GPT gradient and add the other into it on one thread, every step).
pub fn global_norm_of_sum(grads: &[&[f32]]) -> f64 {
    let (first, rest) = match grads {
        [] => return 0.0,
        [g] => return global_norm(g),
        [first, rest @ ..] => (first, rest),
    };
    let sums: Vec<f64> = first
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(c, chunk)| {
            crate::engine::simd::vectorized(
                #[inline(always)]
                || {
                    let (mut acc, mut sum) = ([0.0f64; LANES], [0.0f32; SUM_BLOCK]);
                    for (b, block) in chunk.chunks(SUM_BLOCK).enumerate() {
                        let (from, sum) = (c * CHUNK + b * SUM_BLOCK, &mut sum[..block.len()]);
                        sum.copy_from_slice(block);
                        for g in rest {
                            sum.iter_mut().zip(&g[from..from + block.len()]).for_each(|(s, v)| *s += v);
                        }
                        add_squares(&mut acc, sum);
                    }
                    acc.iter().sum::<f64>()
                },
            )
        })
        .collect();
    sums.iter().sum::<f64>().sqrt()
}

/// Adds the squares of `values` into `acc`, value `i` into lane `i mod LANES` (the values
/// past the last whole lane group into the first lanes).
#[inline(always)]
fn add_squares(acc: &mut [f64; LANES], values: &[f32]) {
    let mut it = values.chunks_exact(LANES);
    for part in &mut it {
        for j in 0..LANES {
            acc[j] += f64::from(part[j]) * f64::from(part[j]);
        }
    }
    for (a, g) in acc.iter_mut().zip(it.remainder()) {
        *a += f64::from(*g) * f64::from(*g);
    }
}

/// What gradients of global norm `norm` are multiplied by: `clip_norm / norm` when the norm
/// is finite and above `clip_norm`, else 1 (see [`clip_by_global_norm`]).
pub(super) fn clip_scale(norm: f64, clip_norm: f32) -> f32 {
    let clip = f64::from(clip_norm);
    if norm.is_finite() && norm > clip { (clip / norm) as f32 } else { 1.0 }
}

/// Scales `grads` by `min(1, clip_norm / ‖grads‖)` and returns `‖grads‖` before clipping.
///
/// A non-finite norm leaves the gradients as they are (scaling by `c / ∞ = 0` would hide a
/// NaN or overflow from the caller's non-finite check, which should stop training instead).
pub fn clip_by_global_norm(grads: &mut [f32], clip_norm: f32) -> f64 {
    let norm = global_norm(grads);
    let scale = clip_scale(norm, clip_norm);
    if scale != 1.0 {
        grads.par_chunks_mut(CHUNK).for_each(|c| {
            crate::engine::simd::vectorized(
                #[inline(always)]
                || {
                    for g in c.iter_mut() {
                        *g *= scale;
                    }
                },
            );
        });
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_norm_of_a_sum_is_the_norm_of_the_summed_copy() {
        // Over two chunks and a ragged end, so blocks and lanes cross every boundary.
        let len = CHUNK + SUM_BLOCK + 13;
        let bufs: Vec<Vec<f32>> =
            (0..3).map(|b| (0..len).map(|i| ((i * (b + 3)) % 17) as f32 * 0.1 - 0.8).collect()).collect();
        for n in 1..=3 {
            let refs: Vec<&[f32]> = bufs[..n].iter().map(Vec::as_slice).collect();
            let mut sum = bufs[0].clone();
            for g in &bufs[1..n] {
                sum.iter_mut().zip(g).for_each(|(s, v)| *s += v);
            }
            assert_eq!(global_norm_of_sum(&refs).to_bits(), global_norm(&sum).to_bits(), "{n} buffers");
        }
        assert_eq!(global_norm_of_sum(&[]), 0.0);
    }

    #[test]
    fn clips_to_the_norm_and_leaves_small_gradients_alone() {
        // ‖(3, 4)‖ = 5: clipped to norm 1 → (0.6, 0.8).
        let mut g = vec![3.0, 4.0];
        assert_eq!(clip_by_global_norm(&mut g, 1.0), 5.0);
        assert!((g[0] - 0.6).abs() < 1e-7 && (g[1] - 0.8).abs() < 1e-7, "{g:?}");
        let mut g = vec![3.0, 4.0];
        assert_eq!(clip_by_global_norm(&mut g, 5.0), 5.0);
        assert_eq!(g, [3.0, 4.0]);
        let mut g = vec![f32::NAN, 1.0];
        assert!(clip_by_global_norm(&mut g, 1.0).is_nan());
        assert_eq!(g[1], 1.0);
    }

    #[test]
    fn the_norm_spans_chunks_and_does_not_depend_on_threads() {
        let len = 3 * CHUNK + 11;
        let g: Vec<f32> = (0..len).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
        let want = g.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt();
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| global_norm(&g))
        };
        let one = on(1);
        assert!((one - want).abs() <= 1e-12 * want, "{one} vs {want}");
        assert_eq!(one.to_bits(), on(3).to_bits());
        let mut clipped = g.clone();
        clip_by_global_norm(&mut clipped, 1.0);
        assert!((global_norm(&clipped) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn the_optimizer_clips_the_reduced_gradient_once() {
        use crate::engine::optimizer::{Adam, Optimizer, Sgd};
        // Two replicas' halves of a gradient of norm 10: the sum is clipped, not each half.
        let (a, b) = (vec![3.0f32, 0.0], vec![3.0f32, 8.0]);
        for make in [
            || Optimizer::Sgd(Sgd::new(2, 0.9, false, 0.0)),
            || Optimizer::Adam(Adam::new(2, 0.9, 0.99, 1e-7, 0.1, true)),
        ] {
            let mut split = make().with_clip_norm(Some(1.0));
            let mut whole = make();
            let (mut p1, mut p2) = (vec![0.5f32, -0.5], vec![0.5f32, -0.5]);
            for _ in 0..3 {
                split.step_sum(&mut p1, &[&a, &b], 0.1);
                whole.step(&mut p2, &[0.6, 0.8], 0.1);
            }
            assert_eq!(p1, p2, "clipping the sum of (3, 0) and (3, 8) gives (0.6, 0.8)");
            assert_eq!(split.clip_norm(), Some(1.0));
        }
        // One buffer is scaled inside the update, not copied and scaled first: the same bits
        // as the update of the clipped buffer, over several chunks, above and below the norm.
        let len = 2 * CHUNK + 9;
        let g: Vec<f32> = (0..len).map(|i| ((i * 29) % 97) as f32 / 97.0 - 0.4).collect();
        for clip in [0.5f32, 1e4] {
            let mut clipped = g.clone();
            clip_by_global_norm(&mut clipped, clip);
            assert_eq!(clipped == g, clip > 1.0, "only the small clip norm scales");
            for make in [
                || Optimizer::Sgd(Sgd::new(2 * CHUNK + 9, 0.9, false, 0.01)),
                || Optimizer::Adam(Adam::new(2 * CHUNK + 9, 0.9, 0.99, 1e-7, 0.1, true)),
            ] {
                let (mut inside, mut first) = (make().with_clip_norm(Some(clip)), make());
                let (mut p1, mut p2) = (vec![0.5f32; len], vec![0.5f32; len]);
                for _ in 0..2 {
                    inside.step(&mut p1, &g, 0.1);
                    first.step(&mut p2, &clipped, 0.1);
                }
                assert_eq!(p1, p2);
            }
        }
        // The fused SGD step applies each layer's gradient as it is made: never with clipping.
        assert!(Optimizer::Sgd(Sgd::new(1, 0.9, false, 0.0)).with_clip_norm(Some(1.0)).fused(0.1).is_none());
        assert!(Optimizer::Sgd(Sgd::new(1, 0.9, false, 0.0)).fused(0.1).is_some());
    }
}

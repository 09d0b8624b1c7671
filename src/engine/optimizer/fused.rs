//! SGD applied inside backward, where each gradient is made (`Sequential::backward_update`).
//!
//! With one replica and nothing else reading the gradient (no all-reduce, no accumulation), a
//! layer can update its weights as soon as its own backward is done: the big dense kernel's
//! gradient product then writes straight into the weights (plain SGD: `w = 1·w − lr·xᵀdz`) or
//! into the velocity (momentum: `v = m·v − lr·xᵀdz`), so its gradient, 11 MB in the tutorial
//! model, is never written and read again. Other layers store their small gradient in a
//! scratch slice and apply the optimizer's own arithmetic to it ([`SgdRule::apply`]), so their
//! results are the unfused path's bits.

use super::SgdRule;
use super::{CHUNK, for_chunks};
use rayon::prelude::*;
use std::ops::Range;

/// One step's update over the whole arena, handed out layer by layer.
#[derive(Debug)]
pub struct FusedStep<'a> {
    rule: SgdRule,
    velocity: Option<&'a mut [f32]>,
}

impl<'a> FusedStep<'a> {
    pub(super) fn new(rule: SgdRule, velocity: Option<&'a mut [f32]>) -> Self {
        Self { rule, velocity }
    }

    /// The update of arena `range` (one layer's parameters).
    pub fn slice(&mut self, range: Range<usize>) -> SliceStep<'_> {
        SliceStep { rule: self.rule, velocity: self.velocity.as_deref_mut().map(|v| &mut v[range]) }
    }
}

/// The update of one slice of the arena.
#[derive(Debug)]
pub struct SliceStep<'a> {
    rule: SgdRule,
    velocity: Option<&'a mut [f32]>,
}

impl SliceStep<'_> {
    /// The update of `range` within this slice (a layer's kernel or bias).
    pub fn sub(&mut self, range: Range<usize>) -> SliceStep<'_> {
        SliceStep { rule: self.rule, velocity: self.velocity.as_deref_mut().map(|v| &mut v[range]) }
    }

    /// The updates of `ranges` within this slice (increasing and disjoint), one per thread.
    pub fn split(&mut self, ranges: &[Range<usize>]) -> Vec<SliceStep<'_>> {
        let rule = self.rule;
        let Some(mut rest) = self.velocity.as_deref_mut() else {
            return ranges.iter().map(|_| SliceStep { rule, velocity: None }).collect();
        };
        let mut at = 0;
        ranges
            .iter()
            .map(|r| {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - at);
                let (head, tail) = tail.split_at_mut(r.len());
                (rest, at) = (tail, r.end);
                SliceStep { rule, velocity: Some(head) }
            })
            .collect()
    }

    /// Applies the update from a stored gradient, with the optimizer's own arithmetic.
    pub fn apply(&mut self, params: &mut [f32], grads: &[f32]) {
        self.apply_sum(params, &[grads]);
    }

    /// Applies the update from the sum of several replicas' stored gradients, added in order
    /// inside the pass as [`crate::engine::Optimizer::step_sum`] adds them: the same bits.
    pub fn apply_sum(&mut self, params: &mut [f32], grads: &[&[f32]]) {
        let rule = self.rule;
        let velocity = self.velocity.as_deref_mut().unwrap_or_default();
        for_chunks(params, grads, 1.0, velocity, &mut [], |_, p, g, v, _| rule.apply(p, g, v));
    }

    /// Applies the update with a gradient `g` that only `product` computes: it must write
    /// `target = keep·target + scale·g` (gemm's own scaling, as [`crate::engine::strided::gemm_scaled`]
    /// does). Plain SGD makes the weights the target; momentum makes the velocity the target,
    /// then adds it to the weights. Weight decay folds into `keep` (SGD) or one more term of
    /// that pass (momentum). The gradient's rounding into f32 is skipped, so the bits differ
    /// from the unfused update by rounding only.
    pub fn apply_product(&mut self, params: &mut [f32], product: impl FnOnce(&mut [f32], Option<f32>, f32)) {
        let SgdRule { lr, momentum, weight_decay: wd, .. } = self.rule;
        let Some(v) = self.velocity.as_deref_mut() else {
            // w − lr·(g + wd·w) = (1 − lr·wd)·w − lr·g
            product(params, Some(1.0 - lr * wd), -lr);
            return;
        };
        product(v, Some(momentum), -lr);
        params.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)).for_each(|(p, v)| {
            crate::engine::simd::vectorized(|| {
                if wd == 0.0 {
                    p.iter_mut().zip(v.iter()).for_each(|(p, v)| *p += v);
                    return;
                }
                for (p, v) in p.iter_mut().zip(v.iter_mut()) {
                    *v -= lr * wd * *p;
                    *p += *v;
                }
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::optimizer::{Optimizer, Sgd};

    /// `product` for a gradient `g` already in hand: `target = keep·target + scale·g`.
    fn product(g: &[f32]) -> impl FnOnce(&mut [f32], Option<f32>, f32) + '_ {
        move |t, keep, scale| t.iter_mut().zip(g).for_each(|(t, g)| *t = keep.unwrap_or(0.0) * *t + scale * g)
    }

    #[test]
    fn fused_updates_match_the_optimizer_within_rounding() {
        let len = 3 * super::CHUNK + 5;
        let g: Vec<f32> = (0..len).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
        for (momentum, wd) in [(0.0, 0.0), (0.0, 0.01), (0.9, 0.0), (0.9, 0.01)] {
            let (mut a, mut b) = (
                Optimizer::Sgd(Sgd::new(len, momentum, false, wd)),
                Optimizer::Sgd(Sgd::new(len, momentum, false, wd)),
            );
            let (mut pa, mut pb) = (vec![0.5f32; len], vec![0.5f32; len]);
            for _ in 0..3 {
                a.step(&mut pa, &g, 0.1);
                let mut fused = b.fused(0.1).unwrap();
                let (head, tail) = pb.split_at_mut(7);
                fused.slice(0..7).apply(head, &g[..7]);
                fused.slice(7..len).apply_product(tail, product(&g[7..]));
            }
            assert_eq!(pa[..7], pb[..7], "stored gradients take the optimizer's own bits");
            let worst = pa.iter().zip(&pb).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-6, "momentum {momentum}, weight decay {wd}: off by {worst}");
            assert_eq!(a.iterations(), b.iterations());
        }
    }

    #[test]
    fn only_plain_and_classic_momentum_sgd_fuse() {
        assert!(Optimizer::Sgd(Sgd::new(1, 0.9, true, 0.0)).fused(0.1).is_none());
        let adam = crate::engine::optimizer::Adam::new(1, 0.9, 0.999, 1e-7, 0.0, false);
        assert!(Optimizer::Adam(adam).fused(0.1).is_none());
    }

    #[test]
    fn step_sum_equals_summing_first() {
        let len = 2 * super::CHUNK + 3000;
        let grads: Vec<Vec<f32>> =
            (0..3).map(|r| (0..len).map(|i| ((i * 7 + r * 13) as f32 * 0.37).sin() * 1e-2).collect()).collect();
        for momentum in [0.0, 0.9] {
            let mut sum = grads[0].clone();
            for g in &grads[1..] {
                sum.iter_mut().zip(g).for_each(|(s, v)| *s += v);
            }
            let (mut a, mut b) = (
                Optimizer::Sgd(Sgd::new(len, momentum, true, 0.0)),
                Optimizer::Sgd(Sgd::new(len, momentum, true, 0.0)),
            );
            let (mut pa, mut pb) = (vec![1.0f32; len], vec![1.0f32; len]);
            let refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            for _ in 0..2 {
                a.step(&mut pa, &sum, 0.05);
                b.step_sum(&mut pb, &refs, 0.05);
            }
            assert!(pa == pb, "the fused sum must be bit-identical to reduce-then-update");
            assert_eq!(a.state(), b.state());
        }
    }
}

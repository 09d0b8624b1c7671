//! Adam as Keras computes it, and AdamW (decoupled weight decay, Loshchilov & Hutter).
//!
//! Weight decay applies to the whole arena, or only to given ranges of it (GPT's recipe
//! leaves biases, normalization weights and embeddings undecayed; the caller maps Keras's
//! `exclude_from_weight_decay` name patterns to ranges).

use super::for_chunks;
use std::ops::Range;

/// Adam / AdamW.
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    /// First-moment decay.
    pub beta_1: f32,
    /// Second-moment decay.
    pub beta_2: f32,
    /// Added to the denominator.
    pub epsilon: f32,
    /// Weight decay: L2 added to the gradient (Adam) or applied to the weights (AdamW).
    pub weight_decay: f32,
    /// Decay the weights directly (AdamW) instead of through the gradient.
    pub decoupled: bool,
    /// First moments.
    pub m: Vec<f32>,
    /// Second moments.
    pub v: Vec<f32>,
    /// Updates applied so far.
    pub iterations: u64,
    /// Arena ranges weight decay applies to, sorted and disjoint; `None`: all of it.
    pub decay_ranges: Option<Vec<Range<usize>>>,
    /// Global-norm clipping of the whole gradient before the update (see `clip.rs`).
    pub clip_norm: Option<f32>,
}

impl Adam {
    /// Adam (or AdamW when `decoupled`) for `len` parameters.
    pub fn new(len: usize, beta_1: f32, beta_2: f32, epsilon: f32, weight_decay: f32, decoupled: bool) -> Self {
        Self {
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
            decoupled,
            m: vec![0.0; len],
            v: vec![0.0; len],
            iterations: 0,
            decay_ranges: None,
            clip_norm: None,
        }
    }

    /// The same optimizer decaying only the values in `ranges` (any order; overlaps merge).
    pub fn with_decay_ranges(self, mut ranges: Vec<Range<usize>>) -> Self {
        ranges.retain(|r| !r.is_empty());
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Self { decay_ranges: Some(merged), ..self }
    }

    /// One update from the sum of `grads` (one buffer per replica, added in order).
    pub(super) fn step(&mut self, params: &mut [f32], grads: &[&[f32]], lr: f32, scale: f32) {
        self.iterations += 1;
        let (b1, b2, eps, wd, decoupled) = (self.beta_1, self.beta_2, self.epsilon, self.weight_decay, self.decoupled);
        let t = self.iterations as i32;
        // Keras folds the bias corrections into the step size.
        let alpha = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        let decay = self.decay_ranges.as_deref();
        for_chunks(params, grads, scale, &mut self.m, &mut self.v, |offset, p, g, m, v| {
            for (span, decays) in segments(decay, offset..offset + p.len()) {
                let local = span.start - offset..span.end - offset;
                let wd = if decays { wd } else { 0.0 };
                let (p, g, m, v) = (&mut p[local.clone()], &g[local.clone()], &mut m[local.clone()], &mut v[local]);
                crate::engine::simd::vectorized(
                    #[inline(always)]
                    || {
                        for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                            let g = if decoupled {
                                *p -= lr * wd * *p;
                                *g
                            } else {
                                g + wd * *p
                            };
                            *m += (g - *m) * (1.0 - b1);
                            *v += (g * g - *v) * (1.0 - b2);
                            *p -= alpha * *m / (v.sqrt() + eps);
                        }
                    },
                )
            }
        });
    }
}

/// `span` cut at the edges of `decay` (sorted, disjoint), each piece with whether it decays.
fn segments(decay: Option<&[Range<usize>]>, span: Range<usize>) -> Vec<(Range<usize>, bool)> {
    let Some(decay) = decay else { return vec![(span, true)] };
    let mut out = Vec::new();
    let mut at = span.start;
    for r in decay.iter().filter(|r| r.end > span.start && r.start < span.end) {
        let (start, end) = (r.start.max(span.start), r.end.min(span.end));
        if start > at {
            out.push((at..start, false));
        }
        out.push((start..end, true));
        at = end;
    }
    if at < span.end {
        out.push((at..span.end, false));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_weight_by_about_lr() {
        // With bias correction, Adam's first update is lr · g/|g|.
        let mut adam = Adam::new(3, 0.9, 0.999, 1e-7, 0.0, false);
        let mut p = vec![1.0, 1.0, 1.0];
        adam.step(&mut p, &[&[0.5, -2.0, 0.0]], 0.1, 1.0);
        assert!((p[0] - 0.9).abs() < 1e-4 && (p[1] - 1.1).abs() < 1e-4 && p[2] == 1.0, "{p:?}");
    }

    #[test]
    fn decay_ranges_decay_only_their_values() {
        // Values 1..3 and 5 decay; with a zero gradient only decay moves a weight.
        let mut adam = Adam::new(7, 0.9, 0.999, 1e-7, 0.1, true).with_decay_ranges(vec![5..6, 1..2, 2..3]);
        assert_eq!(adam.decay_ranges, Some(vec![1..3, 5..6]));
        let mut p = vec![2.0; 7];
        adam.step(&mut p, &[&[0.0; 7]], 0.5, 1.0);
        let d = 2.0 * (1.0 - 0.05);
        assert_eq!(p, [2.0, d, d, 2.0, 2.0, d, 2.0]);
        // Coupled (L2) decay honours the ranges too: undecayed values with no gradient stay.
        let mut adam = Adam::new(3, 0.9, 0.999, 1e-7, 0.1, false).with_decay_ranges(std::iter::once(0..1).collect());
        let mut p = vec![2.0; 3];
        adam.step(&mut p, &[&[0.0; 3]], 0.5, 1.0);
        assert!(p[0] < 2.0 && p[1] == 2.0 && p[2] == 2.0, "{p:?}");
    }

    #[test]
    fn segments_cover_chunks_that_ranges_cross() {
        let decay = [3..5, 8..20];
        assert_eq!(segments(Some(&decay), 0..10), vec![(0..3, false), (3..5, true), (5..8, false), (8..10, true)]);
        assert_eq!(segments(Some(&decay), 10..12), vec![(10..12, true)]);
        assert_eq!(segments(Some(&decay), 20..22), vec![(20..22, false)]);
        assert_eq!(segments(None, 4..6), vec![(4..6, true)]);
        // A range crossing a chunk edge decays on both sides (chunks are CHUNK values).
        let len = super::super::CHUNK + 10;
        let mut adam =
            Adam::new(len, 0.9, 0.999, 1e-7, 0.1, true).with_decay_ranges(std::iter::once(len - 20..len - 5).collect());
        let mut p = vec![1.0; len];
        adam.step(&mut p, &[&vec![0.0; len]], 1.0, 1.0);
        let decayed: Vec<usize> = (0..len).filter(|&i| p[i] < 1.0).collect();
        assert_eq!(decayed, (len - 20..len - 5).collect::<Vec<_>>());
    }

    #[test]
    fn adamw_decays_weights_without_gradient() {
        let mut adam = Adam::new(1, 0.9, 0.999, 1e-7, 0.1, true);
        let mut p = vec![2.0];
        adam.step(&mut p, &[&[0.0]], 0.5, 1.0);
        assert!((p[0] - 2.0 * (1.0 - 0.05)).abs() < 1e-6, "{p:?}");
    }
}

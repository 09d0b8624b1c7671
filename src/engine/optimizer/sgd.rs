//! SGD as Keras computes it: `v = momentum·v − lr·g; w += v` (Nesterov: `w += momentum·v − lr·g`).

use super::for_chunks;

/// Stochastic gradient descent.
#[derive(Debug, Clone, PartialEq)]
pub struct Sgd {
    /// Momentum (0 disables the velocity buffer).
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty added to the gradient: `g + weight_decay·w`.
    pub weight_decay: f32,
    /// Velocity, one per parameter, when momentum is on.
    pub velocity: Option<Vec<f32>>,
    /// Updates applied so far.
    pub iterations: u64,
    /// Global-norm clipping of the whole gradient before the update (see `clip.rs`).
    pub clip_norm: Option<f32>,
}

impl Sgd {
    /// SGD for `len` parameters.
    pub fn new(len: usize, momentum: f32, nesterov: bool, weight_decay: f32) -> Self {
        let velocity = (momentum > 0.0).then(|| vec![0.0; len]);
        Self { momentum, nesterov, weight_decay, velocity, iterations: 0, clip_norm: None }
    }

    /// One update from the sum of `grads` (one buffer per replica, added in order).
    pub(super) fn step(&mut self, params: &mut [f32], grads: &[&[f32]], lr: f32, scale: f32) {
        let rule = self.rule(lr);
        let velocity = self.velocity.as_deref_mut().unwrap_or_default();
        for_chunks(params, grads, scale, velocity, &mut [], |_, p, g, v, _| rule.apply(p, g, v));
        self.iterations += 1;
    }

    /// The update's arithmetic at learning rate `lr`.
    pub(super) fn rule(&self, lr: f32) -> SgdRule {
        SgdRule { lr, momentum: self.momentum, nesterov: self.nesterov, weight_decay: self.weight_decay }
    }
}

/// SGD's arithmetic, shared by the optimizer pass and fused updates so both round alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdRule {
    pub(super) lr: f32,
    pub(super) momentum: f32,
    pub(super) nesterov: bool,
    pub(super) weight_decay: f32,
}

impl SgdRule {
    /// Updates `p` (and the velocity `v`, empty without momentum) from the gradient `g`.
    pub fn apply(&self, p: &mut [f32], g: &[f32], v: &mut [f32]) {
        let SgdRule { lr, momentum: m, nesterov, weight_decay: wd } = *self;
        crate::engine::simd::vectorized(|| {
            if v.is_empty() {
                p.iter_mut().zip(g).for_each(|(p, g)| *p -= lr * (g + wd * *p));
                return;
            }
            for ((p, g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
                let g = g + wd * *p;
                *v = m * *v - lr * g;
                *p += if nesterov { m * *v - lr * g } else { *v };
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[f32], want: &[f32]) {
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6) && got.len() == want.len(),
            "got {got:?}, want {want:?}"
        );
    }

    /// Three steps of a constant gradient `g` on one weight starting at 1, learning rate 0.1.
    fn three_steps(mut sgd: Sgd, g: f32) -> Vec<f32> {
        let mut p = vec![1.0];
        (0..3)
            .map(|_| {
                sgd.step(&mut p, &[&[g]], 0.1, 1.0);
                p[0]
            })
            .collect()
    }

    #[test]
    fn plain_sgd_steps_against_the_gradient() {
        let sgd = Sgd::new(1, 0.0, false, 0.0);
        assert!(sgd.velocity.is_none());
        close(&three_steps(sgd, 0.5), &[0.95, 0.9, 0.85]);
    }

    #[test]
    fn momentum_matches_hand_computed_values() {
        // v1 = −0.1, w = 0.9; v2 = 0.9·v1 − 0.1 = −0.19, w = 0.71; v3 = −0.271, w = 0.439.
        close(&three_steps(Sgd::new(1, 0.9, false, 0.0), 1.0), &[0.9, 0.71, 0.439]);
    }

    #[test]
    fn nesterov_matches_hand_computed_values() {
        // w += 0.9·v − 0.1·g: v1 = −0.1 → w = 1 − 0.19; v2 = −0.19 → w −= 0.271;
        // v3 = −0.271 → w −= 0.3439.
        close(&three_steps(Sgd::new(1, 0.9, true, 0.0), 1.0), &[0.81, 0.539, 0.1951]);
    }

    #[test]
    fn weight_decay_adds_l2_to_the_gradient() {
        // g' = g + 0.1·w: 2 − 0.5·(0 + 0.2) = 1.9, and through momentum on the next step:
        // v1 = −0.1, v2 = 0.9·v1 − 0.5·0.19 = −0.185.
        let mut sgd = Sgd::new(1, 0.0, false, 0.1);
        let mut p = vec![2.0];
        sgd.step(&mut p, &[&[0.0]], 0.5, 1.0);
        close(&p, &[1.9]);
        let mut sgd = Sgd::new(1, 0.9, false, 0.1);
        let mut p = vec![2.0];
        sgd.step(&mut p, &[&[0.0]], 0.5, 1.0);
        sgd.step(&mut p, &[&[0.0]], 0.5, 1.0);
        close(&p, &[2.0 - 0.1 - 0.185]);
        assert_eq!(sgd.iterations, 2);
    }

    #[test]
    fn every_chunk_gets_the_same_update() {
        // More values than one parallel chunk holds.
        let len = 3 * super::super::CHUNK + 7;
        let mut sgd = Sgd::new(len, 0.9, true, 0.01);
        let mut p = vec![1.0; len];
        let g = vec![0.5; len];
        sgd.step(&mut p, &[&g], 0.1, 1.0);
        sgd.step(&mut p, &[&g], 0.1, 1.0);
        assert!(p.iter().all(|v| *v == p[0]));
        assert!(sgd.velocity.is_some_and(|v| v.iter().all(|x| *x == v[0])));
    }
}

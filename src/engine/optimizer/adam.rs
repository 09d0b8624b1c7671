//! Adam as Keras computes it, and AdamW (decoupled weight decay, Loshchilov & Hutter).

use super::for_chunks;

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
}

impl Adam {
    /// Adam (or AdamW when `decoupled`) for `len` parameters.
    pub fn new(len: usize, beta_1: f32, beta_2: f32, epsilon: f32, weight_decay: f32, decoupled: bool) -> Self {
        Self { beta_1, beta_2, epsilon, weight_decay, decoupled, m: vec![0.0; len], v: vec![0.0; len], iterations: 0 }
    }

    /// One update from the sum of `grads` (one buffer per replica, added in order).
    pub(super) fn step(&mut self, params: &mut [f32], grads: &[&[f32]], lr: f32) {
        self.iterations += 1;
        let (b1, b2, eps, wd, decoupled) = (self.beta_1, self.beta_2, self.epsilon, self.weight_decay, self.decoupled);
        let t = self.iterations as i32;
        // Keras folds the bias corrections into the step size.
        let alpha = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        for_chunks(params, grads, &mut self.m, &mut self.v, |p, g, m, v| {
            crate::engine::simd::vectorized(|| {
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
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_weight_by_about_lr() {
        // With bias correction, Adam's first update is lr · g/|g|.
        let mut adam = Adam::new(3, 0.9, 0.999, 1e-7, 0.0, false);
        let mut p = vec![1.0, 1.0, 1.0];
        adam.step(&mut p, &[&[0.5, -2.0, 0.0]], 0.1);
        assert!((p[0] - 0.9).abs() < 1e-4 && (p[1] - 1.1).abs() < 1e-4 && p[2] == 1.0, "{p:?}");
    }

    #[test]
    fn adamw_decays_weights_without_gradient() {
        let mut adam = Adam::new(1, 0.9, 0.999, 1e-7, 0.1, true);
        let mut p = vec![2.0];
        adam.step(&mut p, &[&[0.0]], 0.5);
        assert!((p[0] - 2.0 * (1.0 - 0.05)).abs() < 1e-6, "{p:?}");
    }
}

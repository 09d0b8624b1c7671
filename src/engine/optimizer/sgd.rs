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
}

impl Sgd {
    /// SGD for `len` parameters.
    pub fn new(len: usize, momentum: f32, nesterov: bool, weight_decay: f32) -> Self {
        let velocity = (momentum > 0.0).then(|| vec![0.0; len]);
        Self {
            momentum,
            nesterov,
            weight_decay,
            velocity,
            iterations: 0,
        }
    }

    pub(super) fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f32) {
        let (m, nesterov, wd) = (self.momentum, self.nesterov, self.weight_decay);
        let velocity = self.velocity.as_deref_mut().unwrap_or_default();
        for_chunks(params, grads, velocity, &mut [], |p, g, v, _| {
            if v.is_empty() {
                p.iter_mut()
                    .zip(g)
                    .for_each(|(p, g)| *p -= lr * (g + wd * *p));
                return;
            }
            for ((p, g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
                let g = g + wd * *p;
                *v = m * *v - lr * g;
                *p += if nesterov { m * *v - lr * g } else { *v };
            }
        });
        self.iterations += 1;
    }
}

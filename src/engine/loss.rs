//! Losses (Keras's four) with their gradients, and the accuracy metric.
//!
//! Per-example losses are summed, and the gradient is scaled by `scale`: the caller passes
//! 1 / (examples in the whole global batch), so gradients summed over accumulation steps and
//! replicas give exactly the gradient of the global batch's mean loss.

use super::activation::sigmoid;
use crate::vocab::Loss;

/// Keras's `backend.epsilon()`: probabilities are clipped to `[EPS, 1 - EPS]`.
const EPS: f32 = 1e-7;

/// A loss as configured: which function, and whether the model outputs logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossFn {
    /// The function.
    pub kind: Loss,
    /// Outputs are logits (else probabilities).
    pub from_logits: bool,
}

/// Sums over a batch, for display and reduction across replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchStats {
    /// Sum of per-example losses.
    pub loss_sum: f64,
    /// Examples whose highest output is the label.
    pub correct: u64,
    /// Examples seen.
    pub examples: u64,
}

impl BatchStats {
    /// Adds another batch's sums.
    pub fn add(&mut self, other: BatchStats) {
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.examples += other.examples;
    }

    /// Mean loss (0 with no examples).
    pub fn loss(&self) -> f64 {
        if self.examples == 0 { 0.0 } else { self.loss_sum / self.examples as f64 }
    }

    /// Accuracy (0 with no examples).
    pub fn accuracy(&self) -> f64 {
        if self.examples == 0 { 0.0 } else { self.correct as f64 / self.examples as f64 }
    }
}

impl LossFn {
    /// Loss sums and accuracy for `out` (`labels.len()` rows of `classes`); when `grad` is
    /// given, writes `scale × dloss/dout` into it.
    pub fn evaluate(
        &self,
        out: &[f32],
        labels: &[u32],
        classes: usize,
        scale: f32,
        mut grad: Option<&mut [f32]>,
    ) -> BatchStats {
        let mut stats = BatchStats { examples: labels.len() as u64, ..BatchStats::default() };
        for (i, &label) in labels.iter().enumerate() {
            let row = &out[i * classes..(i + 1) * classes];
            let label = label as usize;
            if argmax(row) == label {
                stats.correct += 1;
            }
            let g = grad.as_deref_mut().map(|g| &mut g[i * classes..(i + 1) * classes]);
            stats.loss_sum += f64::from(self.example(row, label, scale, g));
        }
        stats
    }

    /// One example's loss; writes its scaled gradient into `g` when given.
    fn example(&self, row: &[f32], label: usize, scale: f32, g: Option<&mut [f32]>) -> f32 {
        let classes = row.len() as f32;
        let target = |j: usize| if j == label { 1.0f32 } else { 0.0 };
        match (self.kind, self.from_logits) {
            // Categorical cross-entropy against a one-hot label is the sparse one.
            (Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy, true) => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
                if let Some(g) = g {
                    for (j, (g, v)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * ((v - max).exp() / sum - target(j));
                    }
                }
                sum.ln() + max - row[label]
            }
            (Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy, false) => {
                // Keras renormalizes probabilities, then clips them.
                let sum: f32 = row.iter().sum::<f32>().max(f32::MIN_POSITIVE);
                let p = row[label] / sum;
                let clipped = p.clamp(EPS, 1.0 - EPS);
                if let Some(g) = g {
                    let inside = p == clipped;
                    for (j, g) in g.iter_mut().enumerate() {
                        // d(-ln(x_l / s))/dx_j = 1/s - [j = l]/x_l, zero where the clip holds.
                        let d =
                            if j == label { 1.0 / sum - 1.0 / row[label].max(f32::MIN_POSITIVE) } else { 1.0 / sum };
                        *g = if inside { scale * d } else { 0.0 };
                    }
                }
                -clipped.ln()
            }
            (Loss::BinaryCrossentropy, true) => {
                let mut loss = 0.0;
                for (j, &z) in row.iter().enumerate() {
                    loss += z.max(0.0) - z * target(j) + (-z.abs()).exp().ln_1p();
                }
                if let Some(g) = g {
                    for (j, (g, &z)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * (sigmoid(z) - target(j)) / classes;
                    }
                }
                loss / classes
            }
            (Loss::BinaryCrossentropy, false) => {
                let mut loss = 0.0;
                for (j, &p) in row.iter().enumerate() {
                    let q = p.clamp(EPS, 1.0 - EPS);
                    loss -= target(j) * q.ln() + (1.0 - target(j)) * (1.0 - q).ln();
                }
                if let Some(g) = g {
                    for (j, (g, &p)) in g.iter_mut().zip(row).enumerate() {
                        let q = p.clamp(EPS, 1.0 - EPS);
                        let d = (q - target(j)) / (q * (1.0 - q));
                        *g = if p == q { scale * d / classes } else { 0.0 };
                    }
                }
                loss / classes
            }
            (Loss::MeanSquaredError, _) => {
                if let Some(g) = g {
                    for (j, (g, &o)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * 2.0 * (o - target(j)) / classes;
                    }
                }
                row.iter().enumerate().map(|(j, o)| (o - target(j)).powi(2)).sum::<f32>() / classes
            }
        }
    }
}

/// Index of the largest value (the first on ties, as `tf.argmax`).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = j;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gradcheck::assert_close;

    const ALL: [Loss; 4] = [
        Loss::SparseCategoricalCrossentropy,
        Loss::CategoricalCrossentropy,
        Loss::BinaryCrossentropy,
        Loss::MeanSquaredError,
    ];

    #[test]
    fn every_loss_matches_finite_differences() {
        let labels = [2u32, 0, 1];
        let classes = 4;
        for kind in ALL {
            for from_logits in [true, false] {
                let f = LossFn { kind, from_logits };
                // Probabilities for the non-logit case: positive rows inside (0, 1).
                let out: Vec<f32> = (0..12)
                    .map(|i| if from_logits { (i as f32 * 0.37).sin() * 2.0 } else { 0.05 + 0.07 * (i % 5) as f32 })
                    .collect();
                let mut grad = vec![0.0; out.len()];
                f.evaluate(&out, &labels, classes, 1.0, Some(&mut grad));
                let loss = |o: &[f32]| f.evaluate(o, &labels, classes, 1.0, None).loss_sum;
                for i in 0..out.len() {
                    let h = 1e-2f32;
                    let (mut up, mut down) = (out.clone(), out.clone());
                    up[i] += h;
                    down[i] -= h;
                    let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(h));
                    assert_close(f64::from(grad[i]), numeric, 2e-2, &format!("{kind:?} logits={from_logits} [{i}]"));
                }
            }
        }
    }

    #[test]
    fn sparse_crossentropy_of_uniform_logits_is_ln_classes() {
        let f = LossFn { kind: Loss::SparseCategoricalCrossentropy, from_logits: true };
        let s = f.evaluate(&[0.0; 10], &[3], 10, 1.0, None);
        assert!((s.loss() - 10f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn accuracy_counts_argmax_hits() {
        let f = LossFn { kind: Loss::MeanSquaredError, from_logits: false };
        let s = f.evaluate(&[0.1, 0.9, 0.8, 0.2], &[1, 1], 2, 1.0, None);
        assert_eq!((s.correct, s.examples), (1, 2));
        assert_eq!(s.accuracy(), 0.5);
    }
}

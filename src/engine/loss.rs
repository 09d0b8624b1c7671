//! Losses (Keras's six) with their gradients, and the sums the metrics read.
//!
//! The outputs are rows of `width` values, compared with the [`Truth`]: one class index per
//! row (an image's class, or a language model's next token at one position), or `width` float
//! targets per row (regression). Per-row losses are summed, and the gradient is scaled by
//! `scale`: the caller passes 1 / (rows in the whole global batch), so gradients summed over
//! accumulation steps and replicas give exactly the gradient of the global batch's mean loss.
//! The loss fills its own sums (losses, examples); every metric observes each row for its own
//! ([`crate::metrics`]).

use super::activation::sigmoid;
use crate::metrics::{self, Label, Sums};
use crate::vocab::LossKind;

/// Keras's `backend.epsilon()`: probabilities are clipped to `[EPS, 1 - EPS]`.
const EPS: f32 = 1e-7;

/// A loss as configured: which function, and whether the model outputs logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossFn {
    /// The function.
    pub kind: LossKind,
    /// Outputs are logits (else probabilities).
    pub from_logits: bool,
}

/// Keras's default `delta` of the Huber loss.
const HUBER_DELTA: f32 = 1.0;

/// What the outputs are compared with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Truth<'a> {
    /// One class index per row of outputs.
    Classes(&'a [u32]),
    /// `width` float targets per row of outputs, row-major.
    Targets(&'a [f32]),
}

impl Truth<'_> {
    /// Rows of outputs these labels cover, for rows of `width` values.
    pub fn rows(&self, width: usize) -> usize {
        match self {
            Truth::Classes(labels) => labels.len(),
            Truth::Targets(values) => values.len().checked_div(width).unwrap_or(0),
        }
    }
}

/// One row's truth.
#[derive(Debug, Clone, Copy)]
enum RowTruth<'a> {
    Class(usize),
    Values(&'a [f32]),
}

impl RowTruth<'_> {
    /// The target value of output `j` (one-hot for a class).
    fn at(&self, j: usize) -> f32 {
        match self {
            RowTruth::Class(label) => {
                if j == *label {
                    1.0
                } else {
                    0.0
                }
            }
            RowTruth::Values(values) => values[j],
        }
    }
}

impl LossFn {
    /// The sums of `out` (`truth.rows(width)` rows of `width` values): the loss's, and every
    /// metric's from its rows; when `grad` is given, writes `scale × dloss/dout` into it.
    pub fn evaluate(
        &self,
        out: &[f32],
        truth: Truth<'_>,
        width: usize,
        scale: f32,
        mut grad: Option<&mut [f32]>,
    ) -> Sums {
        let rows = truth.rows(width);
        let mut sums = Sums::of_examples(rows);
        for i in 0..rows {
            let row = &out[i * width..(i + 1) * width];
            let target = match truth {
                Truth::Classes(labels) => {
                    let label = labels[i] as usize;
                    metrics::observe(row, Label::Class(label), &mut sums);
                    RowTruth::Class(label)
                }
                Truth::Targets(values) => {
                    let t = &values[i * width..(i + 1) * width];
                    metrics::observe(row, Label::Targets(t), &mut sums);
                    RowTruth::Values(t)
                }
            };
            let g = grad.as_deref_mut().map(|g| &mut g[i * width..(i + 1) * width]);
            sums.accumulate(metrics::loss::SUM, f64::from(self.example(row, target, scale, g)));
        }
        sums
    }

    /// One row's loss; writes its scaled gradient into `g` when given.
    fn example(&self, row: &[f32], target: RowTruth<'_>, scale: f32, g: Option<&mut [f32]>) -> f32 {
        let width = row.len() as f32;
        match (self.kind, self.from_logits) {
            // Categorical cross-entropy against a one-hot label is the sparse one; against float
            // targets both are `-Σ t·log softmax`.
            (LossKind::SparseCategoricalCrossentropy | LossKind::CategoricalCrossentropy, true) => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
                let total = match target {
                    RowTruth::Class(_) => 1.0,
                    RowTruth::Values(t) => t.iter().sum(),
                };
                if let Some(g) = g {
                    for (j, (g, v)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * ((v - max).exp() / sum * total - target.at(j));
                    }
                }
                match target {
                    RowTruth::Class(label) => sum.ln() + max - row[label],
                    RowTruth::Values(t) => t.iter().zip(row).map(|(t, v)| t * (sum.ln() + max - v)).sum(),
                }
            }
            (LossKind::SparseCategoricalCrossentropy | LossKind::CategoricalCrossentropy, false) => {
                probability_crossentropy(row, target, scale, g)
            }
            (LossKind::BinaryCrossentropy, true) => {
                let mut loss = 0.0;
                for (j, &z) in row.iter().enumerate() {
                    loss += z.max(0.0) - z * target.at(j) + (-z.abs()).exp().ln_1p();
                }
                if let Some(g) = g {
                    for (j, (g, &z)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * (sigmoid(z) - target.at(j)) / width;
                    }
                }
                loss / width
            }
            (LossKind::BinaryCrossentropy, false) => {
                let mut loss = 0.0;
                for (j, &p) in row.iter().enumerate() {
                    let q = p.clamp(EPS, 1.0 - EPS);
                    loss -= target.at(j) * q.ln() + (1.0 - target.at(j)) * (1.0 - q).ln();
                }
                if let Some(g) = g {
                    for (j, (g, &p)) in g.iter_mut().zip(row).enumerate() {
                        let q = p.clamp(EPS, 1.0 - EPS);
                        let d = (q - target.at(j)) / (q * (1.0 - q));
                        *g = if p == q { scale * d / width } else { 0.0 };
                    }
                }
                loss / width
            }
            (LossKind::MeanSquaredError, _) => {
                if let Some(g) = g {
                    for (j, (g, &o)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * 2.0 * (o - target.at(j)) / width;
                    }
                }
                row.iter().enumerate().map(|(j, o)| (o - target.at(j)).powi(2)).sum::<f32>() / width
            }
            (LossKind::MeanAbsoluteError, _) => {
                if let Some(g) = g {
                    for (j, (g, &o)) in g.iter_mut().zip(row).enumerate() {
                        // The subgradient 0 at equality, as TensorFlow's `sign`.
                        let e = o - target.at(j);
                        *g = if e == 0.0 { 0.0 } else { scale * e.signum() / width };
                    }
                }
                row.iter().enumerate().map(|(j, o)| (o - target.at(j)).abs()).sum::<f32>() / width
            }
            (LossKind::Huber, _) => {
                if let Some(g) = g {
                    for (j, (g, &o)) in g.iter_mut().zip(row).enumerate() {
                        *g = scale * (o - target.at(j)).clamp(-HUBER_DELTA, HUBER_DELTA) / width;
                    }
                }
                let huber = |e: f32| {
                    let a = e.abs();
                    if a <= HUBER_DELTA { 0.5 * a * a } else { HUBER_DELTA * (a - 0.5 * HUBER_DELTA) }
                };
                row.iter().enumerate().map(|(j, o)| huber(o - target.at(j))).sum::<f32>() / width
            }
        }
    }
}

/// Cross-entropy of probabilities (not logits), as Keras: renormalized, then clipped.
fn probability_crossentropy(row: &[f32], target: RowTruth<'_>, scale: f32, g: Option<&mut [f32]>) -> f32 {
    let sum: f32 = row.iter().sum::<f32>().max(f32::MIN_POSITIVE);
    match target {
        RowTruth::Class(label) => {
            let p = row[label] / sum;
            let clipped = p.clamp(EPS, 1.0 - EPS);
            if let Some(g) = g {
                let inside = p == clipped;
                for (j, g) in g.iter_mut().enumerate() {
                    // d(-ln(x_l / s))/dx_j = 1/s - [j = l]/x_l, zero where the clip holds.
                    let d = if j == label { 1.0 / sum - 1.0 / row[label].max(f32::MIN_POSITIVE) } else { 1.0 / sum };
                    *g = if inside { scale * d } else { 0.0 };
                }
            }
            -clipped.ln()
        }
        RowTruth::Values(t) => {
            // -Σ t_k ln(x_k / s); a term whose probability is clipped has no gradient.
            let inside = |k: usize| {
                let p = row[k] / sum;
                p == p.clamp(EPS, 1.0 - EPS)
            };
            if let Some(g) = g {
                let live: f32 = (0..row.len()).filter(|&k| inside(k)).map(|k| t[k]).sum();
                for (j, g) in g.iter_mut().enumerate() {
                    let own = if inside(j) { t[j] / row[j].max(f32::MIN_POSITIVE) } else { 0.0 };
                    *g = scale * (live / sum - own);
                }
            }
            -(0..row.len()).map(|k| t[k] * (row[k] / sum).clamp(EPS, 1.0 - EPS).ln()).sum::<f32>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gradcheck::assert_close;

    const ALL: [LossKind; 6] = [
        LossKind::SparseCategoricalCrossentropy,
        LossKind::CategoricalCrossentropy,
        LossKind::BinaryCrossentropy,
        LossKind::MeanSquaredError,
        LossKind::MeanAbsoluteError,
        LossKind::Huber,
    ];

    /// Checks `f`'s gradient at `out` against central differences of step `h`.
    fn check_gradient(f: LossFn, out: &[f32], truth: Truth<'_>, width: usize, h: f32) -> Sums {
        let mut grad = vec![0.0; out.len()];
        let stats = f.evaluate(out, truth, width, 1.0, Some(&mut grad));
        let loss = |o: &[f32]| f.evaluate(o, truth, width, 1.0, None).loss_sum();
        for i in 0..out.len() {
            let (mut up, mut down) = (out.to_vec(), out.to_vec());
            up[i] += h;
            down[i] -= h;
            let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(h));
            assert_close(f64::from(grad[i]), numeric, 2e-2, &format!("{:?} logits={} [{i}]", f.kind, f.from_logits));
        }
        stats
    }

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
                check_gradient(f, &out, Truth::Classes(&labels), classes, 1e-2);
            }
        }
    }

    #[test]
    fn sparse_crossentropy_of_uniform_logits_is_ln_classes() {
        let f = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
        let s = f.evaluate(&[0.0; 10], Truth::Classes(&[3]), 10, 1.0, None);
        assert!((s.loss() - 10f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn accuracy_counts_argmax_hits() {
        let f = LossFn { kind: LossKind::MeanSquaredError, from_logits: false };
        let s = f.evaluate(&[0.1, 0.9, 0.8, 0.2], Truth::Classes(&[1, 1]), 2, 1.0, None);
        assert_eq!((s.get(metrics::accuracy::CORRECT), s.examples()), (1.0, 2));
        assert_eq!(s.accuracy(), 0.5);
    }

    /// Float targets: soft labels for the cross-entropies (rows summing to 1, inside (0, 1) for
    /// the binary one), any values for the regression losses.
    #[test]
    fn every_loss_matches_finite_differences_on_float_targets() {
        let width = 3;
        let targets = [0.2f32, 0.5, 0.3, 0.6, 0.1, 0.3];
        for kind in ALL {
            for from_logits in [true, false] {
                let f = LossFn { kind, from_logits };
                let out: Vec<f32> = (0..6)
                    .map(|i| if from_logits { (i as f32 * 0.91).cos() * 1.7 } else { 0.1 + 0.13 * (i % 4) as f32 })
                    .collect();
                let s = check_gradient(f, &out, Truth::Targets(&targets), width, 1e-3);
                assert_eq!((s.examples(), s.get(metrics::accuracy::CORRECT)), (2, 0.0));
            }
        }
    }

    #[test]
    fn a_one_hot_target_row_is_the_class_label() {
        for kind in ALL {
            let f = LossFn { kind, from_logits: true };
            let out = [0.3f32, -1.2, 2.0, 0.1];
            let (mut a, mut b) = (vec![0.0; 4], vec![0.0; 4]);
            let by_class = f.evaluate(&out, Truth::Classes(&[2]), 4, 0.5, Some(&mut a));
            let by_values = f.evaluate(&out, Truth::Targets(&[0.0, 0.0, 1.0, 0.0]), 4, 0.5, Some(&mut b));
            assert!((by_class.loss_sum() - by_values.loss_sum()).abs() < 1e-6, "{kind:?}");
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-6, "{kind:?}: {a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn regression_losses_have_their_textbook_values() {
        let out = [1.0f32, 3.0];
        let t = [0.0f32, 0.5];
        let value =
            |kind| LossFn { kind, from_logits: false }.evaluate(&out, Truth::Targets(&t), 2, 1.0, None).loss_sum();
        assert!((value(LossKind::MeanSquaredError) - (1.0 + 6.25) / 2.0).abs() < 1e-6);
        assert!((value(LossKind::MeanAbsoluteError) - (1.0 + 2.5) / 2.0).abs() < 1e-6);
        // Huber: 0.5·1² below delta, 1·(2.5 - 0.5) above.
        assert!((value(LossKind::Huber) - (0.5 + 2.0) / 2.0).abs() < 1e-6);
    }

    /// Per-position labels are rows like any other: a batch of 2 sequences of 3 positions is 6
    /// rows, and the mean is over positions.
    #[test]
    fn sequence_labels_are_one_row_per_position() {
        let f = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
        let s = f.evaluate(&[0.0; 6 * 5], Truth::Classes(&[0, 1, 2, 3, 4, 0]), 5, 1.0, None);
        assert_eq!(s.examples(), 6);
        assert!((s.loss() - 5f64.ln()).abs() < 1e-6);
    }
}

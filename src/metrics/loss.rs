//! `loss`: the mean of the per-example losses. Its two sums, the losses and the examples,
//! are the loss function's own (`engine::loss`, the GPU's loss kernel): it fills them while
//! computing the gradient, so this metric observes no row itself. Every line and summary
//! writes it, and every mean of the other metrics is over its examples.

use super::{Metric, Reduction, Slot, SplitKind, Sums, metric::per_example};

/// Sum of per-example losses.
pub const SUM: Slot = Slot { index: 0, name: "loss_sum", reduction: Reduction::Sum };

/// Examples seen (rows of outputs: a language model's positions).
pub const EXAMPLES: Slot = Slot { index: 1, name: "examples", reduction: Reduction::Sum };

/// The mean loss (0 with no examples).
pub fn mean(sums: &Sums) -> f64 {
    per_example(sums, SUM)
}

/// Keras's `loss`.
pub struct Loss;

impl Metric for Loss {
    fn name(&self) -> &'static str {
        "loss"
    }

    fn reads(&self) -> &'static [Slot] {
        &[SUM, EXAMPLES]
    }

    fn value(&self, _split: SplitKind, sums: &Sums, _examples_per_s: f64) -> Option<f64> {
        Some(mean(sums))
    }

    fn always_written(&self) -> bool {
        true
    }
}

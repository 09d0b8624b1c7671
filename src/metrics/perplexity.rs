//! `perplexity`: `exp` of the mean cross-entropy (per position for a language model), the
//! number of equally likely tokens the model hesitates between. It owns no sums: it reads
//! the loss's. Written as `perplexity`/`val_perplexity` on lines and
//! `train_perplexity`/`test_perplexity` in the summary.

use super::{Metric, Needs, Slot, SplitKind, Sums, loss};

/// `exp(loss)`.
pub struct Perplexity;

impl Metric for Perplexity {
    fn name(&self) -> &'static str {
        "perplexity"
    }

    fn reads(&self) -> &'static [Slot] {
        &[loss::SUM, loss::EXAMPLES]
    }

    fn value(&self, _split: SplitKind, sums: &Sums, _examples_per_s: f64) -> Option<f64> {
        Some(loss::mean(sums).exp())
    }

    fn needs(&self) -> Needs {
        Needs::CrossEntropy("is exp of a cross-entropy")
    }
}

//! `accuracy`: the fraction of class rows whose highest output is the label (Keras's
//! `accuracy` on sparse labels). Rows with float targets count as examples but never as
//! correct. Every line and summary of a classifier writes it, listed or not; a regression
//! (float targets) has none, and listing it there is refused.

use super::{Label, Metric, Needs, Reduction, Slot, SplitKind, Sums, loss, metric::per_example};

/// Rows whose highest output is the label.
pub const CORRECT: Slot = Slot { index: 2, name: "correct", reduction: Reduction::Sum };

/// The fraction of examples predicted right (0 with no examples).
pub fn fraction(sums: &Sums) -> f64 {
    per_example(sums, CORRECT)
}

/// Keras's `accuracy`.
pub struct Accuracy;

impl Metric for Accuracy {
    fn name(&self) -> &'static str {
        "accuracy"
    }

    fn reads(&self) -> &'static [Slot] {
        &[CORRECT, loss::EXAMPLES]
    }

    fn observe(&self, row: &[f32], label: Label<'_>, sums: &mut Sums) {
        if let Label::Class(label) = label
            && argmax(row) == label
        {
            sums.accumulate(CORRECT, 1.0);
        }
    }

    fn value(&self, _split: SplitKind, sums: &Sums, _examples_per_s: f64) -> Option<f64> {
        Some(fraction(sums))
    }

    fn needs(&self) -> Needs {
        Needs::Classes("counts class predictions")
    }

    /// Written for every classifier, listed or not (as Keras); never for float targets, where
    /// no prediction is a class.
    fn always_written(&self) -> bool {
        true
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

    #[test]
    fn counts_class_rows_whose_first_highest_output_is_the_label() {
        let mut sums = Sums::of_examples(4);
        Accuracy.observe(&[0.1, 0.9], Label::Class(1), &mut sums);
        Accuracy.observe(&[0.8, 0.2], Label::Class(1), &mut sums);
        // Ties go to the first, as `tf.argmax`.
        Accuracy.observe(&[0.5, 0.5], Label::Class(0), &mut sums);
        Accuracy.observe(&[0.1, 0.9], Label::Targets(&[0.0, 1.0]), &mut sums);
        assert_eq!(sums.get(CORRECT), 2.0);
        assert_eq!(Accuracy.value(SplitKind::Test, &sums, 0.0), Some(0.5));
    }
}

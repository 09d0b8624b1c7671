//! `mae`: the mean absolute error of the outputs against float targets (Keras's `mae`): per
//! regression row the mean of `|output - target|` over its outputs, averaged over the rows.
//! Written as `mae`/`val_mae` on lines and `train_mae`/`test_mae` in the summary.

use super::{Label, Metric, Needs, Reduction, Slot, SplitKind, Sums, loss, metric::per_example};

/// Regression rows' mean absolute errors, summed.
pub const ABS_ERROR: Slot = Slot { index: 3, name: "abs_error_sum", reduction: Reduction::Sum };

/// Keras's `MeanAbsoluteError`.
pub struct Mae;

impl Metric for Mae {
    fn name(&self) -> &'static str {
        "mae"
    }

    fn reads(&self) -> &'static [Slot] {
        &[ABS_ERROR, loss::EXAMPLES]
    }

    fn observe(&self, row: &[f32], label: Label<'_>, sums: &mut Sums) {
        if let Label::Targets(targets) = label {
            let abs = row.iter().zip(targets).fold(0f64, |a, (&o, &t)| a + (f64::from(o) - f64::from(t)).abs());
            sums.accumulate(ABS_ERROR, abs / row.len() as f64);
        }
    }

    fn value(&self, _split: SplitKind, sums: &Sums, _examples_per_s: f64) -> Option<f64> {
        Some(per_example(sums, ABS_ERROR))
    }

    fn needs(&self) -> Needs {
        Needs::Targets("measures errors against float targets")
    }
}

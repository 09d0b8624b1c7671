//! `rmse`: the root of the mean squared error against float targets (Keras's
//! `RootMeanSquaredError`): per regression row the mean of `(output - target)²` over its
//! outputs, averaged over the rows, then the root. Written as `rmse`/`val_rmse` on lines and
//! `train_rmse`/`test_rmse` in the summary.

use super::{Label, Metric, Needs, Reduction, Slot, SplitKind, Sums, loss, metric::per_example};

/// Regression rows' mean squared errors, summed.
pub const SQUARED_ERROR: Slot = Slot { index: 4, name: "squared_error_sum", reduction: Reduction::Sum };

/// Keras's `RootMeanSquaredError`.
pub struct Rmse;

impl Metric for Rmse {
    fn name(&self) -> &'static str {
        "rmse"
    }

    fn reads(&self) -> &'static [Slot] {
        &[SQUARED_ERROR, loss::EXAMPLES]
    }

    fn observe(&self, row: &[f32], label: Label<'_>, sums: &mut Sums) {
        if let Label::Targets(targets) = label {
            let squared = row.iter().zip(targets).fold(0f64, |s, (&o, &t)| {
                let e = f64::from(o) - f64::from(t);
                s + e * e
            });
            sums.accumulate(SQUARED_ERROR, squared / row.len() as f64);
        }
    }

    fn value(&self, _split: SplitKind, sums: &Sums, _examples_per_s: f64) -> Option<f64> {
        Some(per_example(sums, SQUARED_ERROR).sqrt())
    }

    fn needs(&self) -> Needs {
        Needs::Targets("measures errors against float targets")
    }
}

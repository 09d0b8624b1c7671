//! [`Reading`]: the values of the metrics a spec lists, read over one span from the training
//! sums, the test split's (when evaluated) and the examples per second; the run folder
//! writes them under its own keys (`val_mae` on a line, `test_mae` in the summary).

use super::{Metric, ORDER, SplitKind, Sums, of};
use crate::vocab;

/// The listed metrics of one span, with what their values are read from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// The listed metrics not always written, in registration order ([`ORDER`]).
    listed: Vec<vocab::MetricKind>,
    /// The training batches' sums.
    train: Sums,
    /// The test split's sums, when evaluated.
    test: Option<Sums>,
    /// Training examples per second over the span.
    examples_per_s: f64,
}

impl Reading {
    /// The metrics of `listed` beyond those always written, over a span whose training
    /// batches summed to `train` at `examples_per_s`, and whose evaluation found `test`.
    pub fn new(listed: &[vocab::MetricKind], train: Sums, test: Option<Sums>, examples_per_s: f64) -> Self {
        let listed = ORDER.into_iter().filter(|m| listed.contains(m) && !of(*m).always_written()).collect();
        Self { listed, train, test, examples_per_s }
    }

    /// The same at another throughput (the final evaluation's line repeats the last line's).
    pub fn at(self, examples_per_s: f64) -> Self {
        Self { examples_per_s, ..self }
    }

    /// Training examples per second over the span.
    pub fn examples_per_s(&self) -> f64 {
        self.examples_per_s
    }

    /// Every value: metric by metric in registration order, the training value, then the
    /// test split's; only those that are.
    pub fn values(&self) -> impl Iterator<Item = (&'static dyn Metric, SplitKind, f64)> + '_ {
        self.listed.iter().flat_map(move |&m| {
            let metric = of(m);
            let train =
                metric.value(SplitKind::Train, &self.train, self.examples_per_s).map(|v| (metric, SplitKind::Train, v));
            let test = self.test.as_ref().and_then(|t| metric.value(SplitKind::Test, t, self.examples_per_s));
            train.into_iter().chain(test.map(|v| (metric, SplitKind::Test, v)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{loss, mae};

    #[test]
    fn values_follow_the_registration_order_and_skip_what_is_always_written() {
        let mut train = Sums::of_examples(2);
        train.accumulate(loss::SUM, 2.0);
        train.accumulate(mae::ABS_ERROR, 1.0);
        let listed = [
            vocab::MetricKind::Mae,
            vocab::MetricKind::Accuracy,
            vocab::MetricKind::TokensPerS,
            vocab::MetricKind::Mae,
        ];
        let reading = Reading::new(&listed, train, Some(Sums::of_examples(1)), 7.0);
        let values: Vec<_> = reading.values().map(|(m, split, v)| (m.name(), split, v)).collect();
        assert_eq!(
            values,
            [("tokens_per_s", SplitKind::Train, 7.0), ("mae", SplitKind::Train, 0.5), ("mae", SplitKind::Test, 0.0)]
        );
        assert_eq!(reading.at(3.0).values().next().map(|v| v.2), Some(3.0));
    }
}

//! Metrics behind one trait, one file each: Keras's `loss` and `accuracy`, `perplexity`,
//! `tokens_per_s`, `mae` and `rmse`.
//!
//! Why this shape. A metric used to be a named field carried by hand through the loss, the
//! checkpoint manifest, the parameter-server wire, both loops and the GPU, so `mae` and
//! `rmse` touched twelve files. Now:
//!
//! - A [`Metric`] names itself, owns the [`Slot`]s of [`Sums`] it fills as it
//!   [observes](Metric::observe) each output row (and how each reduces), says which slots its
//!   value reads, and computes that value. Values are read from sums, never averaged: a mean
//!   of means would weigh a short last batch like a full one.
//! - [`Sums`] is a fixed array of slots. Replicas add it, workers all-reduce it, the ps wire,
//!   the checkpoint manifest and the run folder carry it whole, without naming a metric.
//! - [`Reading`] is what lines and the summary write: the listed metrics' values over a span.
//! - Registration is here and only here: the exhaustive [`of`] from the spec's
//!   [`vocab::MetricKind`], the writing [`ORDER`], and the [`SLOTS`] table. A new metric is its
//!   own file and these lines, plus its spec variant (and schema) so that a spec can name it.
//!
//! The layer: `engine` (the loss fills the sums), `strategy`, `checkpoint`, `plan` and
//! `train` all use it, so it depends on nothing of theirs, only on [`vocab`].
//!
//! `tokens_per_s` is a throughput, not a reading of sums: the loop's examples per second
//! under a name that says a language model's examples are tokens. It owns no slots and has no
//! test-split value; the trait says so through [`Metric::value`] returning `None`.

pub mod accuracy;
pub mod loss;
pub mod mae;
mod metric;
pub mod perplexity;
mod reading;
pub mod rmse;
mod sums;
pub mod tokens_per_s;

pub use metric::{Label, Metric, Needs, Reduction, Slot, SplitKind};
pub use reading::Reading;
pub use sums::Sums;

use crate::vocab;

/// The metric `train.metrics` names.
pub const fn of(metric: vocab::MetricKind) -> &'static dyn Metric {
    match metric {
        vocab::MetricKind::Accuracy => &accuracy::Accuracy,
        vocab::MetricKind::Perplexity => &perplexity::Perplexity,
        vocab::MetricKind::TokensPerS => &tokens_per_s::TokensPerS,
        vocab::MetricKind::Mae => &mae::Mae,
        vocab::MetricKind::Rmse => &rmse::Rmse,
    }
}

/// Every metric a spec can name, in the order lines, TensorBoard and the summary write them.
pub const ORDER: [vocab::MetricKind; 5] = [
    vocab::MetricKind::Accuracy,
    vocab::MetricKind::Perplexity,
    vocab::MetricKind::TokensPerS,
    vocab::MetricKind::Mae,
    vocab::MetricKind::Rmse,
];

/// Every slot of [`Sums`], at its index.
pub const SLOTS: [Slot; 5] = [loss::SUM, loss::EXAMPLES, accuracy::CORRECT, mae::ABS_ERROR, rmse::SQUARED_ERROR];

const _: () = {
    let mut i = 0;
    while i < SLOTS.len() {
        assert!(SLOTS[i].index == i, "a slot's index is its place in SLOTS");
        i += 1;
    }
};

/// Adds one output row's part to `sums`, for every registered metric (listed or not).
pub fn observe(row: &[f32], label: Label<'_>, sums: &mut Sums) {
    for metric in ORDER {
        of(metric).observe(row, label, sums);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric a spec can name is registered once, under the name the spec writes.
    #[test]
    fn the_registration_covers_the_spec_names() {
        fn names(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(map) => {
                    for (k, v) in map {
                        match (k.as_str(), v) {
                            ("const", serde_json::Value::String(s)) => out.push(s.clone()),
                            ("enum", serde_json::Value::Array(all)) => {
                                out.extend(all.iter().filter_map(|s| s.as_str().map(String::from)))
                            }
                            _ => names(v, out),
                        }
                    }
                }
                serde_json::Value::Array(all) => all.iter().for_each(|v| names(v, out)),
                _ => {}
            }
        }
        let schema = serde_json::to_value(schemars::schema_for!(vocab::MetricKind)).unwrap_or_default();
        let mut spec = Vec::new();
        names(&schema, &mut spec);
        spec.sort();
        let mut registered: Vec<String> = ORDER.iter().map(|m| of(*m).name().to_string()).collect();
        registered.sort();
        assert!(!spec.is_empty(), "{schema}");
        assert_eq!(spec, registered);
        for m in ORDER {
            assert_eq!(serde_json::to_value(m).unwrap_or_default(), of(m).name());
        }
    }

    #[test]
    fn slot_names_are_distinct() {
        let mut names: Vec<&str> = SLOTS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SLOTS.len());
    }

    #[test]
    fn rows_fill_the_slots_of_their_kind() {
        let mut sums = Sums::of_examples(2);
        observe(&[0.2, 0.9], Label::Class(1), &mut sums);
        observe(&[1.0, 3.0], Label::Targets(&[0.0, 0.5]), &mut sums);
        assert_eq!(sums.get(accuracy::CORRECT), 1.0);
        assert_eq!(sums.get(mae::ABS_ERROR), (1.0 + 2.5) / 2.0);
        assert_eq!(sums.get(rmse::SQUARED_ERROR), (1.0 + 6.25) / 2.0);
        assert_eq!(sums.loss_sum(), 0.0);
    }
}

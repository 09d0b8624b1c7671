//! What a sweep selects on: the split each trial evaluates (a validation split it holds out,
//! or the data's test split), the metrics that gives the trial, and the diagnostics of
//! `sweep.metric` (a metric the trials do not produce is an error; selecting on the test
//! split is a warning, since it picks hyperparameters on the data meant to judge them).

use crate::plan::Plan;
use crate::spec::sweep::SWEEP_METRICS;
use crate::spec::{DatasetKind, Diagnostic, Spec, SweepMetric};
use serde::{Deserialize, Serialize};

/// The split a trial evaluates at the end of training (and while training, when it does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evaluated {
    /// A validation split: `data.preprocessing.validation_split` carved from the training
    /// examples, or the validation files of a text, tokens or JSON-lines source. The run's
    /// `summary.json` calls its metrics `test_*`, as it calls every evaluated split; the sweep
    /// names them `val_*`.
    Validation,
    /// The dataset's test split (what sweeps written before `val_*` evaluated).
    #[default]
    Test,
    /// Nothing: the data has no split to evaluate.
    Nothing,
}

impl Evaluated {
    /// What `plan` (of `spec`) evaluates.
    pub fn of(plan: &Plan, spec: &Spec) -> Evaluated {
        if plan.data.facts.test_examples == 0 {
            return Evaluated::Nothing;
        }
        if plan.data.preprocessing.keep_for_training.is_some() {
            return Evaluated::Validation;
        }
        match spec.data.dataset {
            // Their evaluated files are named `validation` in the spec.
            DatasetKind::Text
            | DatasetKind::Tokens
            | DatasetKind::Jsonl
            | DatasetKind::Parquet
            | DatasetKind::HfDatasets => Evaluated::Validation,
            DatasetKind::Mnist
            | DatasetKind::FashionMnist
            | DatasetKind::Idx
            | DatasetKind::Synthetic
            | DatasetKind::Csv
            | DatasetKind::Npy
            | DatasetKind::ImageFolder
            | DatasetKind::Cifar10
            | DatasetKind::Cifar100
            | DatasetKind::Tfrecord => Evaluated::Test,
        }
    }

    /// The `summary.json` key holding `metric` of a trial that evaluates this split, or
    /// `None` when the trial does not produce it.
    pub fn summary_key(self, metric: SweepMetric) -> Option<&'static str> {
        match (self, metric) {
            (_, SweepMetric::TrainAccuracy | SweepMetric::TrainLoss) => Some(metric.as_str()),
            (Evaluated::Validation, SweepMetric::ValLoss) | (Evaluated::Test, SweepMetric::TestLoss) => {
                Some("test_loss")
            }
            (Evaluated::Validation, SweepMetric::ValAccuracy) | (Evaluated::Test, SweepMetric::TestAccuracy) => {
                Some("test_accuracy")
            }
            (Evaluated::Validation, SweepMetric::TestAccuracy | SweepMetric::TestLoss)
            | (Evaluated::Test, SweepMetric::ValLoss | SweepMetric::ValAccuracy)
            | (Evaluated::Nothing, _) => None,
        }
    }
}

/// The metrics a trial of `plan` produces, in the order they are listed to users.
pub fn produced(plan: &Plan, evaluated: Evaluated) -> Vec<SweepMetric> {
    SWEEP_METRICS
        .into_iter()
        .filter(|m| evaluated.summary_key(*m).is_some() && (plan.train.accuracy || !m.is_accuracy()))
        .collect()
}

/// The error for a `metric` that a trial, which produces `produced` and evaluates
/// `evaluated`, does not produce; `None` when it does.
pub fn missing(metric: SweepMetric, evaluated: Evaluated, produced: &[SweepMetric]) -> Option<Diagnostic> {
    if produced.contains(&metric) {
        return None;
    }
    let names: Vec<&str> = produced.iter().map(|m| m.as_str()).collect();
    let name = metric.as_str();
    let help = match (metric, evaluated) {
        (SweepMetric::ValLoss | SweepMetric::ValAccuracy, Evaluated::Test | Evaluated::Nothing) => format!(
            "hold out a validation split of the training data: `data.preprocessing.validation_split = 0.1` (for \
             MNIST, `data.dataset = \"idx\"` with only its training files in `[data.files]`, since a source with a \
             test split evaluates that); or select on the test split knowingly, e.g. `sweep.metric = \"{}\"`",
            if metric.is_accuracy() { "test_accuracy" } else { "test_loss" }
        ),
        _ if metric.is_accuracy() => {
            "add \"accuracy\" to `train.metrics` (class labels only), or select on a loss".to_string()
        }
        _ => format!("select on one of them: {}", names.join(", ")),
    };
    Some(
        Diagnostic::error(
            "sweep.metric",
            format!(
                "sweep.metric = \"{name}\", but the trials do not produce {name}; they produce {}",
                names.join(", ")
            ),
        )
        .help(help),
    )
}

/// The warning for a sweep that selects on a test metric.
pub fn on_test(metric: SweepMetric) -> Option<Diagnostic> {
    metric.is_test().then(|| {
        let instead = if metric.is_accuracy() { "val_accuracy" } else { "val_loss" };
        Diagnostic::warning(
            "sweep.metric",
            format!(
                "the sweep selects on {}, a metric of the test split: the trial it ranks first is chosen on the data \
                 meant to judge it",
                metric.as_str()
            ),
        )
        .help(format!(
            "hold out a validation split (`data.preprocessing.validation_split`; for MNIST, `data.dataset = \"idx\"` \
             with only its training files) and select on `sweep.metric = \"{instead}\"`; the test metrics stay \
             columns of results.csv"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validation_trial_names_its_evaluation_val_and_has_no_test_metrics() {
        let v = Evaluated::Validation;
        assert_eq!(v.summary_key(SweepMetric::ValAccuracy), Some("test_accuracy"));
        assert_eq!(v.summary_key(SweepMetric::TestAccuracy), None);
        let t = Evaluated::Test;
        assert_eq!(t.summary_key(SweepMetric::ValLoss), None);
        assert_eq!(t.summary_key(SweepMetric::TestLoss), Some("test_loss"));
        assert_eq!(Evaluated::Nothing.summary_key(SweepMetric::TrainLoss), Some("train_loss"));
    }

    #[test]
    fn a_missing_metric_names_what_the_trials_produce_and_the_fix() {
        let produced = [SweepMetric::TestAccuracy, SweepMetric::TestLoss, SweepMetric::TrainLoss];
        let d = missing(SweepMetric::ValLoss, Evaluated::Test, &produced).map(|d| (d.message, d.help));
        let (message, help) = d.unwrap_or_default();
        assert_eq!(
            message,
            "sweep.metric = \"val_loss\", but the trials do not produce val_loss; they produce test_accuracy, \
             test_loss, train_loss"
        );
        assert!(help.is_some_and(|h| h.contains("validation_split") && h.contains("\"test_loss\"")));
        assert!(missing(SweepMetric::TestLoss, Evaluated::Test, &produced).is_none());
        assert!(on_test(SweepMetric::TestAccuracy).is_some_and(|d| d.help.is_some_and(|h| h.contains("val_accuracy"))));
        assert!(on_test(SweepMetric::ValAccuracy).is_none());
    }
}

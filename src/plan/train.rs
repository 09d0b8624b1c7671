//! `[train]`, resolved: epochs and steps, the loss, metrics and when to evaluate.

use crate::data::{DataFacts, LabelKind};
use crate::engine::LossFn;
use crate::metrics::{self, Needs};
use crate::model::{LayerConfig, ModelPlan};
use crate::spec::{CallbackSpec, Diagnostic, Spec};
use crate::vocab::{LossKind, MetricKind};
use serde::Serialize;
use std::num::NonZeroU64;

/// When the test split is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EvalPlan {
    /// Every this many steps, if set.
    pub every_steps: Option<u64>,
    /// At the end of every epoch.
    pub every_epoch: bool,
    /// Test batches per evaluation (`None`: the whole split).
    pub validation_steps: Option<u64>,
}

/// `model.fit`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainPlan {
    /// Epochs.
    pub epochs: u64,
    /// Optimizer steps per epoch.
    pub steps_per_epoch: u64,
    /// `epochs × steps_per_epoch`.
    pub total_steps: u64,
    /// The step the run stops at before `total_steps`, with a backup there
    /// (`train.stop_at_step`); everything else still counts `total_steps`.
    pub stop_at_step: Option<u64>,
    /// The loss.
    pub loss: LossKind,
    /// Whether model outputs are logits.
    pub from_logits: bool,
    /// Metrics besides the loss.
    pub metrics: Vec<MetricKind>,
    /// Whether accuracy is measured and written: for class labels, never for float targets.
    pub accuracy: bool,
    /// Evaluation; `None` when there is no test split.
    pub eval: Option<EvalPlan>,
}

impl TrainPlan {
    /// The engine's loss function.
    pub fn loss_fn(&self) -> LossFn {
        LossFn { kind: self.loss, from_logits: self.from_logits }
    }
}

/// The most optimizer steps a run may plan: step numbers are signed 64-bit in TensorBoard
/// event files and in JSON readers, so a larger count could not be recorded.
const MAX_STEPS: u64 = i64::MAX as u64;

/// Plans `model.fit`'s loop for a global batch of `global`.
pub fn resolve(
    spec: &Spec,
    model: Option<&ModelPlan>,
    facts: &DataFacts,
    global: usize,
    diags: &mut Vec<Diagnostic>,
) -> TrainPlan {
    let t = &spec.train;
    let per_epoch =
        if spec.data.drop_remainder { facts.train_examples / global } else { facts.train_examples.div_ceil(global) };
    if facts.train_examples == 0 {
        diags.push(
            Diagnostic::error("data", "the training split has no examples, so there is nothing to train on")
                .help("point [data] at a dataset with training examples (check its files, or TRAINRUN_DATA_DIR)"),
        );
    } else if per_epoch == 0 {
        diags.push(
            Diagnostic::error(
                "batch.global",
                format!(
                    "the global batch of {global} is larger than the {} training examples, so the data has no full batch",
                    facts.train_examples
                ),
            )
            .help(format!("use a global batch of at most {}, or data.drop_remainder = false", facts.train_examples)),
        );
    }
    let steps_per_epoch = t.steps_per_epoch.map_or(per_epoch as u64, |s| s.get());
    let total_steps = match t.epochs.get().checked_mul(steps_per_epoch) {
        Some(total) if total <= MAX_STEPS => total,
        product => {
            diags.push(
                Diagnostic::error(
                    "train.epochs",
                    format!(
                        "train.epochs × steps per epoch = {} × {steps_per_epoch} = {} steps, more than the {MAX_STEPS} a run can count",
                        t.epochs,
                        product.map_or_else(|| "more than 2^64".to_string(), |p| p.to_string()),
                    ),
                )
                .help("train for fewer train.epochs or fewer train.steps_per_epoch"),
            );
            0
        }
    };
    let stop_at_step = stop_at(spec, total_steps, steps_per_epoch, diags);
    if (1..t.metrics.len()).any(|i| t.metrics[..i].contains(&t.metrics[i])) {
        diags.push(
            Diagnostic::warning("train.metrics", "train.metrics lists a metric twice").help("list each metric once"),
        );
    }
    for problem in t.metrics.iter().filter_map(|&m| unmeasurable(m, t.loss, facts.labels)) {
        diags.push(problem);
    }
    let eval = (facts.test_examples > 0).then_some(EvalPlan {
        every_steps: t.evaluate_every_steps.map(|s| s.get()),
        every_epoch: t.evaluate_every_epoch,
        validation_steps: t.validation_steps.map(|s| s.get()),
    });
    if eval.is_none() && t.evaluate_every_steps.is_some() {
        diags.push(
            Diagnostic::warning("train.evaluate_every_steps", "the dataset has no test split, so nothing is evaluated")
                .help("add test files to [data.files]"),
        );
    }
    // A language model needs a label per position; its loss would read past whole-example
    // labels.
    let per_position_labels = matches!(facts.labels, crate::data::LabelKind::Sequence { .. });
    if let Some(m) = model.filter(|m| m.per_position() && !per_position_labels) {
        diags.push(
            Diagnostic::error(
                "model",
                format!(
                    "the model predicts at every position (output {}), but the data gives one label per example",
                    m.output
                ),
            )
            .help(if facts.example_shape.is_empty() {
                // 1-D NumPy features: one number per example reads as a sequence to the model.
                "each example is a single number (features of shape (n,)): save the features with a feature axis, shape (n, 1) (x.reshape(-1, 1) in NumPy)"
            } else {
                "train a language model on a data source with a label per position (`text` or `tokens`)"
            }),
        );
    }
    if let (Some(problem), crate::data::LabelKind::Target { width }) = (sparse_on_targets(t.loss), facts.labels) {
        diags.push(
            Diagnostic::error("train.loss", format!("train.loss = \"{problem}\" needs class labels, but the dataset has {width} float target(s) per example"))
                .help("use loss = \"mean_squared_error\", \"mean_absolute_error\" or \"huber\" for regression; if the labels are classes written as numbers (a CSV column of -1, 0, 1), set data.csv.labels = \"classes\""),
        );
    }
    if !t.from_logits && model.is_some_and(outputs_logits) && !t.loss.regression() {
        diags.push(
            Diagnostic::warning(
                "train.from_logits",
                "the model's last layer outputs logits (no softmax or sigmoid), but train.from_logits = false",
            )
            .help("set train.from_logits = true, or end the model with a softmax activation"),
        );
    }
    TrainPlan {
        epochs: t.epochs.get(),
        steps_per_epoch,
        total_steps,
        stop_at_step,
        loss: t.loss,
        from_logits: t.from_logits,
        metrics: t.metrics.clone(),
        accuracy: !matches!(facts.labels, LabelKind::Target { .. }),
        eval,
    }
}

/// `train.stop_at_step`, which must not be past the run's last step; at the last step it
/// changes nothing (the run completes there), so it is none. Without `backup_and_restore`
/// nothing is kept to go on from, so the same command would train again from the start: said
/// as a warning, since stopping early may be all the user wants.
fn stop_at(spec: &Spec, total_steps: u64, steps_per_epoch: u64, diags: &mut Vec<Diagnostic>) -> Option<u64> {
    let t = &spec.train;
    let stop_at_step = t.stop_at_step.map(NonZeroU64::get);
    let backs_up = spec.callbacks.iter().any(|c| matches!(c, CallbackSpec::BackupAndRestore { .. }));
    if let Some(stop) = stop_at_step.filter(|s| *s < total_steps && !backs_up) {
        diags.push(
            Diagnostic::warning(
                "train.stop_at_step",
                format!(
                    "train.stop_at_step = {stop} stops the run without a backup (no backup_and_restore callback), so \
                     running it again trains from step 0 rather than going on from step {stop}"
                ),
            )
            .help("add [[callbacks]] with kind = \"backup_and_restore\" to go on from the step it stops at"),
        );
    }
    if let Some(stop) = stop_at_step.filter(|s| *s > total_steps && total_steps > 0) {
        diags.push(
            Diagnostic::error(
                "train.stop_at_step",
                format!(
                    "train.stop_at_step = {stop} is past the run's last step, {total_steps} (train.epochs × steps per \
                     epoch = {} × {steps_per_epoch})",
                    t.epochs
                ),
            )
            .help(format!(
                "stop at step {total_steps} or before, or train more epochs (train.epochs = {})",
                stop.div_ceil(steps_per_epoch.max(1))
            )),
        );
    }
    stop_at_step.filter(|s| *s < total_steps)
}

/// Why `metric` cannot be measured for `loss` on data labelled `labels`, if it cannot.
fn unmeasurable(metric: MetricKind, loss: LossKind, labels: LabelKind) -> Option<Diagnostic> {
    let name = metrics::of(metric).name();
    let refused = |what: &str, but: String, fix: &str| {
        Diagnostic::error("train.metrics", format!("train.metrics = \"{name}\" {what}, but {but}"))
            .help(format!("{fix}, or drop \"{name}\" from train.metrics"))
    };
    match metrics::of(metric).needs() {
        Needs::Nothing => None,
        Needs::CrossEntropy(what) => (!cross_entropy(loss)).then(|| {
            let but = format!("train.loss = \"{}\"", loss_name(loss));
            refused(what, but, "use loss = \"sparse_categorical_crossentropy\"")
        }),
        Needs::Sequences(what) => (!matches!(labels, LabelKind::Sequence { .. })).then(|| {
            let but = "the dataset has one label per example".to_string();
            refused(what, but, "train a language model on a `text` or `tokens` source")
        }),
        Needs::Targets(what) => (!matches!(labels, LabelKind::Target { .. }))
            .then(|| refused(what, "the dataset has class labels".to_string(), "use \"accuracy\" for classes")),
        Needs::Classes(what) => matches!(labels, LabelKind::Target { .. }).then(|| {
            let but = "the dataset's labels are float targets (a regression)".to_string();
            refused(what, but, "use \"mae\" or \"rmse\" for a regression")
        }),
    }
}

/// Whether the loss is a cross-entropy over classes (a softmax's), whose `exp` is a perplexity.
fn cross_entropy(loss: LossKind) -> bool {
    match loss {
        LossKind::SparseCategoricalCrossentropy | LossKind::CategoricalCrossentropy => true,
        LossKind::BinaryCrossentropy | LossKind::MeanSquaredError | LossKind::MeanAbsoluteError | LossKind::Huber => {
            false
        }
    }
}

/// The spec name of a loss.
fn loss_name(loss: LossKind) -> &'static str {
    match loss {
        LossKind::SparseCategoricalCrossentropy => "sparse_categorical_crossentropy",
        LossKind::CategoricalCrossentropy => "categorical_crossentropy",
        LossKind::BinaryCrossentropy => "binary_crossentropy",
        LossKind::MeanSquaredError => "mean_squared_error",
        LossKind::MeanAbsoluteError => "mean_absolute_error",
        LossKind::Huber => "huber",
    }
}

/// Whether the model ends without a squashing activation (zoo models end in logits).
fn outputs_logits(model: &ModelPlan) -> bool {
    model.layers.last().and_then(LayerConfig::output_activation).is_some_and(|a| !a.squashes())
}

/// The spec name of a loss that reads class indices only (float targets cannot be its labels).
fn sparse_on_targets(loss: LossKind) -> Option<&'static str> {
    match loss {
        LossKind::SparseCategoricalCrossentropy => Some("sparse_categorical_crossentropy"),
        LossKind::CategoricalCrossentropy
        | LossKind::BinaryCrossentropy
        | LossKind::MeanSquaredError
        | LossKind::MeanAbsoluteError
        | LossKind::Huber => None,
    }
}

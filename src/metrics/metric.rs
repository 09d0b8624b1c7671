//! The [`Metric`] trait and the words it is stated in: the [`Slot`]s of [`super::Sums`] a
//! metric owns and how each reduces, the [`Label`] of an output row it observes, the
//! [`SplitKind`] a value is of, and what it [`Needs`] of a run to be measured at all.

use super::Sums;

/// How the values of one slot from two spans (micro-batches, replicas, workers, a ps
/// closure's steps) combine into the value of both.
///
/// Every sum today adds, and the strategies move the slots as one array through an
/// all-reduce that adds ([`Sums::summable`]). A slot that keeps a maximum or a mean would
/// add a variant here; the compiler then stops at `summable`, the one place that assumes
/// every slot adds, so the all-reduce learns to reduce it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// The values add.
    Sum,
}

impl Reduction {
    /// `a` and `b` combined.
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            Reduction::Sum => a + b,
        }
    }
}

/// One sum every batch carries: a place in [`Sums`], owned by one metric (declared in its
/// file), read by any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Its place in [`Sums`]: its position in [`super::SLOTS`] (checked when compiled).
    pub index: usize,
    /// Its name in a checkpoint's manifest (`abs_error_sum`).
    pub name: &'static str,
    /// How two spans' values combine.
    pub reduction: Reduction,
}

/// What one row of outputs is compared with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Label<'a> {
    /// A class index (an image's class, or a language model's next token at one position).
    Class(usize),
    /// One float target per output (regression).
    Targets(&'a [f32]),
}

/// Which examples a value is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    /// The training batches of a span (the last steps, the epoch so far, the last epoch).
    Train,
    /// The test split, at an evaluation.
    Test,
}

/// What a metric needs of a run to be measured, checked when the spec is planned. Each
/// carries what the metric is, for the error that refuses it (`is exp of a cross-entropy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Any run measures it.
    Nothing,
    /// A cross-entropy loss over classes.
    CrossEntropy(&'static str),
    /// A label per position (a language model's sequences).
    Sequences(&'static str),
    /// Float targets (regression).
    Targets(&'static str),
    /// Class labels (one per example, or per position of a sequence).
    Classes(&'static str),
}

/// A metric: its name, the sums it owns and reads, and its value from them.
///
/// The loop, the strategies, the parameter-server wire and the checkpoint carry [`Sums`]
/// whole, never one metric's part, so a metric is its own file and one line of registration
/// in [`super::of`].
pub trait Metric: Sync {
    /// Its name in `train.metrics`, `metrics.jsonl` and TensorBoard (`mae`; `val_mae` for
    /// the test split).
    fn name(&self) -> &'static str;

    /// The slots its value reads: its own, or another metric's (perplexity reads the loss's).
    fn reads(&self) -> &'static [Slot];

    /// Adds one output row's part to the slots it owns. Every registered metric observes
    /// every row, listed or not, so [`Sums`] mean the same in every run and every checkpoint.
    fn observe(&self, _row: &[f32], _label: Label<'_>, _sums: &mut Sums) {}

    /// Its value on `split` from that split's `sums` and the training examples per second
    /// over the same span; `None` where it has none (a throughput has no test-split value).
    fn value(&self, split: SplitKind, sums: &Sums, examples_per_s: f64) -> Option<f64>;

    /// What it needs of a run.
    fn needs(&self) -> Needs {
        Needs::Nothing
    }

    /// Whether every line and summary write it as a column of its own, listed or not
    /// (Keras's `accuracy`), rather than only when `train.metrics` lists it.
    fn always_written(&self) -> bool {
        false
    }

    /// Its key in `summary.json` (`train_mae`, `test_mae`).
    fn summary_key(&self, split: SplitKind) -> String {
        let prefix = match split {
            SplitKind::Train => "train",
            SplitKind::Test => "test",
        };
        format!("{prefix}_{}", self.name())
    }
}

/// `sum / examples`, 0 with no examples: the mean most metrics are.
pub fn per_example(sums: &Sums, slot: Slot) -> f64 {
    let examples = sums.get(super::loss::EXAMPLES);
    if examples == 0.0 { 0.0 } else { sums.get(slot) / examples }
}

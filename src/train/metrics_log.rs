//! `metrics.jsonl`: one [`MetricsLine`] every `run.log_every_steps` steps, per epoch and per
//! evaluation, Keras's `logs` with the throughput, the time and the listed metrics. The run
//! folder ([`super::run_dir`]) writes it, TensorBoard's scalars from the same lines, and hands
//! them to a [`LineSink`] when the run is tracked.

use super::callbacks::Logs;
use super::summary::ParameterServerStats;
use crate::cluster::Straggler;
use crate::metrics::{Metric, Reading, SplitKind};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// What a line of `metrics.jsonl` is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsEvent {
    /// The last `run.log_every_steps` training steps.
    Step,
    /// The end of an epoch.
    Epoch,
    /// An evaluation on the test split (every N steps, or the final one).
    Evaluation,
}

/// Somewhere else the run folder's lines go as they are written (an MLflow server, through
/// `crate::tracking`). It must return at once and never fail the run: the folder is the record.
pub trait LineSink: Send {
    /// Takes one line.
    fn line(&mut self, line: &MetricsLine);
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricsLine {
    /// What the line is about.
    pub event: MetricsEvent,
    /// 1-based epoch.
    pub epoch: u64,
    /// Optimizer steps done.
    pub step: u64,
    /// Mean training loss of the epoch so far (of the last steps for `step` lines).
    pub loss: f64,
    /// Training accuracy of the epoch so far (of the last steps for `step` lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Test-split loss, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Test-split accuracy, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Learning rate of the last step.
    pub learning_rate: f64,
    /// Training examples per second over the epoch or the last steps (steps only, not
    /// evaluation).
    pub examples_per_s: f64,
    /// Seconds since launch.
    pub wall_s: f64,
    /// The metrics of `train.metrics` beyond accuracy, when listed.
    #[serde(flatten)]
    pub named: NamedMetrics,
    /// Under `parameter_server`: the coordinator's counters so far (epoch lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter_server: Option<ParameterServerStats>,
    /// Tasks of a multi-worker job whose steps stand out, as the chief sees them (epoch and
    /// evaluation lines; absent when none do).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<Straggler>,
}

impl MetricsLine {
    /// The line of `logs` (an epoch's end or an evaluation), `wall_s` after launch, with the
    /// listed metrics of `reading` (read from the sums behind the logs' losses) and its
    /// examples per second.
    pub fn of(event: MetricsEvent, logs: &Logs, reading: Reading, wall_s: f64) -> Self {
        MetricsLine {
            event,
            epoch: logs.epoch,
            step: logs.step,
            loss: logs.loss,
            accuracy: logs.accuracy,
            val_loss: logs.val_loss,
            val_accuracy: logs.val_accuracy,
            learning_rate: logs.learning_rate,
            examples_per_s: reading.examples_per_s(),
            wall_s,
            named: NamedMetrics(reading),
            parameter_server: None,
            stragglers: Vec::new(),
        }
    }
}

/// The metrics a spec lists in `train.metrics` beyond loss and accuracy (always written), on
/// one line: each as its name (`mae`), and as `val_` and its name when the line has an
/// evaluation; absent unless listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamedMetrics(pub Reading);

impl NamedMetrics {
    /// TensorBoard's scalars (`name`, value) of `split`, in the order the line writes them.
    pub fn scalars(&self, split: SplitKind) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.0.values().filter(move |(_, s, _)| *s == split).map(|(m, _, v)| (m.name(), v))
    }
}

impl Serialize for NamedMetrics {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (metric, split, value) in self.0.values() {
            map.serialize_entry(&key(metric, split), &value)?;
        }
        map.end()
    }
}

/// A metric's key on a line: Keras's `mae`, `val_mae`.
fn key(metric: &dyn Metric, split: SplitKind) -> String {
    match split {
        SplitKind::Train => metric.name().to_string(),
        SplitKind::Test => format!("val_{}", metric.name()),
    }
}

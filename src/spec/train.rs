//! `[train]` and `[[callbacks]]`: Keras's `model.fit` arguments and callbacks.

use crate::vocab::{LossKind, MetricKind, Monitor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;
use std::path::PathBuf;

/// `[train]`: `model.compile` + `model.fit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// Passes of `steps_per_epoch` steps. Default: `1`. Example: `epochs = 3`.
    #[serde(default = "default_epochs")]
    pub epochs: NonZeroU64,
    /// Optimizer steps per epoch; the data iterator continues across epochs, as Keras does.
    /// Default: one pass over the training data (examples ÷ global batch).
    /// Example: `steps_per_epoch = 70`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_epoch: Option<NonZeroU64>,
    /// Stop after this optimizer step of the run (counted from its start, across epochs, a
    /// resumed run's earlier steps included), in the middle of an epoch too: the backup
    /// (`backup_and_restore`) is written there, then the validation, the weights and the
    /// summary (`stopped = "paused"`), as at the end of the run. Everything else still counts
    /// the whole run of `epochs`: the learning-rate schedule and warmup, the epochs and the
    /// checkpoints, so the same run resumed without this key ends bit-identical to one that
    /// never stopped. A sweep's scheduler sets it to pause a trial at a rung in steps.
    /// Default: off (every epoch runs). Example: `stop_at_step = 30`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at_step: Option<NonZeroU64>,
    /// Steps run as one unit of work, Keras's `steps_per_execution`: under `parameter_server`
    /// the coordinator schedules this many steps as one closure on a worker (fewer round trips,
    /// and a lost closure re-runs all of them); the other strategies step one at a time, which
    /// gives the same result. Default: `1`. Example: `steps_per_execution = 10`.
    #[serde(default = "default_steps_per_execution", skip_serializing_if = "is_one")]
    pub steps_per_execution: NonZeroU64,
    /// The loss. Example: `loss = "sparse_categorical_crossentropy"`.
    #[serde(default)]
    pub loss: LossKind,
    /// The model's last layer outputs logits, not probabilities. Default: `false`, as Keras.
    /// Example: `from_logits = true`.
    #[serde(default)]
    pub from_logits: bool,
    /// Metrics besides the loss, written to `metrics.jsonl`, TensorBoard and `summary.json`:
    /// `accuracy` (always written for class labels; refused for float targets), `perplexity` (`exp` of a cross-entropy loss: `perplexity`,
    /// `val_perplexity`; `train_perplexity`, `test_perplexity` in the summary) and
    /// `tokens_per_s` (training tokens per second of a language model; `steady_tokens_per_s`
    /// in the summary), `mae` and `rmse` (float targets). Default: none beyond accuracy.
    /// Example: `metrics = ["accuracy", "perplexity", "tokens_per_s"]`.
    #[serde(default)]
    pub metrics: Vec<MetricKind>,
    /// Evaluate on the test split every this many steps, besides every epoch's end.
    /// Default: off. Example: `evaluate_every_steps = 200`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluate_every_steps: Option<NonZeroU64>,
    /// Evaluate on the test split at the end of every epoch. Default: `true`.
    /// Example: `evaluate_every_epoch = false`.
    #[serde(default = "yes")]
    pub evaluate_every_epoch: bool,
    /// Test batches per evaluation. Default: the whole test split. Example: `validation_steps = 20`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_steps: Option<NonZeroU64>,
    /// The dtype policy (Keras's `mixed_precision` names): `float32` computes everything in
    /// fp32; `mixed_bfloat16` rounds the inputs of the layers' matrix products (attention,
    /// per-position dense, LM head) to bf16 and keeps sums, outputs, weights, optimizer
    /// state, gradients, losses and normalization statistics in fp32. On a CPU without bf16
    /// instructions it runs in fp32 and says so. Default: `float32`.
    /// Example: `precision = "mixed_bfloat16"`.
    #[serde(default, skip_serializing_if = "PrecisionPolicy::is_float32")]
    pub precision: PrecisionPolicy,
}

/// `train.precision`: which dtype the layers compute in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionPolicy {
    /// Everything in fp32.
    #[default]
    Float32,
    /// bf16 inputs to the matrix products, fp32 everything else.
    MixedBfloat16,
}

impl PrecisionPolicy {
    /// Left out of the serialized spec at its default, so hashes of specs without the key
    /// stay as they were before it existed.
    pub fn is_float32(&self) -> bool {
        *self == Self::Float32
    }
}

fn default_epochs() -> NonZeroU64 {
    NonZeroU64::MIN
}

fn default_steps_per_execution() -> NonZeroU64 {
    NonZeroU64::MIN
}

/// Left out of the serialized spec at its default, so hashes of specs without it stay as
/// they were before the key existed.
fn is_one(n: &NonZeroU64) -> bool {
    n.get() == 1
}

fn yes() -> bool {
    true
}

impl Default for TrainSpec {
    fn default() -> Self {
        Self {
            epochs: default_epochs(),
            steps_per_epoch: None,
            stop_at_step: None,
            steps_per_execution: default_steps_per_execution(),
            loss: LossKind::default(),
            from_logits: false,
            metrics: Vec::new(),
            evaluate_every_steps: None,
            evaluate_every_epoch: true,
            validation_steps: None,
            precision: PrecisionPolicy::Float32,
        }
    }
}

/// Whether a watched metric should go down or up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `min` for losses, `max` for accuracies.
    #[default]
    Auto,
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

/// How often something is saved: each epoch, or every N steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum SaveFreq {
    /// Every this many optimizer steps.
    Steps(NonZeroU64),
    /// `"epoch"`: at each epoch's end.
    Epoch(EpochWord),
}

/// The word `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EpochWord {
    /// At each epoch's end.
    Epoch,
}

impl Default for SaveFreq {
    fn default() -> Self {
        SaveFreq::Epoch(EpochWord::Epoch)
    }
}

/// `[[callbacks]]`: one callback, chosen by `kind`, with Keras's meanings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CallbackSpec {
    /// Saves the model (Keras `ModelCheckpoint`); only the chief writes.
    ModelCheckpoint {
        /// Folder of checkpoints. Default: `<out_dir>/checkpoints`. Example: `dir = "ckpt"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<PathBuf>,
        /// `"epoch"` or a step count. Default: `"epoch"`. Example: `save_freq = 500`.
        #[serde(default)]
        save_freq: SaveFreq,
        /// Keep only checkpoints that improve `monitor`. Default: `false`.
        /// Example: `save_best_only = true`.
        #[serde(default)]
        save_best_only: bool,
        /// The watched metric. Default: `val_loss`. Example: `monitor = "val_accuracy"`.
        #[serde(default)]
        monitor: Monitor,
        /// Direction of improvement. Default: `auto`. Example: `mode = "max"`.
        #[serde(default)]
        mode: Mode,
        /// Newest checkpoints kept; older ones are deleted. Default: all. Example: `max_to_keep = 3`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        max_to_keep: Option<u32>,
    },
    /// Backs up the whole training state and resumes from it after a failure
    /// (Keras `BackupAndRestore`).
    BackupAndRestore {
        /// Folder of the backup. Default: `<out_dir>/backup`. Example: `backup_dir = "/scratch/bk"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backup_dir: Option<PathBuf>,
        /// `"epoch"` or a step count. Default: `"epoch"`. Example: `save_freq = 50`.
        #[serde(default)]
        save_freq: SaveFreq,
        /// Delete the backup when training finishes. Default: `true`.
        /// Example: `delete_checkpoint = false`.
        #[serde(default = "yes")]
        delete_checkpoint: bool,
    },
    /// Stops when `monitor` stops improving (Keras `EarlyStopping`).
    EarlyStopping {
        /// The watched metric. Default: `val_loss`. Example: `monitor = "val_accuracy"`.
        #[serde(default)]
        monitor: Monitor,
        /// Smallest change that counts as improvement. Default: `0`. Example: `min_delta = 0.001`.
        #[serde(default)]
        #[schemars(range(min = 0.0))]
        min_delta: f64,
        /// Evaluations without improvement before stopping. Default: `0`. Example: `patience = 3`.
        #[serde(default)]
        patience: u32,
        /// Direction of improvement. Default: `auto`. Example: `mode = "min"`.
        #[serde(default)]
        mode: Mode,
        /// Go back to the best weights seen when stopping. Default: `false`.
        /// Example: `restore_best_weights = true`.
        #[serde(default)]
        restore_best_weights: bool,
    },
    /// Multiplies the learning rate by `factor` when `monitor` stops improving
    /// (Keras `ReduceLROnPlateau`).
    ReduceLrOnPlateau {
        /// The watched metric. Default: `val_loss`. Example: `monitor = "val_loss"`.
        #[serde(default)]
        monitor: Monitor,
        /// Multiplier. Default: `0.1`. Example: `factor = 0.5`.
        #[serde(default = "default_plateau_factor")]
        #[schemars(extend("exclusiveMinimum" = 0.0, "exclusiveMaximum" = 1.0))]
        factor: f64,
        /// Evaluations without improvement before reducing. Default: `10`. Example: `patience = 2`.
        #[serde(default = "default_plateau_patience")]
        patience: u32,
        /// Direction of improvement. Default: `auto`. Example: `mode = "min"`.
        #[serde(default)]
        mode: Mode,
        /// Smallest change that counts as improvement. Default: `0.0001`. Example: `min_delta = 0.01`.
        #[serde(default = "default_plateau_delta")]
        #[schemars(range(min = 0.0))]
        min_delta: f64,
        /// Evaluations to wait after a reduction. Default: `0`. Example: `cooldown = 1`.
        #[serde(default)]
        cooldown: u32,
        /// Floor of the learning rate. Default: `0`. Example: `min_lr = 1e-5`.
        #[serde(default)]
        #[schemars(range(min = 0.0))]
        min_lr: f64,
    },
    /// Appends each epoch's metrics to a CSV file (Keras `CSVLogger`).
    CsvLogger {
        /// File path, relative to the run folder. Default: `training.csv`. Example: `filename = "log.csv"`.
        #[serde(default = "default_csv")]
        filename: PathBuf,
        /// Append to an existing file instead of replacing it. Default: `false`. Example: `append = true`.
        #[serde(default)]
        append: bool,
    },
    /// Stops training as soon as an evaluation reaches `target` (time-to-accuracy runs).
    StopAtTarget {
        /// The watched metric. Default: `val_accuracy`. Example: `monitor = "val_accuracy"`.
        #[serde(default = "default_target_monitor")]
        monitor: Monitor,
        /// The value to reach (at or above for accuracies, at or below for losses).
        /// Example: `target = 0.98`.
        target: f64,
    },
}

fn default_plateau_factor() -> f64 {
    0.1
}

fn default_plateau_patience() -> u32 {
    10
}

fn default_plateau_delta() -> f64 {
    1e-4
}

fn default_csv() -> PathBuf {
    PathBuf::from("training.csv")
}

fn default_target_monitor() -> Monitor {
    Monitor::ValAccuracy
}

//! TensorFlow's vocabulary, shared by the spec, the plan and the runtime: the enums a spec
//! names and the runtime acts on. They derive serde and schema because specs deserialize them
//! directly; nothing here reads a spec, so the runtime can use them without importing `spec`.

mod device;

pub use device::{BadDevice, Device, DeviceKind};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An activation function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Identity.
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// Normalized exponentials over the last axis.
    Softmax,
}

impl Activation {
    /// Whether the function maps into a bounded range (probabilities), not logits.
    pub fn squashes(self) -> bool {
        match self {
            Activation::Softmax | Activation::Sigmoid => true,
            Activation::Linear | Activation::Relu | Activation::Tanh => false,
        }
    }
}

/// `train.loss`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// Named `Loss` in the schema and in serde's error texts, as before the rename.
#[serde(rename = "Loss", rename_all = "snake_case")]
pub enum LossKind {
    /// Cross-entropy against integer class labels.
    #[default]
    SparseCategoricalCrossentropy,
    /// Cross-entropy against one-hot labels.
    CategoricalCrossentropy,
    /// Per-output binary cross-entropy against one-hot labels.
    BinaryCrossentropy,
    /// Mean squared error against float targets, or one-hot labels for class data.
    MeanSquaredError,
    /// Mean absolute error against float targets (or one-hot labels).
    MeanAbsoluteError,
    /// Keras's `Huber` loss with `delta = 1`: squared below 1, linear above, against float
    /// targets (or one-hot labels).
    Huber,
}

impl LossKind {
    /// Whether the loss compares outputs to values (a regression loss), not to classes.
    pub fn regression(self) -> bool {
        match self {
            LossKind::MeanSquaredError | LossKind::MeanAbsoluteError | LossKind::Huber => true,
            LossKind::SparseCategoricalCrossentropy
            | LossKind::CategoricalCrossentropy
            | LossKind::BinaryCrossentropy => false,
        }
    }
}

/// `train.metrics` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// Named `Metric` in the schema and in serde's error texts, as before the rename.
#[serde(rename = "Metric", rename_all = "snake_case")]
pub enum MetricKind {
    /// Fraction of examples whose highest output is the label.
    Accuracy,
    /// `exp` of the mean cross-entropy (per position for a language model): the number of
    /// equally likely tokens the model hesitates between. Written as `perplexity` and
    /// `val_perplexity`; needs a cross-entropy loss.
    Perplexity,
    /// Training tokens (positions whose next token is predicted) per second, all replicas.
    /// Needs data with a label per position (`text`, `tokens`).
    TokensPerS,
    /// Mean absolute error of the outputs against float targets (Keras `mae`), on the
    /// training batches and the test split: written as `mae` and `val_mae`. Needs float
    /// targets (regression).
    Mae,
    /// Root mean squared error against float targets (Keras `RootMeanSquaredError`): written
    /// as `rmse` and `val_rmse`. Needs float targets (regression).
    Rmse,
}

/// A metric a callback watches: training or validation loss and accuracy, Keras's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Monitor {
    /// Training loss.
    Loss,
    /// Training accuracy.
    Accuracy,
    /// Test-split loss.
    #[default]
    ValLoss,
    /// Test-split accuracy.
    ValAccuracy,
}

impl Monitor {
    /// Keras's name of the watched metric.
    pub fn name(self) -> &'static str {
        match self {
            Monitor::Loss => "loss",
            Monitor::Accuracy => "accuracy",
            Monitor::ValLoss => "val_loss",
            Monitor::ValAccuracy => "val_accuracy",
        }
    }
}

/// Which way a watched metric improves, resolved from a spec's `mode` (`auto` is `min` for
/// losses and `max` for accuracies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

//! `[optimizer]`: the optimizer, and how its learning rate scales with batch, warms up and decays.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[optimizer]`: Keras's optimizer arguments. Options of one kind given to another are errors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSpec {
    /// The optimizer. Default: `sgd`. Example: `kind = "adamw"`.
    #[serde(default)]
    pub kind: OptimizerKind,
    /// Learning rate at `scaling.base_batch` (before scaling, warmup and schedule).
    /// Default: `0.01` for `sgd`, `0.001` for `adam` / `adamw`. Example: `learning_rate = 0.05`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0))]
    pub learning_rate: Option<f64>,
    /// `sgd` only: momentum. Default: `0`. Example: `momentum = 0.9`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1.0))]
    pub momentum: Option<f64>,
    /// `sgd` only: Nesterov momentum. Default: `false`. Example: `nesterov = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// Weight decay: added to the gradient as L2 for `sgd` and `adam`, decoupled for `adamw`.
    /// Default: `0` (`0.004` for `adamw`, as Keras). Example: `weight_decay = 0.0001`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub weight_decay: Option<f64>,
    /// `adam` / `adamw` only: decay of the first moment. Default: `0.9`. Example: `beta_1 = 0.95`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1.0))]
    pub beta_1: Option<f64>,
    /// `adam` / `adamw` only: decay of the second moment. Default: `0.999`. Example: `beta_2 = 0.98`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1.0))]
    pub beta_2: Option<f64>,
    /// `adam` / `adamw` only: added to the denominator. Default: `1e-7`. Example: `epsilon = 1e-8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0))]
    pub epsilon: Option<f64>,
    /// Clips the gradient to this global L2 norm before each update (Keras's
    /// `global_clipnorm`): every gradient is scaled by `min(1, clip_norm / ‖g‖)`, computed on
    /// the all-reduced gradient so that every replica clips identically. Default: no clipping.
    /// Example: `clip_norm = 1.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0))]
    pub clip_norm: Option<f64>,
    /// `adam` / `adamw` only: weights that get no weight decay, as parts of their paths (Keras's
    /// `exclude_from_weight_decay`; a weight is excluded when its path, such as
    /// `transformer_block/ln_1/gamma`, contains a pattern). Default: for `adamw`, every
    /// one-dimensional weight (biases and normalization weights, as GPT-2's recipe); for `adam`,
    /// none. `[]` decays every weight. Example: `exclude_from_weight_decay = ["bias", "gamma", "beta"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_from_weight_decay: Option<Vec<String>>,
    /// `[optimizer.scaling]`: how the learning rate follows the global batch.
    #[serde(default)]
    pub scaling: ScalingSpec,
    /// `[optimizer.warmup]`: a linear ramp at the start of training (Goyal et al., 2017).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupSpec>,
    /// `[optimizer.schedule]`: decay after warmup. Default: `constant`.
    #[serde(default)]
    pub schedule: ScheduleSpec,
}

/// `optimizer.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Stochastic gradient descent, with optional (Nesterov) momentum.
    #[default]
    Sgd,
    /// Adam (Kingma & Ba).
    Adam,
    /// Adam with decoupled weight decay (Loshchilov & Hutter).
    Adamw,
}

/// `[optimizer.scaling]`: learning-rate scaling with the global batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScalingSpec {
    /// The rule. Default: `none`. Example: `rule = "linear"`.
    #[serde(default)]
    pub rule: ScalingRule,
    /// The global batch `optimizer.learning_rate` was tuned for. Required by `linear` and
    /// `sqrt`. Example: `base_batch = 64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub base_batch: Option<usize>,
    /// `table` only: learning rate by global batch, as `LEARNING_RATES_BY_BATCH_SIZE` in
    /// TensorFlow's guide; the global batch must be a key.
    /// Example: `table = { "64" = 0.05, "128" = 0.1 }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "table_schema")]
    pub table: BTreeMap<String, f64>,
}

/// Every learning rate of the table is positive.
fn table_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "description": "The learning rate at this global batch, above 0. Example: `\"128\" = 0.1`.",
            "type": "number",
            "format": "double",
            "exclusiveMinimum": 0.0
        }
    })
}

/// `optimizer.scaling.rule`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScalingRule {
    /// Use `learning_rate` as given.
    #[default]
    None,
    /// `learning_rate × global / base_batch` (Goyal et al.).
    Linear,
    /// `learning_rate × sqrt(global / base_batch)` (Krizhevsky; Hoffer et al.).
    Sqrt,
    /// Look the learning rate up in `table` by global batch.
    Table,
}

/// `[optimizer.warmup]`: ramp linearly from `start_learning_rate` to the scaled rate. Give
/// `steps` or `epochs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmupSpec {
    /// Warmup length in optimizer steps. Example: `steps = 500`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Warmup length in epochs (may be fractional). Example: `epochs = 5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub epochs: Option<f64>,
    /// Learning rate at step 0. Default: the unscaled `learning_rate` when scaling raised it
    /// (Goyal et al.'s gradual warmup), else `0`. Example: `start_learning_rate = 0.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub start_learning_rate: Option<f64>,
}

/// `[optimizer.schedule]`: decay after warmup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScheduleSpec {
    /// Keep the learning rate.
    #[default]
    Constant,
    /// Multiply by `factor` every `every_epochs` epochs or `every_steps` steps (one of them).
    StepDecay {
        /// Multiplier at each decay. Example: `factor = 0.1`.
        #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0.0))]
        factor: f64,
        /// Decay period in epochs. Example: `every_epochs = 30`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        every_epochs: Option<u64>,
        /// Decay period in steps. Example: `every_steps = 1000`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        every_steps: Option<u64>,
    },
    /// Cosine decay from the scaled rate to `alpha ×` it over the steps after warmup
    /// (Loshchilov & Hutter).
    Cosine {
        /// Final fraction of the learning rate. Default: `0`. Example: `alpha = 0.01`.
        #[serde(default)]
        #[schemars(range(min = 0.0, max = 1.0))]
        alpha: f64,
        /// The learning rate to decay to, as a value instead of a fraction (nanoGPT's
        /// `min_lr`); give it or `alpha`, not both. Default: none (`alpha` decides).
        /// Example: `final_learning_rate = 1e-4`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 0.0))]
        final_learning_rate: Option<f64>,
    },
}

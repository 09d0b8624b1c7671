//! `[batch]`: give any two of global batch, per-replica batch and accumulation steps.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;

/// `[batch]`: batch sizing. `global = per_replica × num_replicas_in_sync × accumulation_steps`;
/// give any two and the third is derived (one alone: `accumulation_steps` is 1).
/// Default when the section is absent: `global = 32`, as Keras.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Examples consumed by one optimizer step across all replicas (`tf.data` batches under a
    /// strategy are global). Example: `global = 128`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<NonZeroUsize>,
    /// Examples one replica processes per forward/backward pass (`per_replica_batch_size`).
    /// Example: `per_replica = 64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_replica: Option<NonZeroUsize>,
    /// Forward/backward passes summed before each optimizer step (gradient accumulation).
    /// Example: `accumulation_steps = 4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation_steps: Option<NonZeroUsize>,
}

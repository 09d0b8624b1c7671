//! The spec: serde types of every section (strict, documented), and loading with layering.
//!
//! Only this module sees raw TOML; everything past it works with these types, and only
//! [`crate::plan`] sees the whole [`Spec`].
//!
//! [`load`] reads a spec file, its `extends` chain and its overrides, validates the merged
//! value against [`schema_value`] (reporting every problem at once), and returns the typed
//! [`Spec`] with the [`Origins`] that [`render`] uses to point any [`Diagnostic`] at the file
//! and line, environment variable or `--set` its key came from.

mod batch;
mod data;
mod deploy;
mod device;
mod files;
mod keypath;
mod load;
mod optimizer;
mod origins;
mod overrides;
mod render;
mod run;
mod schema;
mod strategy;
pub mod sweep;
mod tracking;
mod train;
mod validate;
mod words;

pub use crate::data::{IdxFiles, SyntheticConfig};
pub use crate::diagnostic::{Diagnostic, Severity};
pub use crate::model::{LayerConfig, ModelSpec, Padding, Size2, ZooModel};
pub use crate::vocab::{Activation, BadDevice, Device, DeviceKind, LossKind, MetricKind, Monitor};
pub use batch::BatchSpec;
pub use data::{AutoShardPolicy, DataSpec, DatasetKind};
pub use deploy::{AccessMode, DeploySpec, VolumeSpec};
pub use device::Devices;
pub use files::io_reason;
pub use load::{Assignment, LoadError, Loaded, load, load_trial};
pub use optimizer::{OptimizerKind, OptimizerSpec, ScalingRule, ScalingSpec, ScheduleSpec, WarmupSpec};
pub use origins::Origins;
pub use render::{render, render_each};
pub use run::{RunSpec, TrackingSpec};
pub use schema::{schema_json, schema_value};
pub use strategy::{
    ClusterSpec, CollectiveImplementation, CollectiveTransport, CommunicationOptions, CostModelSpec, CrossDeviceOps,
    LinkSpec, StrategySpec, Tasks, TlsSpec, VariablePartitioner,
};
pub use sweep::{GridValues, RandomSpec, SweepDistribution, SweepMetric, SweepSpec};
pub use tracking::{NotAServer, server_address};
pub use train::{CallbackSpec, EpochWord, Mode, PrecisionPolicy, SaveFreq, TrainSpec};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A whole trainrun spec: one TOML file (plus what it extends and its overrides).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Another spec this one builds on, relative to this file; keys here override it.
    /// Chains are allowed, cycles are errors. Example: `extends = "base.toml"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<PathBuf>,
    /// `[run]`: name, seed, output folder, threads.
    #[serde(default)]
    pub run: RunSpec,
    /// `[strategy]`: the distribution strategy. Default: `kind = "default"`.
    #[serde(default)]
    pub strategy: StrategySpec,
    /// `[cluster]`: tasks by role. Default: none (one local process).
    #[serde(default)]
    pub cluster: ClusterSpec,
    /// `[data]`: dataset and input pipeline. Default: MNIST.
    #[serde(default)]
    pub data: DataSpec,
    /// `[batch]`: global / per-replica batch and gradient accumulation.
    #[serde(default)]
    pub batch: BatchSpec,
    /// `[optimizer]`: optimizer and learning-rate scaling, warmup, schedule.
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// `[model]`: a zoo model or a list of layers. Required.
    pub model: ModelSpec,
    /// `[train]`: epochs, steps, loss, metrics, evaluation.
    #[serde(default)]
    pub train: TrainSpec,
    /// `[[callbacks]]`: checkpoints, backup-and-restore, early stopping, ….
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callbacks: Vec<CallbackSpec>,
    /// `[sweep]`: trials over key paths of this spec, run by `trainrun sweep`. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepSpec>,
    /// `[deploy]`: what only `trainrun manifest` reads (image, resources, volume, node
    /// selector); training ignores it. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<DeploySpec>,
}

impl Spec {
    /// SHA-256 (hex) of what determines the run's results: the resolved spec without where it
    /// writes (`run.out_dir`), how many threads compute (weights do not depend on it), and the
    /// per-host files and deployment settings (`cluster.token_file`, `cluster.tls`,
    /// `[deploy]`). A sweep skips a trial whose folder recorded the same hash; the tasks of a
    /// job must agree on it.
    pub fn results_sha256(&self) -> String {
        sha256_json(&self.results_view())
    }

    /// One short hash per key path of what [`Spec::results_sha256`] covers
    /// (`optimizer.learning_rate`, `model.layers[1].units`), so that two tasks whose hashes
    /// differ can say in which keys.
    pub fn results_keys(&self) -> std::collections::BTreeMap<String, String> {
        let mut keys = std::collections::BTreeMap::new();
        let value = serde_json::to_value(self.results_view()).unwrap_or_default();
        leaf_hashes(&value, &mut String::new(), &mut keys);
        keys
    }

    fn results_view(&self) -> Spec {
        let mut spec = self.clone();
        spec.run.out_dir = None;
        spec.run.threads = None;
        // Where a run is tracked changes nothing it computes.
        spec.run.tracking = None;
        spec.cluster.token_file = None;
        spec.cluster.tls = None;
        spec.deploy = None;
        spec
    }
}

fn leaf_hashes(value: &serde_json::Value, path: &mut String, out: &mut std::collections::BTreeMap<String, String>) {
    use serde_json::Value;
    use sha2::{Digest, Sha256};
    let len = path.len();
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                leaf_hashes(v, path, out);
                path.truncate(len);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                leaf_hashes(v, path, out);
                path.truncate(len);
            }
        }
        leaf => {
            let digest = Sha256::digest(leaf.to_string().as_bytes());
            out.insert(path.clone(), digest.iter().take(8).map(|b| format!("{b:02x}")).collect());
        }
    }
}

/// SHA-256 (hex) of `spec` serialized as JSON.
pub fn sha256_json(spec: &Spec) -> String {
    use sha2::{Digest, Sha256};
    // Serializing plain data to JSON cannot fail; an empty hash would only ever mismatch.
    let json = serde_json::to_vec(spec).unwrap_or_default();
    Sha256::digest(&json).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn the_results_hash_ignores_where_and_how_many_threads_only() {
        let spec = Spec::default();
        let hash = spec.results_sha256();
        assert_eq!(hash.len(), 64);
        assert_eq!(hash, spec.clone().results_sha256(), "stable");
        let mut moved = spec.clone();
        moved.run.out_dir = Some(PathBuf::from("elsewhere"));
        moved.run.threads = NonZeroUsize::new(7);
        assert_eq!(moved.results_sha256(), hash, "folder and threads do not change results");
        let mut other = spec.clone();
        other.optimizer.learning_rate = Some(0.5);
        assert_ne!(other.results_sha256(), hash);
        let mut reseeded = spec.clone();
        reseeded.run.seed = 1;
        assert_ne!(reseeded.results_sha256(), hash);
        let mut hosted = spec;
        hosted.cluster.token_file = Some(PathBuf::from("/etc/token"));
        hosted.deploy = Some(DeploySpec::default());
        assert_eq!(hosted.results_sha256(), hash, "per-host files and deployment do not change results");
    }

    #[test]
    fn results_keys_name_the_leaves_that_differ() {
        let spec = Spec::default();
        let mut other = spec.clone();
        other.optimizer.learning_rate = Some(0.5);
        other.run.out_dir = Some(PathBuf::from("elsewhere"));
        let (a, b) = (spec.results_keys(), other.results_keys());
        let differ: std::collections::BTreeSet<&String> =
            a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k)).collect();
        assert_eq!(differ.into_iter().collect::<Vec<_>>(), ["optimizer.learning_rate"]);
        assert!(a.contains_key("run.seed"));
    }
}

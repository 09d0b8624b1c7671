//! `[run]`: what the run is called, where it writes, how it is seeded and threaded, and where
//! it is tracked.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;

pub use super::tracking::TrackingSpec;

/// `[run]`: identity, seed, output folder and threads of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Name of the run, used in logs and for the default output folder.
    /// Default: the spec file's stem. Example: `name = "mnist_single"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Seed for every random choice (initial weights, shuffling, dropout). The same spec and
    /// seed give bit-identical weights. Default: `42`. Example: `seed = 7`.
    #[serde(default = "default_seed")]
    pub seed: u64,

    /// Folder the run writes (resolved spec, `run.json`, `metrics.jsonl`, TensorBoard events,
    /// `summary.json`; a sweep's trial folders), relative to the working directory. Default: `runs/<name>`. Example: `out_dir = "runs/lr_sweep/a"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_dir: Option<PathBuf>,

    /// Compute threads per task process. Default: every core the machine has.
    /// Example: `threads = 2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<NonZeroUsize>,

    /// The chief logs training loss, accuracy, learning rate and examples/s, averaged over
    /// this many steps, to `metrics.jsonl` (`step` lines) and TensorBoard (`batch_*` scalars);
    /// epochs and evaluations are always logged. Default: `10`. Example: `log_every_steps = 50`.
    #[serde(default = "default_log_every_steps")]
    pub log_every_steps: NonZeroU64,

    /// Which CPU family's speed thresholds the engine takes (where the dense layer walks a
    /// ReLU's nonzeros instead of calling gemm, and whether `vdpbf16ps` is used): `intel_amx`,
    /// `intel_avx512`, `amd_zen4`, `amd_zen5` or `other`. They decide the order of some sums,
    /// so the same spec and seed give the same bits on CPUs of one family and may differ in
    /// the last bits between families; pin one to get the same bits on a mixed fleet (at the
    /// pinned family's speed). `trainrun check` prints the row a run takes. Default: this
    /// CPU's family. Example: `cpu_tuning = "amd_zen4"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_tuning: Option<crate::engine::tuning::CpuFamily>,

    /// Where the chief also logs the run: an MLflow tracking server (`[run.tracking]`).
    /// Default: none, unless `MLFLOW_TRACKING_URI` is set. Example:
    /// `tracking = { mlflow = "http://127.0.0.1:5000" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingSpec>,
}

fn default_seed() -> u64 {
    42
}

fn default_log_every_steps() -> NonZeroU64 {
    NonZeroU64::new(10).unwrap_or(NonZeroU64::MIN)
}

impl Default for RunSpec {
    fn default() -> Self {
        Self {
            name: None,
            seed: default_seed(),
            out_dir: None,
            threads: None,
            log_every_steps: default_log_every_steps(),
            cpu_tuning: None,
            tracking: None,
        }
    }
}

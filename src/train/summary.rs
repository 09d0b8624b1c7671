//! `summary.json`: how the run ended, its final losses and listed metrics, its throughput and
//! its hashes, written once at the end. A sweep reads it to rank trials and to skip those
//! already complete.

use crate::metrics::Reading;
pub use crate::strategy::ParameterServerStats;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// trainrun version.
    pub trainrun_version: &'static str,
    /// Run name.
    pub name: String,
    /// Run seed.
    pub seed: u64,
    /// Why training stopped: `completed`, `early_stopping`, `target_reached`.
    pub stopped: super::callbacks::StopReason,
    /// Mean training loss of the last epoch.
    pub train_loss: f64,
    /// Training accuracy of the last epoch; none for float targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_accuracy: Option<f64>,
    /// Final test-split loss.
    pub test_loss: Option<f64>,
    /// Final test-split accuracy.
    pub test_accuracy: Option<f64>,
    /// Optimizer steps done.
    pub steps: u64,
    /// Training examples processed (all replicas).
    pub examples: u64,
    /// Launch to exit, seconds.
    pub wall_s: f64,
    /// Launch to the first training step, seconds.
    pub first_step_s: f64,
    /// Seconds the step loop waited for the input pipeline's batches (this task's), summed
    /// over every step: near 0 when the pipeline keeps ahead of training.
    pub input_wait_s: f64,
    /// Training throughput after the first epoch (or after warm-up steps in a one-epoch run),
    /// evaluation excluded.
    pub steady_examples_per_s: f64,
    /// Peak resident memory of this process, MB.
    pub peak_rss_mb: f64,
    /// The metrics `train.metrics` lists beyond loss and accuracy: `train_perplexity`,
    /// `test_perplexity`, `steady_tokens_per_s`, `train_mae`, `test_rmse`, …
    #[serde(flatten)]
    pub metrics: SummaryMetrics,
    /// SHA-256 of the final weights (`model.safetensors` content order), for determinism checks.
    pub weights_sha256: String,
    /// Trainable parameters.
    pub params: usize,
    /// Compute threads used.
    pub threads: usize,
    /// Replicas whose gradients were summed each step.
    pub num_replicas_in_sync: usize,
    /// Worker processes that trained.
    pub num_workers: usize,
    /// How gradients travelled between workers (`shared_memory`, `tcp`, or `tcp_tls` under
    /// `cluster.tls`), if they did.
    pub transport: Option<&'static str>,
    /// The step of the backup this run resumed from, if it did.
    pub resumed_from_step: Option<u64>,
    /// Checkpoints this process wrote (model checkpoints and backups), when it saves any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints_written: Option<u64>,
    /// The longest a save blocked a training step (snapshot and queueing), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_block_ms_max: Option<f64>,
    /// The longest background write of one checkpoint (files, fsyncs, pruning), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_write_ms_max: Option<f64>,
    /// Under `parameter_server`: steps applied per worker, rescheduled, staleness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter_server: Option<ParameterServerStats>,
    /// Tasks of a multi-worker job whose median step (its own work, waits excluded) was over
    /// 1.5 times the job's median of medians at the end: task, `p50_ms`, `p90_ms` and `slower`
    /// (the ratio). Absent when none was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<crate::cluster::Straggler>,
}

/// The metrics a spec lists beyond loss and accuracy, from the last epoch's sums and the
/// final evaluation's, as `summary.json` names them: `train_mae`, `test_mae`, and a
/// throughput's own name (`steady_tokens_per_s`, measured as `steady_examples_per_s`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummaryMetrics(pub Reading);

impl Serialize for SummaryMetrics {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (metric, split, value) in self.0.values() {
            map.serialize_entry(&metric.summary_key(split), &value)?;
        }
        map.end()
    }
}

/// `summary.json`: the summary and the hash of the spec that produced it.
#[derive(Serialize)]
pub(super) struct SummaryFile<'a> {
    #[serde(flatten)]
    pub summary: &'a Summary,
    /// The plan's results hash ([`crate::plan::SpecHashes::results`]): a sweep skips a trial
    /// whose folder holds the same.
    pub spec_sha256: &'a str,
}

/// Peak resident set size of this process in MB (0 where the OS does not say).
pub fn peak_rss_mb() -> f64 {
    // Linux's `ru_maxrss` starts at the forking parent's peak (it survives exec), so a run
    // started by a big process (a test harness, a notebook) reported that process's memory.
    // `VmHWM` is this address space's own high-water mark.
    let hwm = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    });
    if let Some(kb) = hwm {
        return kb / 1024.0;
    }
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    // Linux reports kilobytes, macOS bytes.
    let kb = if cfg!(target_os = "macos") { usage.ru_maxrss as f64 / 1024.0 } else { usage.ru_maxrss as f64 };
    kb / 1024.0
}

//! The run folder: the resolved spec, `metrics.jsonl` (one line per epoch and evaluation), and
//! `summary.json` at the end.

use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricsLine {
    /// `epoch` (end of an epoch) or `evaluation` (a step-interval evaluation).
    pub event: &'static str,
    /// 1-based epoch.
    pub epoch: u64,
    /// Optimizer steps done.
    pub step: u64,
    /// Mean training loss of the epoch so far.
    pub loss: f64,
    /// Training accuracy of the epoch so far.
    pub accuracy: f64,
    /// Test-split loss, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Test-split accuracy, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Learning rate of the last step.
    pub learning_rate: f64,
    /// Training examples per second over the epoch (steps only, not evaluation).
    pub examples_per_s: f64,
    /// Seconds since launch.
    pub wall_s: f64,
}

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
    pub stopped: &'static str,
    /// Mean training loss of the last epoch.
    pub train_loss: f64,
    /// Training accuracy of the last epoch.
    pub train_accuracy: f64,
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
    /// Training throughput after the first epoch (or after warm-up steps in a one-epoch run),
    /// evaluation excluded.
    pub steady_examples_per_s: f64,
    /// Peak resident memory of this process, MB.
    pub peak_rss_mb: f64,
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
    /// How gradients travelled between workers (`shared_memory`, `tcp`), if they did.
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
}

/// Writes the files of one run folder.
pub struct RunDir {
    dir: PathBuf,
    metrics: BufWriter<File>,
}

/// A file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct RecordError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |source| RecordError { path: path.to_path_buf(), source }
}

impl RunDir {
    /// Creates `dir` and writes the resolved spec into it.
    pub fn create(dir: &Path, resolved_spec: &str) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let spec = dir.join("spec.toml");
        std::fs::write(&spec, resolved_spec).map_err(io(&spec))?;
        let path = dir.join("metrics.jsonl");
        let metrics = BufWriter::new(File::create(&path).map_err(io(&path))?);
        Ok(Self { dir: dir.to_path_buf(), metrics })
    }

    /// Reopens `dir` for a run resumed after `step`: `metrics.jsonl` keeps its lines up to
    /// that step (later ones are trained again) and continues.
    pub fn resume(dir: &Path, resolved_spec: &str, step: u64) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let spec = dir.join("spec.toml");
        std::fs::write(&spec, resolved_spec).map_err(io(&spec))?;
        let path = dir.join("metrics.jsonl");
        let old = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io(&path)(e)),
        };
        let mut kept = String::new();
        for line in old.lines() {
            let at = serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v["step"].as_u64());
            if at.is_some_and(|s| s <= step) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        let tmp = dir.join("metrics.jsonl.tmp");
        std::fs::write(&tmp, kept).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(io(&path))?;
        Ok(Self { dir: dir.to_path_buf(), metrics: BufWriter::new(file) })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Appends a line to `metrics.jsonl` (flushed, so a killed run keeps its history).
    pub fn metrics(&mut self, line: &MetricsLine) -> Result<(), RecordError> {
        let path = self.dir.join("metrics.jsonl");
        let text = serde_json::to_string(line).map_err(|e| RecordError { path: path.clone(), source: e.into() })?;
        writeln!(self.metrics, "{text}").and_then(|_| self.metrics.flush()).map_err(io(&path))
    }

    /// Writes `summary.json`.
    pub fn summary(&self, summary: &Summary) -> Result<(), RecordError> {
        let path = self.dir.join("summary.json");
        let text =
            serde_json::to_string_pretty(summary).map_err(|e| RecordError { path: path.clone(), source: e.into() })?;
        std::fs::write(&path, text + "\n").map_err(io(&path))
    }
}

/// Peak resident set size of this process in MB (0 where the OS does not say).
pub fn peak_rss_mb() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    // Linux reports kilobytes, macOS bytes.
    let kb = if cfg!(target_os = "macos") { usage.ru_maxrss as f64 / 1024.0 } else { usage.ru_maxrss as f64 };
    kb / 1024.0
}

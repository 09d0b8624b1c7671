//! The run folder: the resolved spec, `run.json` (how to reproduce the run and how it ended),
//! `metrics.jsonl` (one line every `run.log_every_steps` steps, per epoch and per
//! evaluation), TensorBoard event files under `tensorboard/` (Keras's layout: `train/` and
//! `validation/`), and `summary.json` at the end.

use super::run_record::RunRecord;
use super::tensorboard::EventWriter;
use crate::engine::BatchStats;
pub use crate::strategy::ParameterServerStats;
use crate::vocab::Metric;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    pub accuracy: f64,
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
}

impl MetricsLine {
    /// The line of `logs` (an epoch's end or an evaluation) at `per_s` examples per second,
    /// `wall_s` after launch, with the plan's named `metrics`.
    pub fn of(event: MetricsEvent, logs: &super::callbacks::Logs, per_s: f64, wall_s: f64, metrics: &[Metric]) -> Self {
        MetricsLine {
            event,
            epoch: logs.epoch,
            step: logs.step,
            loss: logs.loss,
            accuracy: logs.accuracy,
            val_loss: logs.val_loss,
            val_accuracy: logs.val_accuracy,
            learning_rate: logs.learning_rate,
            examples_per_s: per_s,
            wall_s,
            named: NamedMetrics::of(metrics, logs.loss, logs.val_loss, per_s),
            parameter_server: None,
        }
    }
}

/// The metrics a spec names in `train.metrics` besides accuracy (which is always written), on
/// one line of `metrics.jsonl`; absent unless listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct NamedMetrics {
    /// `exp(loss)`: the training perplexity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// `exp(val_loss)`, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_perplexity: Option<f64>,
    /// Training tokens per second over the epoch or the last steps (as `examples_per_s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Mean absolute error of the training batches (as `loss`), against float targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mae: Option<f64>,
    /// Mean absolute error on the test split, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_mae: Option<f64>,
    /// Root mean squared error of the training batches, against float targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    /// Root mean squared error on the test split, when evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_rmse: Option<f64>,
}

impl NamedMetrics {
    /// The metrics of `listed` for a line with these losses and throughput (a language
    /// model's loss terms and "examples" are its tokens).
    pub fn of(listed: &[Metric], loss: f64, val_loss: Option<f64>, tokens_per_s: f64) -> Self {
        let mut named = Self::default();
        for metric in listed {
            match metric {
                Metric::Accuracy => {}
                Metric::Perplexity => {
                    named.perplexity = Some(loss.exp());
                    named.val_perplexity = val_loss.map(f64::exp);
                }
                Metric::TokensPerS => named.tokens_per_s = Some(tokens_per_s),
                // From the error sums: see `errors`.
                Metric::Mae | Metric::Rmse => {}
            }
        }
        named
    }

    /// With the regression errors of `listed` from the training sums `train` and the
    /// evaluation's `val`, when there is one.
    pub fn errors(mut self, listed: &[Metric], train: &BatchStats, val: Option<&BatchStats>) -> Self {
        if listed.contains(&Metric::Mae) {
            self.mae = Some(train.mae());
            self.val_mae = val.map(BatchStats::mae);
        }
        if listed.contains(&Metric::Rmse) {
            self.rmse = Some(train.rmse());
            self.val_rmse = val.map(BatchStats::rmse);
        }
        self
    }

    /// The validation scalars (`name`, value) beyond loss and accuracy.
    fn val_scalars(&self) -> impl Iterator<Item = (&'static str, f64)> {
        let perplexity = self.val_perplexity.map(|v| ("perplexity", v));
        let errors = self.val_mae.map(|v| ("mae", v)).into_iter().chain(self.val_rmse.map(|v| ("rmse", v)));
        perplexity.into_iter().chain(errors)
    }

    /// TensorBoard's scalars of the training curve (`batch_`/`epoch_` prefixed).
    fn train_scalars(&self) -> impl Iterator<Item = (&'static str, f64)> {
        let perplexity = self.perplexity.map(|v| ("perplexity", v));
        let errors = self.mae.map(|v| ("mae", v)).into_iter().chain(self.rmse.map(|v| ("rmse", v)));
        perplexity.into_iter().chain(self.tokens_per_s.map(|v| ("tokens_per_s", v))).chain(errors)
    }
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
    pub stopped: super::callbacks::StopReason,
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
    /// Seconds the step loop waited for the input pipeline's batches (this task's), summed
    /// over every step: near 0 when the pipeline keeps ahead of training.
    pub input_wait_s: f64,
    /// Training throughput after the first epoch (or after warm-up steps in a one-epoch run),
    /// evaluation excluded.
    pub steady_examples_per_s: f64,
    /// Peak resident memory of this process, MB.
    pub peak_rss_mb: f64,
    /// `exp(train_loss)`, when `train.metrics` lists `perplexity`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_perplexity: Option<f64>,
    /// `exp(test_loss)`, when `train.metrics` lists `perplexity` and there is a test split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_perplexity: Option<f64>,
    /// Training tokens per second measured as `steady_examples_per_s`, when `train.metrics`
    /// lists `tokens_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_tokens_per_s: Option<f64>,
    /// Mean absolute error of the last epoch's training batches, when `train.metrics` lists
    /// `mae`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_mae: Option<f64>,
    /// Mean absolute error on the test split, when `train.metrics` lists `mae`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_mae: Option<f64>,
    /// Root mean squared error of the last epoch's training batches, when listed (`rmse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_rmse: Option<f64>,
    /// Root mean squared error on the test split, when `train.metrics` lists `rmse`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rmse: Option<f64>,
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
}

/// `summary.json`: the summary and the hash of the spec that produced it.
#[derive(Serialize)]
struct SummaryFile<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    /// The plan's results hash ([`crate::plan::SpecHashes::results`]): a sweep skips a trial
    /// whose folder holds the same.
    spec_sha256: &'a str,
}

/// How a run folder is written.
#[derive(Debug, Clone)]
pub struct RunDirOptions {
    /// The resolved spec, as TOML.
    pub resolved_spec: String,
    /// The plan's results hash of it ([`crate::plan::SpecHashes::results`]).
    pub spec_sha256: String,
    /// Steps per `step` line and TensorBoard `batch_*` scalars.
    pub log_every_steps: u64,
    /// When the process started, for `wall_s`.
    pub launched: Instant,
    /// `train.metrics`: which of [`NamedMetrics`] the lines carry.
    pub metrics: Vec<Metric>,
}

/// Training steps since the last `step` line.
#[derive(Debug, Default)]
struct Interval {
    stats: BatchStats,
    time: Duration,
}

/// Writes the files of one run folder.
pub struct RunDir {
    dir: PathBuf,
    metrics: BufWriter<File>,
    options: RunDirOptions,
    interval: Interval,
    train: EventWriter,
    /// Opened at the first evaluation, so runs that never evaluate have no empty curve.
    validation: Option<EventWriter>,
    /// The last line written, whose epoch and learning rate the final evaluation repeats.
    last: Option<MetricsLine>,
    /// The step of the last evaluation written.
    evaluated_at: Option<u64>,
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

/// Writes `value` as pretty JSON to `path` through a temporary file, so readers (a sweep
/// deciding what is complete) never see half a file.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), RecordError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| RecordError { path: path.into(), source: e.into() })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n").and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
        // A full disk must not keep a half-written temporary file.
        let _ = std::fs::remove_file(&tmp);
        io(path)(e)
    })
}

impl RunDir {
    /// Creates `dir`, writes the resolved spec into it and starts `metrics.jsonl` and the
    /// TensorBoard files. Event files of an earlier run into the same folder are removed:
    /// TensorBoard would draw both.
    pub fn create(dir: &Path, options: RunDirOptions) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join("metrics.jsonl");
        let metrics = BufWriter::new(File::create(&path).map_err(io(&path))?);
        for sub in ["train", "validation"] {
            let events = dir.join("tensorboard").join(sub);
            for entry in std::fs::read_dir(&events).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with("events.out.tfevents.") {
                    std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
                }
            }
        }
        Self::open(dir, options, metrics)
    }

    /// Reopens `dir` for a run resumed after `step`: `metrics.jsonl` keeps its lines up to
    /// that step (later ones are trained again) and continues; TensorBoard gets a new event
    /// file, and its reader drops the old file's steps past the resumed one.
    pub fn resume(dir: &Path, options: RunDirOptions, step: u64) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
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
        Self::open(dir, options, BufWriter::new(file))
    }

    fn open(dir: &Path, options: RunDirOptions, metrics: BufWriter<File>) -> Result<Self, RecordError> {
        let spec = dir.join("spec.toml");
        std::fs::write(&spec, &options.resolved_spec).map_err(io(&spec))?;
        let events = dir.join("tensorboard").join("train");
        let train = EventWriter::create(&events).map_err(io(&events))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            metrics,
            options,
            interval: Interval::default(),
            train,
            validation: None,
            last: None,
            evaluated_at: None,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `run.json`.
    pub fn record(&self, record: &RunRecord) -> Result<(), RecordError> {
        write_json(&self.dir.join("run.json"), record)
    }

    /// Counts one training step; every `log_every_steps` steps, writes a `step` line and
    /// TensorBoard's `batch_*` scalars averaged over them.
    pub fn step(
        &mut self,
        epoch: u64,
        step: u64,
        stats: BatchStats,
        lr: f64,
        took: Duration,
    ) -> Result<(), RecordError> {
        self.interval.stats.add(stats);
        self.interval.time += took;
        if !step.is_multiple_of(self.options.log_every_steps.max(1)) {
            return Ok(());
        }
        let Interval { stats, time } = std::mem::take(&mut self.interval);
        let per_s = stats.examples as f64 / time.as_secs_f64().max(1e-9);
        let line = MetricsLine {
            event: MetricsEvent::Step,
            epoch,
            step,
            loss: stats.loss(),
            accuracy: stats.accuracy(),
            val_loss: None,
            val_accuracy: None,
            learning_rate: lr,
            examples_per_s: per_s,
            wall_s: self.options.launched.elapsed().as_secs_f64(),
            named: NamedMetrics::of(&self.options.metrics, stats.loss(), None, per_s).errors(
                &self.options.metrics,
                &stats,
                None,
            ),
            parameter_server: None,
        };
        self.metrics(&line)
    }

    /// Appends a line to `metrics.jsonl` (flushed, so a killed run keeps its history) and
    /// its scalars to the TensorBoard files.
    pub fn metrics(&mut self, line: &MetricsLine) -> Result<(), RecordError> {
        let path = self.dir.join("metrics.jsonl");
        let text = serde_json::to_string(line).map_err(|e| RecordError { path: path.clone(), source: e.into() })?;
        writeln!(self.metrics, "{text}").and_then(|_| self.metrics.flush()).map_err(io(&path))?;
        self.events(line)?;
        if line.event != MetricsEvent::Step {
            self.last = Some(line.clone());
        }
        Ok(())
    }

    /// TensorBoard scalars with Keras's names: `batch_*` every N steps and `epoch_*` per
    /// epoch (step = epoch) in `train/`; in `validation/`, `epoch_*` and
    /// `evaluation_*_vs_iterations` (step = optimizer step).
    fn events(&mut self, line: &MetricsLine) -> Result<(), RecordError> {
        let train: Vec<(&str, f64)> = [
            ("loss", line.loss),
            ("accuracy", line.accuracy),
            ("learning_rate", line.learning_rate),
            ("examples_per_s", line.examples_per_s),
        ]
        .into_iter()
        .chain(line.named.train_scalars())
        .collect();
        let named = |prefix: &str| train.iter().map(|(k, v)| (format!("{prefix}_{k}"), *v)).collect::<Vec<_>>();
        let train_path = self.train.path().to_path_buf();
        match line.event {
            MetricsEvent::Step => write(&mut self.train, line.step, &named("batch")).map_err(io(&train_path))?,
            MetricsEvent::Epoch => write(&mut self.train, line.epoch, &named("epoch")).map_err(io(&train_path))?,
            MetricsEvent::Evaluation => {}
        }
        let (Some(loss), Some(accuracy)) = (line.val_loss, line.val_accuracy) else {
            return Ok(());
        };
        // An epoch's line repeats an evaluation made at the same step: one point per step.
        let repeated = self.evaluated_at == Some(line.step);
        self.evaluated_at = Some(line.step);
        let events = self.dir.join("tensorboard").join("validation");
        let validation = match &mut self.validation {
            Some(v) => v,
            None => self.validation.insert(EventWriter::create(&events).map_err(io(&events))?),
        };
        if line.event == MetricsEvent::Epoch {
            let mut per_epoch = vec![("epoch_loss".to_string(), loss), ("epoch_accuracy".to_string(), accuracy)];
            per_epoch.extend(line.named.val_scalars().map(|(k, v)| (format!("epoch_{k}"), v)));
            write(validation, line.epoch, &per_epoch).map_err(io(&events))?;
        }
        if repeated {
            return Ok(());
        }
        let mut per_step = vec![
            ("evaluation_loss_vs_iterations".to_string(), loss),
            ("evaluation_accuracy_vs_iterations".to_string(), accuracy),
        ];
        per_step.extend(line.named.val_scalars().map(|(k, v)| (format!("evaluation_{k}_vs_iterations"), v)));
        write(validation, line.step, &per_step).map_err(io(&events))
    }

    /// Writes `summary.json`; a final evaluation not logged yet (runs that evaluate only at
    /// the end) gets its `evaluation` line and scalars first.
    pub fn summary(&mut self, summary: &Summary) -> Result<(), RecordError> {
        if let (Some(loss), Some(accuracy)) = (summary.test_loss, summary.test_accuracy)
            && self.evaluated_at != Some(summary.steps)
        {
            let last = self.last.as_ref();
            let per_s = last.map_or(0.0, |l| l.examples_per_s);
            let line = MetricsLine {
                event: MetricsEvent::Evaluation,
                epoch: last.map_or(1, |l| l.epoch),
                step: summary.steps,
                loss: summary.train_loss,
                accuracy: summary.train_accuracy,
                val_loss: Some(loss),
                val_accuracy: Some(accuracy),
                learning_rate: last.map_or(0.0, |l| l.learning_rate),
                examples_per_s: per_s,
                wall_s: self.options.launched.elapsed().as_secs_f64(),
                named: NamedMetrics {
                    mae: summary.train_mae,
                    val_mae: summary.test_mae,
                    rmse: summary.train_rmse,
                    val_rmse: summary.test_rmse,
                    ..NamedMetrics::of(&self.options.metrics, summary.train_loss, Some(loss), per_s)
                },
                parameter_server: None,
            };
            self.metrics(&line)?;
        }
        let file = SummaryFile { summary, spec_sha256: &self.options.spec_sha256 };
        write_json(&self.dir.join("summary.json"), &file)
    }
}

fn write(w: &mut EventWriter, step: u64, scalars: &[(String, f64)]) -> std::io::Result<()> {
    let refs: Vec<(&str, f64)> = scalars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    w.scalars(step, &refs)
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

//! The run folder: the resolved spec, `run.json` ([`super::run_json`]), `metrics.jsonl`
//! ([`super::metrics_log`]), TensorBoard event files under `tensorboard/` (Keras's layout:
//! `train/` and `validation/`), and `summary.json` ([`super::summary`]) at the end.

use super::metrics_log::{LineSink, MetricsEvent, MetricsLine, NamedMetrics};
use super::run_json::RunRecord;
use super::summary::{Summary, SummaryFile};
use super::tensorboard::EventWriter;
use crate::metrics::{Reading, SplitKind, Sums};
use crate::vocab::MetricKind;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The run folder's lock file: the process that owns the folder holds an advisory lock
/// (`flock`) on it while it runs, which the kernel releases however the process ends.
pub const LOCK_FILE: &str = "run.lock";

/// Whether a live process holds the lock of run folder `dir`: no when the folder has no lock
/// file or nobody holds it (the run ended, however it ended). Probing takes the lock for an
/// instant (a run starting meanwhile retries, so it is not refused); a lock that cannot be
/// probed counts as held, so a live run is never taken for gone.
pub fn in_use(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(LOCK_FILE)) else { return false };
    match file.try_lock() {
        // Dropping the file releases it.
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock | std::fs::TryLockError::Error(_)) => true,
    }
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
    /// `train.metrics`: which metrics the lines carry.
    pub metrics: Vec<MetricKind>,
    /// Whether the lines carry accuracy: class labels do, float targets do not.
    pub accuracy: bool,
}

/// Training steps since the last `step` line.
#[derive(Debug, Default)]
struct Interval {
    stats: Sums,
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
    /// Where the lines also go (a tracking server), if anywhere.
    sink: Option<Box<dyn LineSink>>,
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
    /// TensorBoard would draw both; so are its `summary.json` and final weights, which would
    /// pass for this run's until it ends.
    pub fn create(dir: &Path, options: RunDirOptions) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for earlier in ["summary.json", "model.safetensors"] {
            match std::fs::remove_file(dir.join(earlier)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&dir.join(earlier))(e)),
                Ok(()) | Err(_) => {}
            }
        }
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
            sink: None,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Hands every line written from now on to `sink` too.
    pub fn also_to(&mut self, sink: Box<dyn LineSink>) {
        self.sink = Some(sink);
    }

    /// Writes `run.json`.
    pub fn record(&self, record: &RunRecord) -> Result<(), RecordError> {
        write_json(&self.dir.join("run.json"), record)
    }

    /// Counts one training step; every `log_every_steps` steps, writes a `step` line and
    /// TensorBoard's `batch_*` scalars averaged over them.
    pub fn step(&mut self, epoch: u64, step: u64, stats: Sums, lr: f64, took: Duration) -> Result<(), RecordError> {
        self.interval.stats.add(stats);
        self.interval.time += took;
        if !step.is_multiple_of(self.options.log_every_steps.max(1)) {
            return Ok(());
        }
        let Interval { stats, time } = std::mem::take(&mut self.interval);
        let per_s = stats.examples() as f64 / time.as_secs_f64().max(1e-9);
        let line = MetricsLine {
            event: MetricsEvent::Step,
            epoch,
            step,
            loss: stats.loss(),
            accuracy: self.options.accuracy.then(|| stats.accuracy()),
            val_loss: None,
            val_accuracy: None,
            learning_rate: lr,
            examples_per_s: per_s,
            wall_s: self.options.launched.elapsed().as_secs_f64(),
            named: NamedMetrics(Reading::new(&self.options.metrics, stats, None, per_s)),
            parameter_server: None,
            stragglers: Vec::new(),
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
        if let Some(sink) = &mut self.sink {
            sink.line(line);
        }
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
            ("loss", Some(line.loss)),
            ("accuracy", line.accuracy),
            ("learning_rate", Some(line.learning_rate)),
            ("examples_per_s", Some(line.examples_per_s)),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .chain(line.named.scalars(SplitKind::Train))
        .collect();
        let named = |prefix: &str| train.iter().map(|(k, v)| (format!("{prefix}_{k}"), *v)).collect::<Vec<_>>();
        let train_path = self.train.path().to_path_buf();
        match line.event {
            MetricsEvent::Step => write(&mut self.train, line.step, &named("batch")).map_err(io(&train_path))?,
            MetricsEvent::Epoch => write(&mut self.train, line.epoch, &named("epoch")).map_err(io(&train_path))?,
            MetricsEvent::Evaluation => {}
        }
        let Some(loss) = line.val_loss else {
            return Ok(());
        };
        // Float targets have no accuracy: their validation scalars are the loss and the listed metrics.
        let accuracy = |name: &str| line.val_accuracy.map(|a| (name.to_string(), a));
        // An epoch's line repeats an evaluation made at the same step: one point per step.
        let repeated = self.evaluated_at == Some(line.step);
        self.evaluated_at = Some(line.step);
        let events = self.dir.join("tensorboard").join("validation");
        let validation = match &mut self.validation {
            Some(v) => v,
            None => self.validation.insert(EventWriter::create(&events).map_err(io(&events))?),
        };
        if line.event == MetricsEvent::Epoch {
            let mut per_epoch: Vec<(String, f64)> =
                [Some(("epoch_loss".to_string(), loss)), accuracy("epoch_accuracy")].into_iter().flatten().collect();
            per_epoch.extend(line.named.scalars(SplitKind::Test).map(|(k, v)| (format!("epoch_{k}"), v)));
            write(validation, line.epoch, &per_epoch).map_err(io(&events))?;
        }
        if repeated {
            return Ok(());
        }
        let mut per_step: Vec<(String, f64)> =
            [Some(("evaluation_loss_vs_iterations".to_string(), loss)), accuracy("evaluation_accuracy_vs_iterations")]
                .into_iter()
                .flatten()
                .collect();
        per_step.extend(line.named.scalars(SplitKind::Test).map(|(k, v)| (format!("evaluation_{k}_vs_iterations"), v)));
        write(validation, line.step, &per_step).map_err(io(&events))
    }

    /// Writes `summary.json`; a final evaluation not logged yet (runs that evaluate only at
    /// the end) gets its `evaluation` line and scalars first.
    pub fn summary(&mut self, summary: &Summary) -> Result<(), RecordError> {
        if let Some(loss) = summary.test_loss
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
                val_accuracy: summary.test_accuracy,
                learning_rate: last.map_or(0.0, |l| l.learning_rate),
                examples_per_s: per_s,
                wall_s: self.options.launched.elapsed().as_secs_f64(),
                named: NamedMetrics(summary.metrics.0.clone().at(per_s)),
                parameter_server: None,
                stragglers: Vec::new(),
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

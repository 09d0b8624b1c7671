//! The sidecar evaluator (TensorFlow's `SidecarEvaluator`): a task outside the replicas that
//! watches the folder of every `model_checkpoint` callback, evaluates each new checkpoint on
//! the test split exactly once (also across restarts: `eval.jsonl` says which are done), and
//! stops once training has finished and the last checkpoint is evaluated. The same evaluation serves
//! `trainrun eval SPEC --checkpoint PATH`.

use super::TrainError;
use crate::checkpoint::{CheckpointError, Layout, LoadedCheckpoint, Store, store};
use crate::data::{DataError, EvalBatches, Shard, Split};
use crate::metrics::Sums;
use crate::strategy::{Replica, Variables};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the evaluator looks for new checkpoints.
const POLL: Duration = Duration::from_millis(100);

/// One line of `eval.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalLine {
    /// The `model_checkpoint` callback that saved it (`model_checkpoint`, `model_checkpoint_1`, …).
    pub callback: String,
    /// The checkpoint's folder name.
    pub checkpoint: String,
    /// Its step.
    pub step: u64,
    /// Epochs finished at it.
    pub epoch: u64,
    /// Test-split loss.
    pub test_loss: f64,
    /// Test-split accuracy; none for float targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    /// Test examples evaluated.
    pub examples: u64,
    /// Seconds the evaluation took.
    pub eval_s: f64,
}

/// Evaluates `loaded` on all of `test` with `replica`; an example that cannot be read is an
/// error.
pub fn evaluate_checkpoint(
    replica: &mut Replica,
    test: &Split,
    batch: NonZeroUsize,
    loaded: LoadedCheckpoint,
) -> Result<Sums, DataError> {
    let mut vars = Variables { params: loaded.params, state: loaded.state };
    let mut stats = Sums::default();
    let mut batches = EvalBatches::new(test, batch, Shard::WHOLE);
    for b in batches.by_ref() {
        stats.add(replica.evaluate(&mut vars, &b));
    }
    batches.finish()?;
    Ok(stats)
}

/// The (callback, step) pairs `eval.jsonl` already has; a line without a callback (written
/// before evaluators watched more than one folder) is `first`'s.
fn done(path: &Path, first: &str) -> BTreeSet<(String, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let line = serde_json::from_str::<serde_json::Value>(l).ok()?;
            let callback = line["callback"].as_str().unwrap_or(first).to_string();
            Some((callback, line["step"].as_u64()?))
        })
        .collect()
}

/// What the watcher needs.
pub struct CheckpointWatch<'a> {
    /// Each `model_checkpoint` callback's name and folder (at least one).
    pub dirs: Vec<(String, PathBuf)>,
    /// `eval.jsonl`.
    pub out: PathBuf,
    /// The model's tensors.
    pub layout: &'a Layout,
    /// The test split.
    pub test: &'a Split,
    /// Examples per evaluation batch.
    pub batch: NonZeroUsize,
    /// Whether to measure accuracy: class labels have it, float targets do not.
    pub accuracy: bool,
}

/// Watches until `finished` says training is over (it errs when the job failed), evaluating
/// every committed checkpoint once. Returns how many it evaluated.
pub fn watch(
    w: &CheckpointWatch<'_>,
    replica: &mut Replica,
    mut finished: impl FnMut() -> Result<bool, TrainError>,
    mut note: impl FnMut(&str),
) -> Result<usize, TrainError> {
    let stores: Vec<(&str, Store)> = w.dirs.iter().map(|(name, dir)| (name.as_str(), Store::new(dir))).collect();
    let first = stores.first().map_or("", |(name, _)| name);
    let mut seen = done(&w.out, first);
    let mut count = 0;
    loop {
        // Read before scanning: a checkpoint committed before the end is then always seen.
        let last_round = finished()?;
        let mut new = Vec::new();
        for (name, store) in &stores {
            let key = |step| (name.to_string(), step);
            new.extend(
                store.list()?.into_iter().filter(|l| l.committed && !seen.contains(&key(l.step))).map(|l| (*name, l)),
            );
        }
        for (callback, listed) in new {
            let key = (callback.to_string(), listed.step);
            let started = Instant::now();
            let loaded = match store::load(&listed.path, w.layout) {
                Ok(l) => l,
                Err(e @ CheckpointError::Incompatible { .. }) => return Err(e.into()),
                Err(e) => {
                    // Damaged, or deleted by retention while read: it cannot be evaluated.
                    if listed.path.exists() {
                        note(&format!("skipping checkpoint {}: {e}", listed.path.display()));
                    }
                    seen.insert(key);
                    continue;
                }
            };
            let epoch = loaded.manifest.epoch;
            let stats = evaluate_checkpoint(replica, w.test, w.batch, loaded)?;
            let line = EvalLine {
                callback: callback.to_string(),
                checkpoint: store::name(listed.step),
                step: listed.step,
                epoch,
                test_loss: stats.loss(),
                test_accuracy: w.accuracy.then(|| stats.accuracy()),
                examples: stats.examples(),
                eval_s: started.elapsed().as_secs_f64(),
            };
            append(&w.out, &line)?;
            // Which callback saved it only matters when several do.
            let of = if stores.len() > 1 { format!(" of {}", line.callback) } else { String::new() };
            let accuracy = line.test_accuracy.map_or(String::new(), |a| format!(" - test_accuracy: {a:.4}"));
            note(&format!("{}{of} (step {}): test_loss: {:.4}{accuracy}", line.checkpoint, line.step, line.test_loss));
            seen.insert(key);
            count += 1;
        }
        if last_round {
            return Ok(count);
        }
        std::thread::sleep(POLL);
    }
}

fn append(path: &Path, line: &EvalLine) -> Result<(), TrainError> {
    let err = |source| super::RecordError { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let text = serde_json::to_string(line).map_err(|e| err(e.into()))?;
    let mut f = OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
    writeln!(f, "{text}").map_err(err)?;
    Ok(())
}

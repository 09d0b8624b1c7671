//! `trainrun predict SPEC --checkpoint PATH [--input FILE…] --output FILE`: Keras's
//! `model.predict`. The model runs in inference mode over the spec's test split, or over the
//! `--input` files read by the spec's own source (`inputs.rs`), and writes one row per
//! example, in input order, with its index as the id (and, for `--input`, the file and the
//! row in it): the class, the top-k classes and their probabilities for a classifier (softmax
//! when the model ends in logits), the values for regression. The output's extension picks
//! the format (`output.rs`): `.csv`, `.jsonl` or `.npy`. The inputs are preprocessed as the
//! test split is (`[data.preprocessing]`, its statistics from the training split).
//!
//! Under `mirrored` and `multi_worker_mirrored` the batches are dealt to the replicas (model
//! copies on this process's threads) and the workers (processes of the job, started by the
//! launcher for a local cluster: `tasks.rs`), and the chief writes every worker's rows in
//! input order (`rounds.rs`); each replica predicts whole batches of the size one process
//! uses, so one process, `mirrored` and `multi_worker_mirrored` write the same bytes. A
//! process that predicts alone runs one model copy per thread, each on whole batches
//! (`rounds::copies_alone`), for the same bytes on any number of threads. A worker
//! that dies fails the job naming it, within `cluster.timeout`. The output is written whole
//! under a temporary name beside it and renamed into place, so a stop (SIGTERM, Ctrl-C) or an
//! error never leaves a half-written file under its name, and a file that exists is refused
//! unless `--force`; a worker other than the chief writes nothing.

mod inputs;
mod output;
pub(crate) mod rounds;
mod tasks;

use super::{interrupted, join, load_data, load_raw, pool};
use crate::data::{Dataset, LabelKind};
use crate::exit::RunError;
use crate::plan::{Distribution, Part, Plan};
use crate::prepare::{Invocation, prepare};
use inputs::RowOrigins;
use output::{Predicted, PredictionFormat, PredictionWriter};
use rounds::{ModelCopy, Rounds, Sharding};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The most examples one predict batch holds. Larger batches gain nothing on a CPU and lose
/// where a layer's output no longer stays in the last-level cache until the next layer reads
/// it: the tutorial model (an 86.5 KB convolution output an example) predicted 1.75× faster
/// at 64 (5.5 MB) than at the 385 that training's evaluation budget allows with weights
/// trained to 98 % (its sparse walk reads that output twice) and 1.14× with the spec's own,
/// `mnist_fast` 4 % faster, and no batch from 16 to 385 beat 64 by more than 3 % on any of
/// the three models measured (`docs/benchmarks.md`, "Predict against Keras and PyTorch").
const BATCH_MAX: usize = 64;

/// The batch `trainrun predict` runs a model in: [`BATCH_MAX`] examples, fewer where their
/// activations would pass training's evaluation budget.
pub fn batch_size(activation_len: usize) -> usize {
    crate::train::eval_batch_size(NonZeroUsize::MIN, 1, activation_len).get().min(BATCH_MAX)
}

/// What to write.
#[derive(Debug, Clone)]
pub struct PredictOptions {
    /// Files to predict instead of the test split, in this order; none: the test split.
    pub inputs: Vec<PathBuf>,
    /// The output file; its extension picks the format.
    pub output: PathBuf,
    /// Classes listed per row, likeliest first (at most the number of classes).
    pub top_k: NonZeroUsize,
    /// Replace an existing output file.
    pub force: bool,
}

/// Runs the model over the test split and writes its predictions.
pub fn predict(inv: &Invocation, checkpoint: &Path, o: &PredictOptions) -> Result<(), RunError> {
    let format = PredictionFormat::of(&o.output)?;
    if o.output.exists() && !o.force {
        return Err(RunError::Usage(format!(
            "--output {} exists: predictions are never written over a file; give another name, or --force to replace it",
            o.output.display()
        )));
    }
    let stop = crate::signals::stop_requested();
    let p = prepare(inv)?;
    let plan = &p.plan;
    if plan.model.per_position() {
        return Err(RunError::Unsupported(format!(
            "predict writes one row per example, but this spec's model outputs {} (a value per position: a language \
             model); generate text with `trainrun sample`",
            plan.model.output
        )));
    }
    let task = match predict_part(plan)? {
        PredictPart::Launcher => return tasks::launch_tasks(inv, plan, checkpoint, o),
        PredictPart::Task(task) => Some(task),
        PredictPart::Alone => None,
    };
    // Alone, one model copy per thread (at least one per replica); a worker, one per replica.
    // Each has its own buffers and predicts whole batches.
    let replicas = plan.strategy.devices.len().max(1);
    let copy_count = if task.is_some() { replicas } else { rounds::copies_alone(plan, &inv.env) };
    let models = (0..copy_count).map(|_| plan.model.build()).collect::<Result<Vec<_>, _>>();
    let models = models.map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = crate::builder::layout(&models[0]);
    let (params, state) = super::sample::weights(checkpoint, &layout)?;
    refuse_non_finite(checkpoint, &layout, &params, &state)?;
    let (dataset, origins) = examples(inv, plan, &o.inputs)?;
    let test = dataset.test.as_ref().ok_or_else(|| {
        RunError::Usage(
            "the spec's data has no test split, which predict reads without --input: name the files to predict \
             (--input new.csv)"
                .into(),
        )
    })?;
    let predicted = predicted(&dataset, plan, o)?;
    let batch = batch_size(models[0].activation_len());
    let width = predicted.width();
    let workers = plan.strategy.num_workers.max(1);
    let slot_len = batch * width;
    let mut job = task.map(|t| join(inv, plan, t, copy_count * workers * slot_len)).transpose()?;
    let chief = job.as_ref().is_none_or(|j| j.is_chief);
    let mut comm = job.as_mut().and_then(|j| j.comm.as_deref_mut());
    let sharding = Sharding {
        copies: copy_count,
        workers: comm.as_ref().map_or(1, |c| c.world()),
        rank: comm.as_ref().map_or(0, |c| c.rank()),
    };
    let rounds =
        Rounds { split: test, batch, width, params: &params, sharding, threads: (plan.threads / copy_count).max(1) };
    let mut copies: Vec<ModelCopy> =
        models.into_iter().map(|model| ModelCopy { model, state: state.clone() }).collect();
    let examples = test.len();
    let partial = super::partial_beside(&o.output);
    let mut writer =
        if chief { Some(PredictionWriter::create(&partial, format, predicted, origins, examples)?) } else { None };
    let pool = pool(plan.threads)?;
    let bar = progress_bar(inv.quiet || !chief, examples);
    let started = Instant::now();
    let mut buffer = vec![0f32; sharding.per_round() * slot_len];
    let result = (|| {
        let mut done = 0;
        for r in 0..rounds.count() {
            if stop.load(Ordering::Relaxed) {
                return Err(interrupted(RunError::Preempted(format!(
                    "preempted: predict stopped after {done} of {examples} examples; nothing was written to {}",
                    o.output.display()
                ))));
            }
            let outputs = pool.install(|| rounds.run(r, &mut copies, &mut buffer, comm.as_deref_mut()))?;
            for (out, n) in outputs {
                if let Some(w) = writer.as_mut() {
                    w.write_batch(out, n)?;
                }
                done += n;
                bar.inc(n as u64);
            }
        }
        writer.take().map_or(Ok(()), PredictionWriter::finish)
    })();
    bar.finish_and_clear();
    if let (Ok(()), Some(job)) = (&result, job) {
        // The chief tells the workers the job is over, so none takes its exit for a death.
        job.plane.shutdown();
    }
    if !chief {
        return result;
    }
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let secs = started.elapsed().as_secs_f64();
    move_into_place(&partial, o, format, (examples, secs, (sharding.workers, replicas)), inv.quiet)
}

/// Where this process predicts.
enum PredictPart {
    /// It starts the tasks of a local `multi_worker_mirrored` job.
    Launcher,
    /// It is this task of a `multi_worker_mirrored` job.
    Task(crate::cluster::TaskId),
    /// It predicts everything itself.
    Alone,
}

/// Where this process predicts under the plan's strategy and cluster.
fn predict_part(plan: &Plan) -> Result<PredictPart, RunError> {
    match (plan.cluster.part, &plan.strategy.distribution) {
        (Part::Launcher, Distribution::MultiWorkerMirrored(_)) => Ok(PredictPart::Launcher),
        (Part::Task(task), Distribution::MultiWorkerMirrored(_)) => Ok(PredictPart::Task(task)),
        // The other strategies predict in one process, whatever their cluster, as does a
        // one-worker job.
        (
            Part::Single | Part::Launcher,
            Distribution::Default
            | Distribution::OneDevice
            | Distribution::Mirrored(_)
            | Distribution::CentralStorage
            | Distribution::ParameterServer(_),
        )
        | (Part::Single, Distribution::MultiWorkerMirrored(_)) => Ok(PredictPart::Alone),
        (
            Part::Task(task),
            Distribution::Default
            | Distribution::OneDevice
            | Distribution::Mirrored(_)
            | Distribution::CentralStorage
            | Distribution::ParameterServer(_),
        ) => Err(RunError::Unsupported(format!(
            "predict runs as {task} of a {} job, which predicts in one process: run it without TF_CONFIG / \
                 --task (only multi_worker_mirrored shards predictions across workers)",
            plan.strategy.kind().name()
        ))),
    }
}

/// Renames the finished file into place and says what was predicted (`examples` in `secs`,
/// sharded over `(workers, replicas)`), unless quiet.
fn move_into_place(
    partial: &Path,
    o: &PredictOptions,
    format: PredictionFormat,
    (examples, secs, (workers, replicas)): (usize, f64, (usize, usize)),
    quiet: bool,
) -> Result<(), RunError> {
    std::fs::rename(partial, &o.output).map_err(|e| {
        let _ = std::fs::remove_file(partial);
        RunError::Failure(format!("cannot move the predictions into place at {}: {e}", o.output.display()))
    })?;
    if !quiet {
        let shards = match (workers, replicas) {
            (1, 1) => String::new(),
            (w, r) => format!(", sharded over {w} worker(s) × {r} replica(s)"),
        };
        eprintln!(
            "predicted {examples} examples in {secs:.2} s ({:.0} examples/s) into {} ({}{shards})",
            examples as f64 / secs.max(1e-9),
            o.output.display(),
            format.name()
        );
    }
    Ok(())
}

/// What a row holds, from the data's labels.
fn predicted(dataset: &Dataset, plan: &Plan, o: &PredictOptions) -> Result<Predicted, RunError> {
    match dataset.labels {
        LabelKind::Class { classes } => Ok(Predicted::Classes {
            classes: classes as usize,
            names: dataset.classes.as_ref().map(|c| c.names().to_vec()),
            top_k: o.top_k.get().min(classes as usize),
            softmax: plan.train.from_logits,
        }),
        LabelKind::Target { width } => Ok(Predicted::Values { width }),
        LabelKind::Sequence { .. } => Err(RunError::Unsupported(
            "predict writes one row per example; a language model's data has a label per position: use `trainrun sample`"
                .into(),
        )),
    }
}

/// The data to predict, as its test split: the spec's, or the `--input` files with where
/// each row came from.
fn examples(inv: &Invocation, plan: &Plan, files: &[PathBuf]) -> Result<(Dataset, Option<RowOrigins>), RunError> {
    if files.is_empty() {
        return Ok((load_data(inv, plan)?, None));
    }
    let raw = load_raw(inv, plan)?;
    let (split, origins) = inputs::read(&plan.data.source, files, raw.train.shape())?;
    let dataset = plan.data.preprocessing.apply_to_inputs(raw, split, plan.seed)?;
    Ok((dataset, Some(origins)))
}

/// A weight that is NaN or infinite makes every prediction meaningless: refused, naming the
/// tensor.
fn refuse_non_finite(
    checkpoint: &Path,
    layout: &crate::checkpoint::Layout,
    params: &[f32],
    state: &[f32],
) -> Result<(), RunError> {
    let tensors = layout.tensors.iter().map(|t| (t, params)).chain(layout.state_tensors.iter().map(|t| (t, state)));
    for (t, values) in tensors {
        let Some(values) = values.get(t.offset..t.offset + t.len()) else {
            continue;
        };
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(RunError::Usage(format!(
                "{}: tensor {} holds {v} at index {i}: a model with non-finite weights predicts nothing meaningful; \
                 predict from an earlier checkpoint (a run that diverged stops before saving such weights)",
                checkpoint.display(),
                t.name
            )));
        }
    }
    Ok(())
}

/// A bar on a terminal, nothing otherwise (indicatif hides it when stderr is not one).
fn progress_bar(quiet: bool, examples: usize) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(Some(examples as u64), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("predict {bar:30} {pos}/{len} examples, {per_sec}") {
        bar.set_style(style);
    }
    bar
}

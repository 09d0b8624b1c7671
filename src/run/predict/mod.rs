//! `trainrun predict SPEC --checkpoint PATH [--input FILE…] --output FILE`: Keras's
//! `model.predict`. The model runs in inference mode over the spec's test split, or over the
//! `--input` files read by the spec's own source (`inputs.rs`), and writes one row per
//! example, in input order, with its index as the id (and, for `--input`, the file and the
//! row in it): the class, the top-k classes and their probabilities for a classifier (softmax
//! when the model ends in logits), the values for regression. The output's extension picks
//! the format (`output.rs`): `.csv`, `.jsonl` or `.npy`. The inputs are preprocessed as the
//! test split is (`[data.preprocessing]`, its statistics from the training split).
//!
//! Every strategy predicts alike: one model on all of the process's threads, batch after batch
//! of the same size, so one process, `mirrored` and `multi_worker_mirrored` specs write the same
//! bytes. The output is written whole under a temporary name beside it and renamed into place,
//! so a stop (SIGTERM, Ctrl-C) or an error never leaves a half-written file under its name, and
//! a file that exists is refused unless `--force`.

mod inputs;
mod output;

use super::{interrupted, load_data, load_raw, pool};
use crate::data::{Dataset, EvalBatches, LabelKind, Shard};
use crate::engine::Pass;
use crate::exit::RunError;
use crate::prepare::{Invocation, prepare};
use inputs::Origins;
use output::{Predicted, PredictionFormat, PredictionWriter};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

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
    let mut model = plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = crate::builder::layout(&model);
    let (params, mut state) = super::sample::weights(checkpoint, &layout)?;
    refuse_non_finite(checkpoint, &layout, &params, &state)?;
    let (dataset, origins) = examples(inv, plan, &o.inputs)?;
    let test = dataset.test.as_ref().ok_or_else(|| {
        RunError::Usage(
            "the spec's data has no test split, which predict reads without --input: name the files to predict \
             (--input new.csv)"
                .into(),
        )
    })?;
    let predicted = match dataset.labels {
        LabelKind::Class { classes } => Predicted::Classes {
            classes: classes as usize,
            names: dataset.classes.as_ref().map(|c| c.names().to_vec()),
            top_k: o.top_k.get().min(classes as usize),
            softmax: plan.train.from_logits,
        },
        LabelKind::Target { width } => Predicted::Values { width },
        LabelKind::Sequence { .. } => {
            return Err(RunError::Unsupported(
                "predict writes one row per example; a language model's data has a label per position: use `trainrun sample`"
                    .into(),
            ));
        }
    };
    let examples = test.len();
    let partial = super::partial_beside(&o.output);
    let mut writer = PredictionWriter::create(&partial, format, predicted, origins, examples)?;
    let batch = crate::train::eval_batch_size(NonZeroUsize::MIN, 1, model.activation_len());
    let pass = Pass { training: false, seed: 0, accumulate: false, threads: plan.threads };
    let pool = pool(plan.threads)?;
    let bar = progress_bar(inv.quiet, examples);
    let started = Instant::now();
    let mut batches = EvalBatches::new(test, batch, Shard::WHOLE);
    let result = (|| {
        for b in batches.by_ref() {
            if stop.load(Ordering::Relaxed) {
                return Err(interrupted(RunError::Preempted(format!(
                    "preempted: predict stopped after {} of {examples} examples; nothing was written to {}",
                    writer.rows(),
                    o.output.display()
                ))));
            }
            let out = pool.install(|| model.forward(pass, &params, &mut state, &b.x, b.n));
            writer.write_batch(out, b.n)?;
            bar.inc(b.n as u64);
        }
        batches.finish().map_err(RunError::Data)?;
        writer.finish()
    })();
    bar.finish_and_clear();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &o.output).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        RunError::Failure(format!("cannot move the predictions into place at {}: {e}", o.output.display()))
    })?;
    if !inv.quiet {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "predicted {examples} examples in {secs:.2} s ({:.0} examples/s) into {} ({})",
            examples as f64 / secs.max(1e-9),
            o.output.display(),
            format.name()
        );
    }
    Ok(())
}

/// The data to predict, as its test split: the spec's, or the `--input` files with where
/// each row came from.
fn examples(
    inv: &Invocation,
    plan: &crate::plan::Plan,
    files: &[PathBuf],
) -> Result<(Dataset, Option<Origins>), RunError> {
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

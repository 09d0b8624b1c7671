//! The training loop: Keras's `model.fit` over a strategy, with evaluation, callbacks,
//! checkpoints, resumption, preemption, progress and the run record.

pub mod callbacks;
pub mod ended;
pub mod evaluator;
pub mod progress;
pub mod record;
pub mod resume;
pub mod run_record;
pub mod saver;
pub mod tensorboard;
mod weights;

pub use weights::{save_weights, weights_sha256};

use crate::checkpoint::CheckpointError;
use crate::checkpoint::manifest::{EvalState, LoopState, Sums};
use crate::data::{Batch, Dataset, EvalBatches, Pipeline, PipelineOptions, Shard};
use crate::engine::init::derive_seed;
use crate::engine::{BatchStats, Optimizer, TensorInfo};
use crate::plan::Plan;
use crate::strategy::{Strategy, StrategyError, Variables};
use callbacks::{CallbackError, Callbacks, Control, Logs};
use progress::{Progress, Shown};
use record::{MetricsEvent, MetricsLine, RecordError, RunDir, Summary};
use resume::ResumePoint;
use saver::{SavePoint, Saver};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Activation memory an evaluation batch may use: bigger batches run the forward pass's
/// products more efficiently, and per-example results do not depend on the batch size.
const EVAL_BYTES: usize = 32 << 20;

/// Separates per-step randomness (dropout) from the run seed's other uses.
const STEP_DOMAIN: u64 = 0x5354_4550; // "STEP"

/// Training stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The input pipeline failed.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// The strategy failed (a peer died, a collective timed out, …).
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// The run folder could not be written.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A callback's file could not be written.
    #[error(transparent)]
    Callback(#[from] CallbackError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The backup cannot resume this spec (another global batch or optimizer).
    #[error("{0}")]
    Resume(String),
    /// A task was asked to stop (SIGTERM): every task stopped at the same step, after the
    /// chief saved a backup to resume from.
    #[error("{}", preempted_text(*step, backup.as_deref(), *chief))]
    Preempted {
        /// The step every task stopped after.
        step: u64,
        /// The backup written there, when the run backs up.
        backup: Option<PathBuf>,
        /// Whether this task is the chief (the one that saves).
        chief: bool,
    },
}

fn preempted_text(step: u64, backup: Option<&std::path::Path>, chief: bool) -> String {
    match (backup, chief) {
        (Some(b), _) => format!(
            "preempted: stopped after step {step} and saved {}; run the same command again to resume",
            b.display()
        ),
        (None, true) => format!(
            "preempted: stopped after step {step}; without a backup_and_restore callback the next run starts over"
        ),
        (None, false) => {
            format!("preempted: stopped after step {step} with the other tasks; the chief saves the backup")
        }
    }
}

/// The parts of a run the loop drives.
pub struct Session {
    /// The model's variables.
    pub vars: Variables,
    /// The optimizer and its state.
    pub optimizer: Optimizer,
    /// How gradients are computed and reduced.
    pub strategy: Box<dyn Strategy>,
    /// The loaded data.
    pub dataset: Arc<Dataset>,
    /// This task's share of every batch.
    pub shard: Shard,
    /// Named trainable tensors (for saving weights).
    pub tensors: Vec<TensorInfo>,
    /// Named state tensors.
    pub state_tensors: Vec<TensorInfo>,
    /// Activation values per example of one replica's model, to size evaluation batches.
    pub activation_len: usize,
}

/// How the loop reports.
pub struct FitOptions {
    /// Progress display.
    pub progress: progress::Mode,
    /// Prefix of every progress line (a task's role under the launcher).
    pub prefix: String,
    /// When the process started, for `wall_s` and `first_step_s`.
    pub launched: Instant,
    /// Set when this task is asked to stop (SIGTERM): the tasks stop together at the next
    /// step boundary after a backup.
    pub stop: &'static AtomicBool,
}

/// Checkpoints of the run: where it resumes, and the chief's saver.
#[derive(Default)]
pub struct Persistence {
    /// The backup this run continues, if any.
    pub resume: Option<ResumePoint>,
    /// The chief's checkpoint callbacks (`None` on other tasks, or without any).
    pub saver: Option<Saver>,
}

fn sums(s: &BatchStats) -> Sums {
    Sums { loss_sum: s.loss_sum, correct: s.correct, examples: s.examples }
}

fn stats(s: &Sums) -> BatchStats {
    BatchStats { loss_sum: s.loss_sum, correct: s.correct, examples: s.examples }
}

/// What an evaluation found.
#[derive(Debug, Clone, Copy)]
struct Eval {
    step: u64,
    stats: BatchStats,
}

/// Trains `session` as `plan` says, writing the run folder `run_dir` (the chief's; other
/// workers of a job write nothing), continuing `persist.resume` when given and saving through
/// `persist.saver`.
pub fn fit(
    plan: &Plan,
    session: &mut Session,
    mut run_dir: Option<&mut RunDir>,
    opts: &FitOptions,
    persist: Persistence,
) -> Result<Summary, TrainError> {
    let t = &plan.train;
    let Persistence { resume, mut saver } = persist;
    let micro_global =
        NonZeroUsize::new(plan.batch.per_replica * plan.strategy.num_replicas_in_sync).unwrap_or(NonZeroUsize::MIN);
    let options = PipelineOptions::from_spec(&plan.data.spec, plan.seed, micro_global, session.shard);
    let start = resume.as_ref().map_or(0, |r| r.step);
    let cursor = resume.as_ref().map(|r| r.cursor).unwrap_or_default();
    let mut pipeline = Pipeline::new(session.dataset.clone(), &options, cursor)?;
    let restored = resume.as_ref().map(|r| (&r.loop_state.callbacks, r.epochs_done));
    let mut callbacks = Callbacks::new(&plan.callbacks, run_dir.as_deref().map(RunDir::path), restored)?;
    if let (Some(s), Some(r)) = (saver.as_mut(), resume.as_ref()) {
        s.restore_best(&r.loop_state.callbacks.checkpoint_best);
    }
    let mut progress = Progress::new(opts.progress, t.epochs, opts.prefix.clone());
    let mut micro: Vec<Batch> = Vec::with_capacity(plan.batch.accumulation_steps);
    let eval_batch = eval_batch_size(micro_global, plan.strategy.num_replicas_in_sync, session.activation_len);
    let steady_from = if t.epochs >= 2 { t.steps_per_epoch } else { (t.steps_per_epoch / 5).min(10) };
    let spe = t.steps_per_epoch.max(1);

    let (mut step, mut examples) = (start, resume.as_ref().map_or(0, |r| r.loop_state.examples));
    let mut first_step_s = None;
    let (mut steady_time, mut steady_examples, mut all_time) = (Duration::ZERO, 0u64, Duration::ZERO);
    let mut last_eval: Option<Eval> =
        resume.as_ref().and_then(|r| r.loop_state.last_eval).map(|e| Eval { step: e.step, stats: stats(&e.sums) });
    let mut last_epoch = resume.as_ref().map(|r| stats(&r.loop_state.last_epoch_sums)).unwrap_or_default();
    let mut best: Option<Variables> = resume.as_ref().and_then(|r| r.best.clone());
    let mut stopped = "completed";
    let mut lr = callbacks.learning_rate(plan.learning_rate.at(step));
    let mut resumed_sums = resume.as_ref().map(|r| stats(&r.loop_state.epoch_sums));
    let resumed_from_step = resume.as_ref().map(|r| r.step);
    drop(resume);

    'epochs: for epoch in (start / spe + 1)..=t.epochs {
        let first = if epoch == start / spe + 1 { start % spe } else { 0 };
        progress.start_epoch(epoch, t.steps_per_epoch, first);
        let mut epoch_stats = resumed_sums.take().unwrap_or_default();
        let mut epoch_time = Duration::ZERO;
        let mut vote = false;
        for s in first..t.steps_per_epoch {
            let started = Instant::now();
            first_step_s.get_or_insert_with(|| opts.launched.elapsed().as_secs_f64());
            for _ in 0..plan.batch.accumulation_steps {
                micro.push(pipeline.next_batch()?);
            }
            let seed = derive_seed(&[plan.seed, STEP_DOMAIN, step]);
            let asked = opts.stop.load(Ordering::Relaxed);
            let out = session.strategy.compute_gradients(&mut session.vars, &micro, seed, asked)?;
            let stats = out.stats;
            lr = callbacks.learning_rate(plan.learning_rate.at(step));
            session.strategy.apply(&mut session.vars, &mut session.optimizer, lr as f32)?;
            micro.drain(..).for_each(|b| pipeline.recycle(b));
            step += 1;
            examples += stats.examples;
            epoch_stats.add(stats);
            let took = started.elapsed();
            if let Some(d) = run_dir.as_deref_mut() {
                d.step(epoch, step, stats, lr, took)?;
            }
            epoch_time += took;
            all_time += took;
            if step > steady_from {
                steady_time += took;
                steady_examples += stats.examples;
            }
            let shown = Shown {
                loss: epoch_stats.loss(),
                accuracy: epoch_stats.accuracy(),
                val: last_eval.map(|e| (e.stats.loss(), e.stats.accuracy())),
            };
            progress.step(s + 1, &shown);

            let epoch_end = s + 1 == t.steps_per_epoch;
            let due = t.eval.and_then(|e| e.every_steps).is_some_and(|n| step % n == 0);
            if due && !(epoch_end && t.eval.is_some_and(|e| e.every_epoch)) {
                let stats = evaluate(plan, session, eval_batch)?;
                last_eval = Some(Eval { step, stats });
                let logs = logs(epoch, step, &epoch_stats, last_eval, lr);
                if let Some(d) = run_dir.as_deref_mut() {
                    d.metrics(&metrics_line(MetricsEvent::Evaluation, &logs, &epoch_stats, epoch_time, opts))?;
                }
                progress.note(&format!(
                    "step {step}: val_loss: {:.4} - val_accuracy: {:.4}",
                    stats.loss(),
                    stats.accuracy()
                ));
                if let Control::Stop(why) = callbacks.on_evaluation(&logs) {
                    stopped = why;
                    let shown = Shown { val: Some((stats.loss(), stats.accuracy())), ..shown };
                    progress.end_epoch(epoch, s + 1, &shown);
                    progress.note(&format!("stopped: {stopped}"));
                    last_epoch = epoch_stats;
                    break 'epochs;
                }
            }
            vote = out.stop;
            if epoch_end {
                break;
            }
            // Mid-epoch: save what is due, then stop together if a task was asked to.
            if let Some(sv) = saver.as_mut().filter(|sv| sv.due(step, false) || (vote && sv.backs_up())) {
                let logs = logs(epoch, step, &epoch_stats, last_eval.filter(|e| e.step == step), lr);
                let point = SavePoint {
                    step,
                    epochs_done: epoch - 1,
                    epoch_end: false,
                    cursor: pipeline.cursor(),
                    loop_state: loop_state(examples, &epoch_stats, &last_epoch, last_eval, &callbacks),
                    logs: &logs,
                    vars: &session.vars,
                    optimizer: &session.optimizer,
                    best: best.as_ref(),
                };
                for n in sv.save(point, vote)? {
                    progress.note(&n);
                }
            }
            if vote {
                return Err(preempt(session, saver, step, run_dir.is_some()));
            }
        }
        last_epoch = epoch_stats;
        if t.eval.is_some_and(|e| e.every_epoch) {
            last_eval = Some(Eval { step, stats: evaluate(plan, session, eval_batch)? });
        }
        let logs = logs(epoch, step, &epoch_stats, last_eval.filter(|e| e.step == step), lr);
        if let Some(d) = run_dir.as_deref_mut() {
            d.metrics(&metrics_line(MetricsEvent::Epoch, &logs, &epoch_stats, epoch_time, opts))?;
        }
        let shown = Shown { loss: logs.loss, accuracy: logs.accuracy, val: logs.val_loss.zip(logs.val_accuracy) };
        progress.end_epoch(epoch, t.steps_per_epoch, &shown);
        for control in callbacks.on_epoch_end(&logs)? {
            match control {
                Control::Continue => {}
                Control::SaveBest => best = Some(session.vars.clone()),
                Control::Stop(why) => stopped = why,
                Control::StopAndRestore(why) => {
                    stopped = why;
                    if let Some(b) = best.take() {
                        session.vars = b;
                        // The restored weights have not been evaluated yet.
                        last_eval = None;
                    }
                }
            }
        }
        // The epoch's last step may carry a stop vote too; then a backup is due regardless.
        let vote = vote && stopped == "completed";
        if let Some(sv) = saver.as_mut().filter(|sv| sv.due(step, true) || (vote && sv.backs_up())) {
            let point = SavePoint {
                step,
                epochs_done: epoch,
                epoch_end: true,
                cursor: pipeline.cursor(),
                loop_state: loop_state(examples, &BatchStats::default(), &last_epoch, last_eval, &callbacks),
                logs: &logs,
                vars: &session.vars,
                optimizer: &session.optimizer,
                best: best.as_ref(),
            };
            for n in sv.save(point, vote)? {
                progress.note(&n);
            }
        }
        if stopped != "completed" {
            progress.note(&format!("stopped: {stopped}"));
            break;
        }
        if vote {
            return Err(preempt(session, saver, step, run_dir.is_some()));
        }
    }

    let final_eval = match last_eval {
        Some(e) if e.step == step => Some(e.stats),
        _ if t.eval.is_some() => Some(evaluate(plan, session, eval_batch)?),
        _ => None,
    };
    if let Some(e) = final_eval {
        progress.note(&format!("test: loss: {:.4} - accuracy: {:.4}", e.loss(), e.accuracy()));
    }
    let sha = weights_sha256(&session.vars);
    let transport = session.strategy.transport();
    // Every checkpoint is on disk before the job ends, so the evaluator finds the last one.
    let saves = saver.map(|s| s.finish(true)).transpose()?;
    session.strategy.finish()?;
    if let Some(d) = run_dir.as_deref() {
        save_weights(&d.path().join("model.safetensors"), &session.vars, &session.tensors, &session.state_tensors)?;
    }
    let steady = if steady_examples > 0 {
        steady_examples as f64 / steady_time.as_secs_f64()
    } else {
        examples as f64 / all_time.as_secs_f64().max(1e-9)
    };
    Ok(Summary {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        name: plan.name.clone(),
        seed: plan.seed,
        stopped,
        train_loss: last_epoch.loss(),
        train_accuracy: last_epoch.accuracy(),
        test_loss: final_eval.map(|e| e.loss()),
        test_accuracy: final_eval.map(|e| e.accuracy()),
        steps: step,
        examples,
        wall_s: opts.launched.elapsed().as_secs_f64(),
        first_step_s: first_step_s.unwrap_or(0.0),
        steady_examples_per_s: steady,
        peak_rss_mb: record::peak_rss_mb(),
        weights_sha256: sha,
        params: session.vars.params.len(),
        threads: plan.threads,
        num_replicas_in_sync: plan.strategy.num_replicas_in_sync,
        num_workers: plan.strategy.num_workers,
        transport,
        resumed_from_step,
        checkpoints_written: saves.map(|s| s.saves),
        save_block_ms_max: saves.map(|s| s.block_max.as_secs_f64() * 1e3),
        save_write_ms_max: saves.map(|s| s.write_max.as_secs_f64() * 1e3),
    })
}

/// The loop's state for a save.
fn loop_state(
    examples: u64,
    epoch: &BatchStats,
    last_epoch: &BatchStats,
    last_eval: Option<Eval>,
    callbacks: &Callbacks,
) -> LoopState {
    LoopState {
        examples,
        epoch_sums: sums(epoch),
        last_epoch_sums: sums(last_epoch),
        last_eval: last_eval.map(|e| EvalState { step: e.step, sums: sums(&e.stats) }),
        callbacks: callbacks.state(),
        best_weights: false,
    }
}

/// Every task stops after `step`: the chief's backup (already queued) goes to disk, and the
/// job is left cleanly, so nobody mistakes the stop for a failure.
fn preempt(session: &mut Session, saver: Option<Saver>, step: u64, chief: bool) -> TrainError {
    let backup = match saver {
        Some(mut s) => match s.flush() {
            Ok(b) => {
                let _ = s.finish(false);
                b
            }
            Err(e) => return e.into(),
        },
        None => None,
    };
    if let Err(e) = session.strategy.finish() {
        return e.into();
    }
    TrainError::Preempted { step, backup, chief }
}

/// The largest multiple of the training micro-batch (at most 1024 examples per replica) whose
/// activations fit [`EVAL_BYTES`] on each replica.
pub(crate) fn eval_batch_size(micro: NonZeroUsize, replicas: usize, activation_len: usize) -> NonZeroUsize {
    let per_replica = (EVAL_BYTES / (4 * activation_len.max(1))).clamp(1, 1024);
    let multiple = (per_replica * replicas.max(1) / micro.get()).max(1);
    NonZeroUsize::new(micro.get() * multiple).unwrap_or(micro)
}

fn evaluate(plan: &Plan, session: &mut Session, batch: NonZeroUsize) -> Result<BatchStats, TrainError> {
    let Some(test) = session.dataset.test.as_ref() else {
        return Ok(BatchStats::default());
    };
    let limit = plan.train.eval.and_then(|e| e.validation_steps).map_or(usize::MAX, |v| v as usize);
    let mut batches = EvalBatches::new(test, batch, session.shard).take(limit);
    Ok(session.strategy.evaluate(&mut session.vars, &mut batches)?)
}

fn logs(epoch: u64, step: u64, train: &BatchStats, eval: Option<Eval>, lr: f64) -> Logs {
    Logs {
        epoch,
        step,
        loss: train.loss(),
        accuracy: train.accuracy(),
        val_loss: eval.map(|e| e.stats.loss()),
        val_accuracy: eval.map(|e| e.stats.accuracy()),
        learning_rate: lr,
    }
}

fn metrics_line(
    event: MetricsEvent,
    logs: &Logs,
    train: &BatchStats,
    time: Duration,
    opts: &FitOptions,
) -> MetricsLine {
    MetricsLine {
        event,
        epoch: logs.epoch,
        step: logs.step,
        loss: logs.loss,
        accuracy: logs.accuracy,
        val_loss: logs.val_loss,
        val_accuracy: logs.val_accuracy,
        learning_rate: logs.learning_rate,
        examples_per_s: train.examples as f64 / time.as_secs_f64().max(1e-9),
        wall_s: opts.launched.elapsed().as_secs_f64(),
    }
}

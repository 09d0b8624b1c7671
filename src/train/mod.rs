//! The training loop: Keras's `model.fit` over a strategy, with evaluation, callbacks,
//! progress and the run record.

pub mod callbacks;
pub mod progress;
pub mod record;
pub mod run_record;
pub mod tensorboard;
mod weights;

pub use weights::{save_weights, weights_sha256};

use crate::data::{Batch, Cursor, Dataset, EvalBatches, Pipeline, PipelineOptions, Shard};
use crate::engine::init::derive_seed;
use crate::engine::{BatchStats, Optimizer, TensorInfo};
use crate::plan::Plan;
use crate::strategy::{Strategy, StrategyError, Variables};
use callbacks::{CallbackError, Callbacks, Control, Logs};
use progress::{Progress, Shown};
use record::{MetricsEvent, MetricsLine, RecordError, RunDir, Summary};
use std::num::NonZeroUsize;
use std::sync::Arc;
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
}

/// What an evaluation found.
#[derive(Debug, Clone, Copy)]
struct Eval {
    step: u64,
    stats: BatchStats,
}

/// Trains `session` as `plan` says, writing the run folder `run_dir` (the chief's; other
/// workers of a job write nothing).
pub fn fit(
    plan: &Plan,
    session: &mut Session,
    mut run_dir: Option<&mut RunDir>,
    opts: &FitOptions,
) -> Result<Summary, TrainError> {
    let t = &plan.train;
    let micro_global =
        NonZeroUsize::new(plan.batch.per_replica * plan.strategy.num_replicas_in_sync).unwrap_or(NonZeroUsize::MIN);
    let options = PipelineOptions::from_spec(&plan.data.spec, plan.seed, micro_global, session.shard);
    let mut pipeline = Pipeline::new(session.dataset.clone(), &options, Cursor::default())?;
    let mut callbacks = Callbacks::new(&plan.callbacks, run_dir.as_deref().map(RunDir::path))?;
    let mut progress = Progress::new(opts.progress, t.epochs, opts.prefix.clone());
    let mut micro: Vec<Batch> = Vec::with_capacity(plan.batch.accumulation_steps);
    let eval_batch = eval_batch_size(micro_global, plan.strategy.num_replicas_in_sync, session.activation_len);
    let steady_from = if t.epochs >= 2 { t.steps_per_epoch } else { (t.steps_per_epoch / 5).min(10) };

    let (mut step, mut examples) = (0u64, 0u64);
    let mut first_step_s = None;
    let (mut steady_time, mut steady_examples, mut all_time) = (Duration::ZERO, 0u64, Duration::ZERO);
    let mut last_eval: Option<Eval> = None;
    let mut last_epoch = BatchStats::default();
    let mut best: Option<Variables> = None;
    let mut stopped = "completed";
    let mut lr = plan.learning_rate.at(0);

    'epochs: for epoch in 1..=t.epochs {
        progress.start_epoch(epoch, t.steps_per_epoch);
        let mut epoch_stats = BatchStats::default();
        let mut epoch_time = Duration::ZERO;
        for s in 0..t.steps_per_epoch {
            let started = Instant::now();
            first_step_s.get_or_insert_with(|| opts.launched.elapsed().as_secs_f64());
            for _ in 0..plan.batch.accumulation_steps {
                micro.push(pipeline.next_batch()?);
            }
            let seed = derive_seed(&[plan.seed, STEP_DOMAIN, step]);
            let stats = session.strategy.compute_gradients(&mut session.vars, &micro, seed)?;
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
        if stopped != "completed" {
            progress.note(&format!("stopped: {stopped}"));
            break;
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
    })
}

/// The largest multiple of the training micro-batch (at most 1024 examples per replica) whose
/// activations fit [`EVAL_BYTES`] on each replica.
fn eval_batch_size(micro: NonZeroUsize, replicas: usize, activation_len: usize) -> NonZeroUsize {
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

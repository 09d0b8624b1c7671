//! `model.fit`: the step loop over a strategy, with evaluation, callbacks, checkpoints,
//! resumption and preemption. [`fit`] is the loop's outline; [`Loop`] holds its state and does
//! each part.

use super::callbacks::{Callbacks, Control, Logs, Moment, StopReason};
use super::checkpointer::SavePoint;
use super::metrics_log::{MetricsEvent, MetricsLine};
use super::resume::ResumePoint;
use super::run_dir::RunDir;
use super::summary::{ParameterServerStats, Summary, SummaryMetrics, peak_rss_mb};
use super::{Session, TrainError, first_non_finite, save_weights, weights_sha256};
use crate::checkpoint::SaveStats;
use crate::checkpoint::manifest::{EvalState, LoopState};
use crate::data::{Batch, EvalBatches, Pipeline, PipelineOptions};
use crate::engine::init::{STEP_DOMAIN, derive_seed};
use crate::metrics::{Reading, Sums};
use crate::plan::Plan;
use crate::progress::{self, Progress, Shown};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Activation memory an evaluation batch may use: bigger batches run the forward pass's
/// products more efficiently, and per-example results do not depend on the batch size.
const EVAL_BYTES: usize = 32 << 20;

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

/// Trains `session` as `plan` says with `callbacks`, writing `run_dir` (the chief's; other
/// workers of a job write nothing) and continuing from `resume` when given.
pub fn fit(
    plan: &Plan,
    session: &mut Session,
    callbacks: &mut Callbacks,
    mut run_dir: Option<&mut RunDir>,
    opts: &FitOptions,
    resume: Option<ResumePoint>,
) -> Result<Summary, TrainError> {
    let t = &plan.train;
    let mut lp = Loop::new(plan, session, callbacks, opts, resume)?;
    lp.chief = run_dir.is_some();
    let mut stopped = StopReason::Completed;
    'epochs: for epoch in lp.first_epoch()..=t.epochs {
        let first = lp.first_step_of(epoch);
        lp.progress.start_epoch(epoch, t.steps_per_epoch, first);
        let mut vote = false;
        for s in first..t.steps_per_epoch {
            vote = lp.train_step(epoch, s, session, callbacks, run_dir.as_deref_mut())?;
            let epoch_end = s + 1 == t.steps_per_epoch;
            if let Some(reason) =
                lp.evaluate_mid_epoch(epoch, s, epoch_end, session, callbacks, run_dir.as_deref_mut())?
            {
                stopped = reason;
                break 'epochs;
            }
            if epoch_end {
                break;
            }
            // Mid-epoch: save what is due, then stop together if a task was asked to.
            lp.save(epoch - 1, false, vote, session, callbacks)?;
            if vote {
                return Err(lp.preempt(session, callbacks));
            }
        }
        if let Some(reason) = lp.end_epoch(epoch, session, callbacks, run_dir.as_deref_mut())? {
            stopped = reason;
        }
        // The epoch's last step may carry a stop vote too; then a backup is due regardless.
        let vote = vote && stopped == StopReason::Completed;
        lp.save(epoch, true, vote, session, callbacks)?;
        if stopped != StopReason::Completed {
            lp.progress.note(&format!("stopped: {}", stopped.name()));
            break;
        }
        if vote {
            return Err(lp.preempt(session, callbacks));
        }
    }
    lp.finish(stopped, session, callbacks, run_dir)
}

/// Refuses weights holding a NaN or an infinity (the update of `step` made them so).
fn non_finite_weights(step: u64, session: &Session) -> Result<(), TrainError> {
    match first_non_finite(&session.vars, &session.tensors, &session.state_tensors) {
        Some(t) => Err(TrainError::NonFinite { step, what: format!("the weight tensor `{t}`") }),
        None => Ok(()),
    }
}

/// What an evaluation found.
#[derive(Debug, Clone, Copy)]
struct Eval {
    step: u64,
    stats: Sums,
}

/// Step times, for the throughput figures of the summary.
#[derive(Debug, Default)]
struct Timing {
    first_step_s: Option<f64>,
    /// Steps after this one count as steady (past the first epoch, or warm-up steps).
    steady_from: u64,
    steady: Duration,
    steady_examples: u64,
    all: Duration,
    epoch: Duration,
    /// Time the step loop waited for the input pipeline's batches.
    input_wait: Duration,
}

/// The loop's state between steps.
struct Loop<'a> {
    plan: &'a Plan,
    opts: &'a FitOptions,
    pipeline: Pipeline,
    pub progress: Progress,
    micro: Vec<Batch>,
    eval_batch: NonZeroUsize,
    start: u64,
    step: u64,
    examples: u64,
    epoch_stats: Sums,
    last_epoch: Sums,
    last_eval: Option<Eval>,
    lr: f64,
    timing: Timing,
    resumed_from_step: Option<u64>,
    /// Whether this task is the chief (the one that writes the run folder and saves).
    chief: bool,
}

impl<'a> Loop<'a> {
    fn new(
        plan: &'a Plan,
        session: &Session,
        callbacks: &mut Callbacks,
        opts: &'a FitOptions,
        resume: Option<ResumePoint>,
    ) -> Result<Self, TrainError> {
        let t = &plan.train;
        let micro_global =
            NonZeroUsize::new(plan.batch.per_replica * plan.strategy.num_replicas_in_sync).unwrap_or(NonZeroUsize::MIN);
        let options = PipelineOptions {
            seed: plan.seed,
            shuffle: plan.data.shuffle,
            global_batch: micro_global,
            drop_remainder: plan.data.drop_remainder,
            prefetch: plan.data.prefetch,
            shard: session.shard,
        };
        let cursor = resume.as_ref().map(|r| r.cursor).unwrap_or_default();
        let pipeline = Pipeline::new(session.dataset.clone(), &options, cursor)?;
        if let Some(r) = &resume {
            callbacks.restore(&r.loop_state.callbacks, r.epochs_done, r.best.as_ref())?;
        }
        let start = resume.as_ref().map_or(0, |r| r.step);
        let steady_from = if t.epochs >= 2 { t.steps_per_epoch } else { (t.steps_per_epoch / 5).min(10) };
        let lp = resume.as_ref().map(|r| &r.loop_state);
        Ok(Self {
            plan,
            opts,
            pipeline,
            progress: Progress::new(opts.progress, t.epochs, opts.prefix.clone()),
            micro: Vec::with_capacity(plan.batch.accumulation_steps),
            eval_batch: eval_batch_size(micro_global, plan.strategy.num_replicas_in_sync, session.activation_len),
            start,
            step: start,
            examples: lp.map_or(0, |l| l.examples),
            epoch_stats: lp.map(|l| l.epoch_sums).unwrap_or_default(),
            last_epoch: lp.map(|l| l.last_epoch_sums).unwrap_or_default(),
            last_eval: lp.and_then(|l| l.last_eval).map(|e| Eval { step: e.step, stats: e.sums }),
            lr: callbacks.learning_rate(plan.learning_rate.at(start)),
            timing: Timing { steady_from, ..Timing::default() },
            resumed_from_step: resume.as_ref().map(|r| r.step),
            chief: false,
        })
    }

    fn spe(&self) -> u64 {
        self.plan.train.steps_per_epoch.max(1)
    }

    /// The epoch the loop starts in (1-based), after a resume too.
    fn first_epoch(&self) -> u64 {
        self.start / self.spe() + 1
    }

    /// The step within `epoch` the loop starts at.
    fn first_step_of(&self, epoch: u64) -> u64 {
        if epoch == self.first_epoch() { self.start % self.spe() } else { 0 }
    }

    /// One optimizer step (step `s` of `epoch`); returns whether some task voted to stop.
    fn train_step(
        &mut self,
        epoch: u64,
        s: u64,
        session: &mut Session,
        callbacks: &Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<bool, TrainError> {
        let started = Instant::now();
        self.timing.first_step_s.get_or_insert_with(|| self.opts.launched.elapsed().as_secs_f64());
        let waiting = Instant::now();
        for _ in 0..self.plan.batch.accumulation_steps {
            self.micro.push(self.pipeline.next_batch()?);
        }
        self.timing.input_wait += waiting.elapsed();
        let seed = derive_seed(&[self.plan.seed, STEP_DOMAIN, self.step]);
        let asked = self.opts.stop.load(Ordering::Relaxed);
        let out = session.strategy.compute_gradients(&mut session.vars, &self.micro, seed, asked)?;
        // Free on the hot path: a NaN gradient shows in the next step's loss at the latest.
        if !out.stats.loss_sum().is_finite() {
            let what = first_non_finite(&session.vars, &session.tensors, &session.state_tensors)
                .map_or_else(|| "the loss".to_string(), |t| format!("the loss, and the weights from `{t}` on,"));
            return Err(TrainError::NonFinite { step: self.step + 1, what });
        }
        self.lr = callbacks.learning_rate(self.plan.learning_rate.at(self.step));
        session.strategy.apply(&mut session.vars, &mut session.optimizer, self.lr as f32)?;
        for b in self.micro.drain(..) {
            self.pipeline.recycle(b);
        }
        self.step += 1;
        self.examples += out.stats.examples();
        self.epoch_stats.add(out.stats);
        let took = started.elapsed();
        if let Some(d) = run_dir {
            d.step(epoch, self.step, out.stats, self.lr, took)?;
        }
        self.timing.epoch += took;
        self.timing.all += took;
        if self.step > self.timing.steady_from {
            self.timing.steady += took;
            self.timing.steady_examples += out.stats.examples();
        }
        self.progress.step(s + 1, &self.shown());
        Ok(out.stop)
    }

    fn shown(&self) -> Shown {
        Shown {
            loss: self.epoch_stats.loss(),
            accuracy: self.epoch_stats.accuracy(),
            val: self.last_eval.map(|e| (e.stats.loss(), e.stats.accuracy())),
        }
    }

    /// The logs after this step: `train` is the epoch's statistics so far.
    fn logs(&self, epoch: u64, train: &Sums, eval: Option<Eval>) -> Logs {
        Logs {
            epoch,
            step: self.step,
            loss: train.loss(),
            accuracy: train.accuracy(),
            val_loss: eval.map(|e| e.stats.loss()),
            val_accuracy: eval.map(|e| e.stats.accuracy()),
            learning_rate: self.lr,
        }
    }

    /// The evaluation every N steps (unless the epoch's end evaluates anyway); returns why to
    /// stop when a callback says so.
    fn evaluate_mid_epoch(
        &mut self,
        epoch: u64,
        s: u64,
        epoch_end: bool,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<Option<StopReason>, TrainError> {
        let t = &self.plan.train;
        let due = t.eval.and_then(|e| e.every_steps).is_some_and(|n| self.step.is_multiple_of(n));
        if !due || (epoch_end && t.eval.is_some_and(|e| e.every_epoch)) {
            return Ok(None);
        }
        let stats = self.evaluate(session)?;
        self.last_eval = Some(Eval { step: self.step, stats });
        let logs = self.logs(epoch, &self.epoch_stats, self.last_eval);
        if let Some(d) = run_dir {
            d.metrics(&self.metrics_line(MetricsEvent::Evaluation, &logs))?;
        }
        let (loss, accuracy) = (stats.loss(), stats.accuracy());
        self.progress.note(&format!("step {}: val_loss: {loss:.4} - val_accuracy: {accuracy:.4}", self.step));
        let reason = match callbacks.on_evaluation(&logs) {
            Control::Continue => return Ok(None),
            Control::Stop(r) | Control::StopAndRestore(r) => r,
        };
        let shown = Shown { val: Some((loss, accuracy)), ..self.shown() };
        self.progress.end_epoch(epoch, s + 1, &shown);
        self.progress.note(&format!("stopped: {}", reason.name()));
        self.last_epoch = self.epoch_stats;
        Ok(Some(reason))
    }

    /// An epoch's end: its evaluation, metrics line and display, and the callbacks' verdict
    /// (acted on here: the best weights put back when asked). Returns why to stop, if so.
    fn end_epoch(
        &mut self,
        epoch: u64,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<Option<StopReason>, TrainError> {
        self.last_epoch = self.epoch_stats;
        if self.plan.train.eval.is_some_and(|e| e.every_epoch) {
            self.last_eval = Some(Eval { step: self.step, stats: self.evaluate(session)? });
        }
        let logs = self.logs(epoch, &self.epoch_stats, self.last_eval.filter(|e| e.step == self.step));
        if let Some(d) = run_dir {
            d.metrics(&self.metrics_line(MetricsEvent::Epoch, &logs))?;
        }
        let shown = Shown { loss: logs.loss, accuracy: logs.accuracy, val: logs.val_loss.zip(logs.val_accuracy) };
        self.progress.end_epoch(epoch, self.plan.train.steps_per_epoch, &shown);
        self.timing.epoch = Duration::ZERO;
        self.epoch_stats = Sums::default();
        Ok(match callbacks.on_epoch_end(&logs, &session.vars)? {
            Control::Continue => None,
            Control::Stop(r) => Some(r),
            Control::StopAndRestore(r) => {
                if let Some(best) = callbacks.best_weights() {
                    session.vars.clone_from(best);
                    // The restored weights have not been evaluated yet.
                    self.last_eval = None;
                }
                Some(r)
            }
        })
    }

    /// Saves what the callbacks ask for after this step (`epochs_done` epochs finished;
    /// `preempting`: every task voted to stop, so a backup is due).
    fn save(
        &mut self,
        epochs_done: u64,
        epoch_end: bool,
        preempting: bool,
        session: &Session,
        callbacks: &mut Callbacks,
    ) -> Result<(), TrainError> {
        if preempting {
            // A step boundary, the stop's backup next: the stop watchdog lets this finish.
            crate::signals::stopping_at_step_boundary();
        }
        // At an epoch's end its statistics have moved to `last_epoch`.
        let (epoch, train) =
            if epoch_end { (epochs_done, self.last_epoch) } else { (epochs_done + 1, self.epoch_stats) };
        let logs = self.logs(epoch, &train, self.last_eval.filter(|e| e.step == self.step));
        let at = Moment { step: self.step, epoch_end, preempting, logs: &logs };
        let cursor = self.pipeline.cursor();
        let (examples, epoch_sums, last_epoch, last_eval) =
            (self.examples, self.epoch_stats, self.last_epoch, self.last_eval);
        let step = self.step;
        let notes = callbacks.save(&at, |callbacks| {
            // Only when a save is due: a checkpoint never holds a NaN, and the pending
            // backup it would replace stays.
            non_finite_weights(step, session)?;
            Ok::<_, TrainError>(SavePoint {
                epochs_done,
                cursor,
                loop_state: LoopState {
                    examples,
                    epoch_sums,
                    last_epoch_sums: last_epoch,
                    last_eval: last_eval.map(|e| EvalState { step: e.step, sums: e.stats }),
                    callbacks,
                    best_weights: false,
                    worker_steps: Vec::new(),
                },
                vars: &session.vars,
                optimizer: &session.optimizer,
            })
        })?;
        for n in notes {
            self.progress.note(&n);
        }
        Ok(())
    }

    /// Every task stops after this step: the chief's backup (already queued) goes to disk,
    /// and the job is left cleanly, so nobody mistakes the stop for a failure.
    fn preempt(&mut self, session: &mut Session, callbacks: &mut Callbacks) -> TrainError {
        let chief = self.chief;
        let backup = match callbacks.flush() {
            Ok(b) => b,
            Err(e) => return e.into(),
        };
        if let Err(e) = callbacks.finish(false) {
            return e.into();
        }
        if let Err(e) = session.strategy.finish() {
            return e.into();
        }
        TrainError::Preempted { step: self.step, backup, chief, backs_up: self.plan.callbacks.backs_up() }
    }

    fn evaluate(&self, session: &mut Session) -> Result<Sums, TrainError> {
        let Some(test) = session.dataset.test.as_ref() else {
            return Ok(Sums::default());
        };
        let limit = self.plan.train.eval.and_then(|e| e.validation_steps).map_or(usize::MAX, |v| v as usize);
        let mut batches = EvalBatches::new(test, self.eval_batch, session.shard);
        let stats = session.strategy.evaluate(&mut session.vars, &mut batches.by_ref().take(limit))?;
        batches.finish()?;
        Ok(stats)
    }

    fn metrics_line(&self, event: MetricsEvent, logs: &Logs) -> MetricsLine {
        let per_s = self.epoch_stats.examples() as f64 / self.timing.epoch.as_secs_f64().max(1e-9);
        let val = self.last_eval.filter(|e| e.step == self.step && logs.val_loss.is_some()).map(|e| e.stats);
        let reading = Reading::new(&self.plan.train.metrics, self.epoch_stats, val, per_s);
        MetricsLine::of(event, logs, reading, self.opts.launched.elapsed().as_secs_f64())
    }

    /// The final evaluation, the weights, the last checkpoints and the summary.
    fn finish(
        mut self,
        stopped: StopReason,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<Summary, TrainError> {
        let final_eval = match self.last_eval {
            Some(e) if e.step == self.step => Some(e.stats),
            _ if self.plan.train.eval.is_some() => Some(self.evaluate(session)?),
            _ => None,
        };
        if let Some(e) = final_eval {
            self.progress.note(&format!("test: loss: {:.4} - accuracy: {:.4}", e.loss(), e.accuracy()));
        }
        non_finite_weights(self.step, session)?;
        let sha = weights_sha256(&session.vars);
        let transport = session.strategy.transport();
        // Every checkpoint is on disk before the job ends, so the evaluator finds the last one.
        let saves = callbacks.finish(true)?;
        session.strategy.finish()?;
        if let Some(d) = run_dir.as_deref() {
            save_weights(&d.path().join("model.safetensors"), &session.vars, &session.tensors, &session.state_tensors)?;
        }
        let t = &self.timing;
        let steady = if t.steady_examples > 0 {
            t.steady_examples as f64 / t.steady.as_secs_f64()
        } else {
            self.examples as f64 / t.all.as_secs_f64().max(1e-9)
        };
        Ok(summary(
            self.plan,
            self.opts.launched,
            session,
            Ending {
                stopped,
                last_epoch: self.last_epoch,
                final_eval,
                steps: self.step,
                examples: self.examples,
                first_step_s: t.first_step_s,
                input_wait_s: t.input_wait.as_secs_f64(),
                steady_examples_per_s: steady,
                weights_sha256: sha,
                transport,
                resumed_from_step: self.resumed_from_step,
                saves,
                parameter_server: None,
            },
        ))
    }
}

/// How a training loop ended: what [`summary`] does not read from the plan or the session.
pub(super) struct Ending {
    pub stopped: StopReason,
    pub last_epoch: Sums,
    pub final_eval: Option<Sums>,
    pub steps: u64,
    pub examples: u64,
    pub first_step_s: Option<f64>,
    pub input_wait_s: f64,
    pub steady_examples_per_s: f64,
    pub weights_sha256: String,
    pub transport: Option<&'static str>,
    pub resumed_from_step: Option<u64>,
    pub saves: Option<SaveStats>,
    pub parameter_server: Option<ParameterServerStats>,
}

/// `summary.json` of a run that ended so: shared by `fit` and the parameter-server chief's loop.
pub(super) fn summary(plan: &Plan, launched: Instant, session: &Session, end: Ending) -> Summary {
    let train_loss = end.last_epoch.loss();
    let final_loss = end.final_eval.map(|e| e.loss());
    let metrics = Reading::new(&plan.train.metrics, end.last_epoch, end.final_eval, end.steady_examples_per_s);
    Summary {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        name: plan.name.clone(),
        seed: plan.seed,
        stopped: end.stopped,
        train_loss,
        train_accuracy: end.last_epoch.accuracy(),
        test_loss: final_loss,
        test_accuracy: end.final_eval.map(|e| e.accuracy()),
        steps: end.steps,
        examples: end.examples,
        wall_s: launched.elapsed().as_secs_f64(),
        first_step_s: end.first_step_s.unwrap_or(0.0),
        input_wait_s: end.input_wait_s,
        steady_examples_per_s: end.steady_examples_per_s,
        peak_rss_mb: peak_rss_mb(),
        metrics: SummaryMetrics(metrics),
        weights_sha256: end.weights_sha256,
        params: session.vars.params.len(),
        threads: plan.threads,
        num_replicas_in_sync: plan.strategy.num_replicas_in_sync,
        num_workers: plan.strategy.num_workers,
        transport: end.transport,
        resumed_from_step: end.resumed_from_step,
        checkpoints_written: end.saves.map(|s| s.saves),
        save_block_ms_max: end.saves.map(|s| s.block_max.as_secs_f64() * 1e3),
        save_write_ms_max: end.saves.map(|s| s.write_max.as_secs_f64() * 1e3),
        parameter_server: end.parameter_server,
    }
}

/// The largest multiple of the training micro-batch (at most 1024 examples per replica) whose
/// activations fit [`EVAL_BYTES`] on each replica.
pub fn eval_batch_size(micro: NonZeroUsize, replicas: usize, activation_len: usize) -> NonZeroUsize {
    let per_replica = (EVAL_BYTES / (4 * activation_len.max(1))).clamp(1, 1024);
    let multiple = (per_replica * replicas.max(1) / micro.get()).max(1);
    NonZeroUsize::new(micro.get() * multiple).unwrap_or(micro)
}

//! `model.fit`: the step loop over a strategy, with evaluation, callbacks, checkpoints,
//! resumption and preemption: one loop for every strategy. [`fit`] is the loop's outline;
//! [`Loop`] holds its state and does each part. What differs between strategies is behind the
//! [`Strategy`](crate::strategy::Strategy) seam: a synchronous strategy computes each step
//! here ([`Executed::Computed`], then `apply`); under `parameter_server` the chief schedules
//! closures of steps on the workers ([`Executed::Scheduled`]) and `join`s them, pulling the
//! variables, wherever the loop needs them (evaluations, saves, an epoch's end).

mod ending;
mod epoch;

pub use ending::eval_batch_size;

use super::callbacks::{Callbacks, Logs, Moment, StopReason};
use super::checkpointer::SavePoint;
use super::resume::ResumePoint;
use super::run_dir::RunDir;
use super::summary::Summary;
use super::{Session, TrainError, first_non_finite, save_weights, weights_sha256};
use crate::checkpoint::manifest::{EvalState, LoopState};
use crate::data::PipelineOptions;
use crate::metrics::Sums;
use crate::plan::Plan;
use crate::progress::{self, Progress, Shown};
use crate::strategy::{Executed, Execution, Input, StrategyError};
use ending::{Ending, summary};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How the loop reports.
pub struct FitOptions {
    /// Progress display.
    pub progress: progress::ProgressMode,
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
    if let Some(stop) = t.stop_at_step.filter(|s| *s < lp.start) {
        return Err(TrainError::Resume(format!(
            "train.stop_at_step = {stop} is before step {}, where the backup this run resumes from was written; \
             help: stop at step {} or later, or drop train.stop_at_step to train to the end",
            lp.start, lp.start
        )));
    }
    let mut stopped = StopReason::Completed;
    // Resumed where it pauses (a rung's run again after its backup): nothing is left to train.
    let first_epoch = if lp.pauses_here() {
        stopped = StopReason::Paused;
        t.epochs + 1
    } else {
        lp.first_epoch()
    };
    'epochs: for epoch in first_epoch..=t.epochs {
        let first = lp.first_step_of(epoch);
        lp.progress.start_epoch(epoch, t.steps_per_epoch, first);
        let mut vote = false;
        loop {
            match lp.execute(epoch, session, callbacks, run_dir.as_deref_mut())? {
                Ran::Stepped { stop } => vote = stop,
                Ran::Scheduled => {}
                Ran::Stopped => {
                    // Nothing more was scheduled: the steps in flight finish, then the backup.
                    lp.join(session)?;
                    return Err(lp.stop_mid_epoch(epoch, session, callbacks));
                }
            }
            let done = lp.done_in(epoch);
            let epoch_end = done == t.steps_per_epoch;
            if let Some(reason) =
                lp.evaluate_mid_epoch(epoch, done, epoch_end, session, callbacks, run_dir.as_deref_mut())?
            {
                stopped = reason;
                break 'epochs;
            }
            if lp.cut_short {
                return Err(lp.stop_mid_epoch(epoch, session, callbacks));
            }
            if epoch_end {
                break;
            }
            // Pausing mid-epoch (`train.stop_at_step`): every step in hand for the backup.
            let pausing = lp.pauses_here();
            if pausing && lp.join(session)? {
                return Err(lp.stop_mid_epoch(epoch, session, callbacks));
            }
            // Mid-epoch: save what is due (where the variables are at hand), then stop
            // together if a task was asked to.
            if lp.in_hand {
                lp.save(epoch - 1, false, vote, session, callbacks)?;
            }
            if vote {
                return Err(lp.preempt(session, callbacks));
            }
            if pausing {
                // The backup holds the epoch's statistics so far; the summary shows them.
                lp.last_epoch = lp.epoch_stats;
                stopped = lp.pause();
                break 'epochs;
            }
        }
        // Steps scheduled ahead (a whole epoch may be) that a stop request dropped never ran:
        // the epoch did not end.
        if lp.join(session)? {
            return Err(lp.stop_mid_epoch(epoch, session, callbacks));
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
        if lp.pauses_here() {
            stopped = lp.pause();
            break;
        }
    }
    lp.finish(stopped, session, callbacks, run_dir)
}

/// What one execution of the loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// A step ran here and was applied; `stop`: some task voted to stop.
    Stepped { stop: bool },
    /// Steps went to the workers.
    Scheduled,
    /// A stop was asked and nothing more was scheduled.
    Stopped,
}

/// A strategy's error as the loop reports it: the input pipeline's as the data error it is.
fn strategy_error(e: StrategyError) -> TrainError {
    match e {
        StrategyError::Input(e) => TrainError::Data(*e),
        e => TrainError::Strategy(e),
    }
}

/// Refuses weights holding a NaN or an infinity (the update of `step` made them so).
fn non_finite_weights(step: u64, session: &Session, backs_up: bool) -> Result<(), TrainError> {
    match first_non_finite(&session.vars, &session.tensors, &session.state_tensors) {
        Some(t) => Err(TrainError::NonFinite { step, what: format!("the weight tensor `{t}`"), backs_up }),
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
    input: Input,
    pub progress: Progress,
    eval_batch: NonZeroUsize,
    start: u64,
    /// Steps executed: computed and applied here, or scheduled on the workers.
    step: u64,
    /// The step when the strategy last joined every step executed.
    joined_at: u64,
    /// Whether the variables here are those of `step` (every step executed is applied and
    /// in hand), so that a save may take them.
    in_hand: bool,
    /// A stop request dropped steps scheduled ahead at the last join.
    cut_short: bool,
    examples: u64,
    epoch_stats: Sums,
    last_epoch: Sums,
    last_eval: Option<Eval>,
    lr: f64,
    /// The learning rate of each step of the execution at hand.
    lrs: Vec<f32>,
    timing: Timing,
    resumed_from_step: Option<u64>,
    /// Whether this task is the chief (the one that writes the run folder and saves).
    chief: bool,
}

impl<'a> Loop<'a> {
    fn new(
        plan: &'a Plan,
        session: &mut Session,
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
        let input = Input::new(session.dataset.clone(), options, cursor);
        if let Some(r) = &resume {
            callbacks.restore(&r.loop_state.callbacks, r.epochs_done, r.best.as_ref())?;
        }
        let worker_steps = resume.as_ref().map_or(&[][..], |r| &r.loop_state.worker_steps);
        session.strategy.start(&session.vars, &session.optimizer, worker_steps)?;
        let start = resume.as_ref().map_or(0, |r| r.step);
        let steady_from = if t.epochs >= 2 { t.steps_per_epoch } else { (t.steps_per_epoch / 5).min(10) };
        let lp = resume.as_ref().map(|r| &r.loop_state);
        Ok(Self {
            plan,
            opts,
            input,
            progress: Progress::new(opts.progress, t.epochs, opts.prefix.clone()),
            eval_batch: eval_batch_size(micro_global, plan.strategy.num_replicas_in_sync, session.activation_len),
            start,
            step: start,
            joined_at: start,
            in_hand: true,
            cut_short: false,
            examples: lp.map_or(0, |l| l.examples),
            epoch_stats: lp.map(|l| l.epoch_sums).unwrap_or_default(),
            last_epoch: lp.map(|l| l.last_epoch_sums).unwrap_or_default(),
            last_eval: lp.and_then(|l| l.last_eval).map(|e| Eval { step: e.step, stats: e.sums }),
            lr: callbacks.learning_rate(plan.learning_rate.at(start)),
            lrs: Vec::new(),
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

    /// Steps of `epoch` executed so far.
    fn done_in(&self, epoch: u64) -> u64 {
        self.step - (epoch - 1) * self.spe()
    }

    /// Whether the run pauses at the step it is at (`train.stop_at_step`).
    fn pauses_here(&self) -> bool {
        self.plan.train.stop_at_step == Some(self.step)
    }

    /// Says the run pauses here, and why it stops.
    fn pause(&mut self) -> StopReason {
        self.progress.note(&format!("paused at step {} (train.stop_at_step)", self.step));
        StopReason::Paused
    }

    /// Steps the next execution takes: what the strategy allows, within the epoch, ending at
    /// the next evaluation (so that it sees exactly the steps before it) and where the run
    /// pauses.
    fn next_steps(&self, epoch: u64, strategy_steps: u64) -> u64 {
        let left = self.spe() - self.done_in(epoch);
        let every = self.plan.train.eval.and_then(|e| e.every_steps).unwrap_or(u64::MAX).max(1);
        let to_pause = self.plan.train.stop_at_step.filter(|s| *s > self.step).map_or(u64::MAX, |s| s - self.step);
        strategy_steps.max(1).min(left).min(every - self.step % every).min(to_pause)
    }

    /// One execution (step `s` of `epoch` on): one optimizer step computed and applied here,
    /// or a closure of steps scheduled on the workers.
    fn execute(
        &mut self,
        epoch: u64,
        session: &mut Session,
        callbacks: &Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<Ran, TrainError> {
        let started = Instant::now();
        self.timing.first_step_s.get_or_insert_with(|| self.opts.launched.elapsed().as_secs_f64());
        let s = self.done_in(epoch);
        let n = self.next_steps(epoch, session.strategy.steps_per_execution());
        self.lrs.clear();
        let mut lr = self.lr;
        for k in self.step..self.step + n {
            lr = callbacks.learning_rate(self.plan.learning_rate.at(k));
            self.lrs.push(lr as f32);
        }
        let asked = self.opts.stop.load(Ordering::Relaxed);
        let cx = Execution {
            vars: &mut session.vars,
            input: &mut self.input,
            step: self.step,
            lrs: &self.lrs,
            seed: self.plan.seed,
            stop: asked,
        };
        match session.strategy.execute(cx).map_err(strategy_error)? {
            Executed::Computed { step: out, input_wait } => {
                self.timing.input_wait += input_wait;
                // Free on the hot path: a NaN gradient shows in the next step's loss at the latest.
                if !out.stats.loss_sum().is_finite() {
                    let what = first_non_finite(&session.vars, &session.tensors, &session.state_tensors).map_or_else(
                        || "the loss".to_string(),
                        |t| format!("the loss, and the weights from `{t}` on,"),
                    );
                    return Err(TrainError::NonFinite {
                        step: self.step + 1,
                        what,
                        backs_up: self.plan.callbacks.backs_up(),
                    });
                }
                self.lr = lr;
                let (vars, optimizer) = (&mut session.vars, &mut session.optimizer);
                session.strategy.apply(vars, optimizer, &mut self.input, self.lr as f32).map_err(strategy_error)?;
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
                self.in_hand = true;
                self.progress.step(s + 1, &self.shown());
                Ok(Ran::Stepped { stop: out.stop })
            }
            Executed::Scheduled { applied } => {
                self.lr = lr;
                self.step += n;
                self.in_hand = false;
                self.time(started.elapsed());
                let joined = self.joined_at.saturating_sub((epoch - 1) * self.spe());
                self.progress.step(joined + applied, &Shown::default());
                Ok(Ran::Scheduled)
            }
            Executed::Stopped { unrun } => {
                self.step -= unrun;
                self.in_hand = false;
                Ok(Ran::Stopped)
            }
        }
    }

    /// Training time that is not one step's (scheduling, waiting for the workers' steps).
    fn time(&mut self, took: Duration) {
        self.timing.epoch += took;
        self.timing.all += took;
        if self.step > self.timing.steady_from {
            self.timing.steady += took;
        }
    }

    /// Waits for every step executed to be applied and takes the variables and the
    /// statistics of steps that ran elsewhere (a no-op where every step ran here). Returns
    /// whether a stop request dropped steps not started yet: the epoch was cut short.
    fn join(&mut self, session: &mut Session) -> Result<bool, TrainError> {
        if self.in_hand {
            return Ok(false);
        }
        let started = Instant::now();
        let examples = self.epoch_stats.examples();
        let (vars, optimizer) = (&mut session.vars, &mut session.optimizer);
        let stop = self.opts.stop;
        let unrun = session.strategy.join(vars, optimizer, &mut self.epoch_stats, stop).map_err(strategy_error)?;
        self.step -= unrun;
        let joined = self.epoch_stats.examples() - examples;
        self.examples += joined;
        if self.step > self.timing.steady_from {
            self.timing.steady_examples += joined;
        }
        self.time(started.elapsed());
        self.joined_at = self.step;
        self.in_hand = true;
        self.cut_short = unrun > 0;
        Ok(self.cut_short)
    }

    /// Every task stops within the epoch (a stop request): the backup, then the preemption.
    fn stop_mid_epoch(&mut self, epoch: u64, session: &mut Session, callbacks: &mut Callbacks) -> TrainError {
        if let Err(e) = self.save(epoch - 1, false, true, session, callbacks) {
            return e;
        }
        self.preempt(session, callbacks)
    }

    fn shown(&self) -> Shown {
        Shown {
            loss: self.epoch_stats.loss(),
            accuracy: self.accuracy(&self.epoch_stats),
            val: self.last_eval.map(|e| (e.stats.loss(), self.accuracy(&e.stats))),
        }
    }

    /// The accuracy of `sums`, for class labels only: float targets have none.
    fn accuracy(&self, sums: &Sums) -> Option<f64> {
        self.plan.train.accuracy.then(|| sums.accuracy())
    }

    /// The logs after this step: `train` is the epoch's statistics so far.
    fn logs(&self, epoch: u64, train: &Sums, eval: Option<Eval>) -> Logs {
        Logs {
            epoch,
            step: self.step,
            loss: train.loss(),
            accuracy: self.accuracy(train),
            val_loss: eval.map(|e| e.stats.loss()),
            val_accuracy: eval.and_then(|e| self.accuracy(&e.stats)),
            learning_rate: self.lr,
        }
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
        let at = Moment { step: self.step, epoch_end, preempting, pausing: self.pauses_here(), logs: &logs };
        let cursor = self.input.cursor();
        let (examples, epoch_sums, last_epoch, last_eval) =
            (self.examples, self.epoch_stats, self.last_epoch, self.last_eval);
        let (step, backs_up) = (self.step, self.plan.callbacks.backs_up());
        let notes = callbacks.save(&at, |callbacks| {
            // Only when a save is due: a checkpoint never holds a NaN, and the pending
            // backup it would replace stays.
            non_finite_weights(step, session, backs_up)?;
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
                    worker_steps: session.strategy.worker_steps(),
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
            let accuracy = self.accuracy(&e).map_or(String::new(), |a| format!(" - accuracy: {a:.4}"));
            self.progress.note(&format!("test: loss: {:.4}{accuracy}", e.loss()));
        }
        non_finite_weights(self.step, session, self.plan.callbacks.backs_up())?;
        let sha = weights_sha256(&session.vars);
        let transport = session.strategy.transport();
        let parameter_server = session.strategy.parameter_server_stats();
        let stragglers = session.strategy.stragglers();
        // Every checkpoint is on disk before the job ends, so the evaluator finds the last one.
        // A paused run has not completed: its backup stays for the run that resumes it.
        let saves = callbacks.finish(stopped != StopReason::Paused)?;
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
                parameter_server,
                stragglers,
            },
        ))
    }
}

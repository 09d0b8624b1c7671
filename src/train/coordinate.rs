//! The chief's loop under `parameter_server` (TensorFlow's `ClusterCoordinator` driving
//! `model.fit`): asynchronous steps do not fit [`super::fit`]'s synchronous
//! compute-then-apply, so the chief schedules each epoch's closures on the workers through the
//! coordinator, joins at the epoch's end, pulls every shard from the ps tasks and then does
//! what `fit` does at an epoch's end with the same parts: evaluation, the metrics line,
//! callbacks, checkpoints in the usual format, and preemption (SIGTERM stops scheduling, the
//! steps in flight finish, a backup is saved).

use super::callbacks::{Callbacks, Control, Logs, Moment, StopReason};
use super::checkpointer::SavePoint;
use super::fit::{Ending, summary};
use super::metrics_log::{MetricsEvent, MetricsLine};
use super::resume::ResumePoint;
use super::run_dir::RunDir;
use super::summary::{ParameterServerStats, Summary};
use super::{FitOptions, Session, TrainError, eval_batch_size, first_non_finite, save_weights, weights_sha256};
use crate::checkpoint::manifest::{EvalState, LoopState};
use crate::cluster::Role;
use crate::cluster::job::DataPlane;
use crate::data::{Cursor, EvalBatches};
use crate::metrics::{Reading, Sums};
use crate::plan::Plan;
use crate::progress::{Progress, Shown};
use crate::strategy::StrategyError;
use crate::strategy::parameter_server::client::{Rates, RemoteWorker, Report, Servers};
use crate::strategy::parameter_server::coordinator::Coordinator;
use crate::strategy::parameter_server::layout::Layout;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The running job as the chief sees it.
struct Job {
    servers: Servers,
    coordinator: Coordinator,
    rates: Arc<Mutex<Rates>>,
    report: Arc<Mutex<Report>>,
    /// Steps scheduled so far (closures carry several).
    scheduled_steps: u64,
    /// Steps each worker had completed before this run (from the backup resumed).
    resumed_worker_steps: Vec<u64>,
    /// Every connection runs under mutual TLS (`cluster.tls`).
    encrypted: bool,
}

fn remote(e: impl ToString) -> TrainError {
    TrainError::Strategy(StrategyError::Remote(e.to_string()))
}

impl Job {
    /// Connects to every ps and worker of `data`, gives the ps tasks `session`'s values.
    /// `worker_steps`: the steps each worker completed before (from a backup), where each
    /// resumes its own shuffle.
    fn start(plan: &Plan, session: &Session, data: &DataPlane, worker_steps: &[u64]) -> Result<Self, TrainError> {
        let ps_plan = plan.parameter_server.as_ref().ok_or_else(|| remote("the plan has no parameter servers"))?;
        let layout = Layout::new(ps_plan, &session.tensors, &session.state_tensors).map_err(remote)?;
        let ps = data.peers(Role::Ps);
        let (startup, timeout) = (plan.cluster.startup_timeout, plan.cluster.timeout);
        let mut servers = Servers::connect(layout, &ps, data.token, (startup, timeout), data.tls.as_ref())?;
        servers.set(&session.vars, &session.optimizer)?;
        let rates = Arc::new(Mutex::new(Rates::default()));
        let report = Arc::new(Mutex::new(Report::default()));
        let mut workers = Vec::new();
        let mut resumed_worker_steps = Vec::new();
        for (i, (t, addr, host)) in data.peers(Role::Worker).into_iter().enumerate() {
            let (r, s) = (Arc::clone(&rates), Arc::clone(&report));
            let done = worker_steps.get(i).copied().unwrap_or(0);
            resumed_worker_steps.push(done);
            let (at, auth) = ((addr, host), (data.token, data.tls.clone()));
            workers.push(RemoteWorker::connect(t, at, auth, (startup, timeout), done, (r, s))?);
        }
        let coordinator = Coordinator::new(workers, ps_plan.queue_size, ps_plan.max_staleness);
        let encrypted = data.tls.is_some();
        Ok(Self { servers, coordinator, rates, report, scheduled_steps: 0, resumed_worker_steps, encrypted })
    }

    /// The steps each worker has completed, this run and before it.
    fn worker_steps(&self) -> Vec<u64> {
        let now = self.coordinator.stats().steps_per_worker;
        now.iter().zip(&self.resumed_worker_steps).map(|(a, b)| a + b).collect()
    }

    fn take_report(&self) -> Report {
        std::mem::take(&mut *self.report.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn stats(&self, staleness: &BTreeMap<u64, u64>) -> ParameterServerStats {
        let s = self.coordinator.stats();
        ParameterServerStats {
            steps_scheduled: self.scheduled_steps,
            steps_applied: s.steps_applied(),
            steps_applied_per_worker: s.steps_per_worker,
            closures_rescheduled: s.rescheduled,
            rejoins_per_worker: s.rejoins_per_worker,
            steps_applied_since_rejoin: s.steps_since_rejoin,
            absent_ms_per_worker: s.absent_ms_per_worker,
            staleness_histogram: staleness.clone(),
            shared_memory_workers_per_ps: self.servers.shared_workers().to_vec(),
        }
    }
}

/// The loop's state between epochs.
struct Loop<'a> {
    plan: &'a Plan,
    opts: &'a FitOptions,
    job: Job,
    progress: Progress,
    eval_batch: NonZeroUsize,
    step: u64,
    examples: u64,
    last_epoch: Sums,
    last_eval: Option<(u64, Sums)>,
    staleness: BTreeMap<u64, u64>,
    first_step_s: Option<f64>,
    steady: Duration,
    steady_examples: u64,
}

/// What one epoch's scheduling did.
struct Ran {
    /// Steps of the epoch done (all of them unless a stop was asked).
    done: u64,
    /// A stop (SIGTERM) was asked: no more steps were scheduled.
    vote: bool,
    /// The workers' statistics over the epoch's steps.
    report: Report,
    took: Duration,
    /// A callback stopped training at an evaluation within the epoch.
    stop: Option<StopReason>,
}

/// Trains `session` as `plan` says, with the workers and ps tasks of `data` doing the steps.
pub fn coordinate(
    plan: &Plan,
    session: &mut Session,
    callbacks: &mut Callbacks,
    mut run_dir: Option<&mut RunDir>,
    opts: &FitOptions,
    resume: Option<ResumePoint>,
    data: &DataPlane,
) -> Result<Summary, TrainError> {
    crate::signals::cooperative_stop();
    let t = &plan.train;
    let spe = t.steps_per_epoch.max(1);
    if let Some(r) = &resume {
        callbacks.restore(&r.loop_state.callbacks, r.epochs_done, r.best.as_ref())?;
    }
    let start = resume.as_ref().map_or(0, |r| r.step);
    let micro = NonZeroUsize::new(plan.batch.per_replica).unwrap_or(NonZeroUsize::MIN);
    let mut lp = Loop {
        plan,
        opts,
        job: Job::start(plan, session, data, resume.as_ref().map_or(&[][..], |r| &r.loop_state.worker_steps))?,
        progress: Progress::new(opts.progress, t.epochs, opts.prefix.clone()),
        eval_batch: eval_batch_size(micro, 1, session.activation_len),
        step: start,
        examples: resume.as_ref().map_or(0, |r| r.loop_state.examples),
        last_epoch: Sums::default(),
        last_eval: None,
        staleness: BTreeMap::new(),
        first_step_s: None,
        steady: Duration::ZERO,
        steady_examples: 0,
    };
    let mut stopped = StopReason::Completed;
    for epoch in start / spe + 1..=t.epochs {
        let first = if epoch == start / spe + 1 { start % spe } else { 0 };
        let ran = lp.run_epoch(epoch, first, session, callbacks, run_dir.as_deref_mut())?;
        lp.job.servers.pull(&mut session.vars, &mut session.optimizer)?;
        let logs = lp.logs(epoch, &ran, session, callbacks)?;
        let mut at_end = StopReason::Completed;
        if ran.done == spe {
            at_end = lp.end_epoch(epoch, &ran, &logs, session, callbacks, run_dir.as_deref_mut())?;
        }
        stopped = ran.stop.unwrap_or(at_end);
        lp.save(epoch, &ran, &logs, session, callbacks)?;
        if ran.vote {
            let backup = callbacks.flush()?;
            callbacks.finish(false)?;
            leave(lp.job)?;
            session.strategy.finish()?;
            return Err(TrainError::Preempted {
                step: lp.step,
                backup,
                chief: true,
                backs_up: plan.callbacks.backs_up(),
            });
        }
        if stopped != StopReason::Completed {
            lp.progress.note(&format!("stopped: {}", stopped.name()));
            break;
        }
    }
    lp.finish(stopped, session, callbacks, run_dir, resume.as_ref().map(|r| r.step))
}

impl Loop<'_> {
    /// Schedules epoch `epoch`'s steps from `first` (until a stop is asked) and joins them.
    /// Every `train.evaluate_every_steps` steps it waits for the steps scheduled, pulls the
    /// variables and evaluates them (`mid_epoch`), as TensorFlow's coordinator joins before
    /// an inline evaluation.
    fn run_epoch(
        &mut self,
        epoch: u64,
        first: u64,
        session: &mut Session,
        callbacks: &mut Callbacks,
        mut run_dir: Option<&mut RunDir>,
    ) -> Result<Ran, TrainError> {
        let (plan, spe) = (self.plan, self.plan.train.steps_per_epoch.max(1));
        let per_closure = plan.parameter_server.as_ref().map_or(1, |p| p.steps_per_execution.get());
        let base = (epoch - 1) * spe;
        self.progress.start_epoch(epoch, spe, first);
        let lrs = (base..base + spe).map(|s| callbacks.learning_rate(plan.learning_rate.at(s)) as f32).collect();
        *self.job.rates.lock().unwrap_or_else(PoisonError::into_inner) = Rates { first: base, lrs };
        let began = Instant::now();
        self.first_step_s.get_or_insert_with(|| self.opts.launched.elapsed().as_secs_f64());
        let applied_before = self.job.coordinator.stats().steps_applied();
        let every = plan.train.eval.and_then(|e| e.every_steps).unwrap_or(u64::MAX).max(1);
        let (mut done, mut vote, mut stop, mut evaluating) = (first, false, None, Duration::ZERO);
        while done < spe && stop.is_none() {
            vote = self.opts.stop.load(Ordering::Relaxed);
            if vote {
                // Only the closures in flight finish; those still queued were never started,
                // so their steps are not counted.
                done -= self.job.coordinator.cancel();
                break;
            }
            // A closure ends at the next evaluation, so that it sees exactly the steps before.
            let to_eval = every - (base + done) % every;
            let n = per_closure.min(spe - done).min(to_eval);
            self.job.coordinator.schedule(base + done, n).map_err(remote)?;
            self.job.scheduled_steps += n;
            done += n;
            let applied = self.job.coordinator.stats().steps_applied() - applied_before;
            self.progress.step(first + applied, &Shown::default());
            let epoch_end = done == spe;
            if (base + done).is_multiple_of(every) && !(epoch_end && plan.train.eval.is_some_and(|e| e.every_epoch)) {
                self.job.coordinator.join().map_err(remote)?;
                let at = Instant::now();
                self.step = base + done;
                self.job.servers.pull(&mut session.vars, &mut session.optimizer)?;
                stop = self.mid_epoch(epoch, session, callbacks, run_dir.as_deref_mut())?;
                evaluating += at.elapsed();
            }
        }
        self.job.coordinator.join().map_err(remote)?;
        // Throughput counts training time, as `fit`'s does: not the evaluations within.
        let took = began.elapsed().saturating_sub(evaluating);
        self.step = base + done;
        let report = self.job.take_report();
        for (k, v) in &report.staleness {
            *self.staleness.entry(*k).or_insert(0) += v;
        }
        self.examples += report.stats.examples();
        if epoch > 1 || plan.train.epochs == 1 {
            self.steady += took;
            self.steady_examples += report.stats.examples();
        }
        Ok(Ran { done, vote, report, took, stop })
    }

    /// An evaluation within an epoch on the variables just pulled: the `evaluation` metrics
    /// line, the display and the callbacks' verdict (a stop at a target).
    fn mid_epoch(
        &mut self,
        epoch: u64,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<Option<StopReason>, TrainError> {
        let eval = evaluate(self.plan, session, self.eval_batch)?;
        self.last_eval = Some((self.step, eval));
        let train = self.job.report.lock().unwrap_or_else(PoisonError::into_inner).stats;
        let logs = Logs {
            epoch,
            step: self.step,
            loss: train.loss(),
            accuracy: train.accuracy(),
            val_loss: Some(eval.loss()),
            val_accuracy: Some(eval.accuracy()),
            learning_rate: callbacks.learning_rate(self.plan.learning_rate.at(self.step.saturating_sub(1))),
        };
        if let Some(d) = run_dir {
            let reading = Reading::new(&self.plan.train.metrics, train, Some(eval), 0.0);
            d.metrics(&self.metrics_line(MetricsEvent::Evaluation, &logs, reading))?;
        }
        let (loss, accuracy) = (eval.loss(), eval.accuracy());
        self.progress.note(&format!("step {}: val_loss: {loss:.4} - val_accuracy: {accuracy:.4}", self.step));
        let reason = match callbacks.on_evaluation(&logs) {
            Control::Continue => return Ok(None),
            Control::Stop(r) | Control::StopAndRestore(r) => r,
        };
        let shown = Shown { loss: logs.loss, accuracy: logs.accuracy, val: Some((loss, accuracy)) };
        let spe = self.plan.train.steps_per_epoch.max(1);
        self.progress.end_epoch(epoch, self.step - (epoch - 1) * spe, &shown);
        Ok(Some(reason))
    }

    fn metrics_line(&self, event: MetricsEvent, logs: &Logs, reading: Reading) -> MetricsLine {
        let wall_s = self.opts.launched.elapsed().as_secs_f64();
        let line = MetricsLine::of(event, logs, reading, wall_s);
        MetricsLine { parameter_server: Some(self.job.stats(&self.staleness)), ..line }
    }

    /// The logs after an epoch's steps, evaluated when the epoch ended and evaluation is due.
    fn logs(
        &mut self,
        epoch: u64,
        ran: &Ran,
        session: &mut Session,
        callbacks: &Callbacks,
    ) -> Result<Logs, TrainError> {
        let epoch_end = ran.done == self.plan.train.steps_per_epoch.max(1);
        if epoch_end && self.plan.train.eval.is_some_and(|e| e.every_epoch) {
            self.last_eval = Some((self.step, evaluate(self.plan, session, self.eval_batch)?));
        }
        let eval_now = self.last_eval.filter(|e| e.0 == self.step).map(|e| e.1);
        Ok(Logs {
            epoch,
            step: self.step,
            loss: ran.report.stats.loss(),
            accuracy: ran.report.stats.accuracy(),
            val_loss: eval_now.map(|e| e.loss()),
            val_accuracy: eval_now.map(|e| e.accuracy()),
            learning_rate: callbacks.learning_rate(self.plan.learning_rate.at(self.step.saturating_sub(1))),
        })
    }

    /// An epoch's end: the metrics line, the display and the callbacks' verdict.
    fn end_epoch(
        &mut self,
        epoch: u64,
        ran: &Ran,
        logs: &Logs,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
    ) -> Result<StopReason, TrainError> {
        self.last_epoch = ran.report.stats;
        if let Some(d) = run_dir {
            let per_s = ran.report.stats.examples() as f64 / ran.took.as_secs_f64().max(1e-9);
            let val = self.last_eval.filter(|e| e.0 == self.step && logs.val_loss.is_some()).map(|e| e.1);
            let reading = Reading::new(&self.plan.train.metrics, ran.report.stats, val, per_s);
            d.metrics(&self.metrics_line(MetricsEvent::Epoch, logs, reading))?;
        }
        let shown = Shown { loss: logs.loss, accuracy: logs.accuracy, val: logs.val_loss.zip(logs.val_accuracy) };
        self.progress.end_epoch(epoch, self.plan.train.steps_per_epoch, &shown);
        Ok(match callbacks.on_epoch_end(logs, &session.vars)? {
            Control::Continue => StopReason::Completed,
            Control::Stop(r) => r,
            Control::StopAndRestore(r) => {
                if let Some(best) = callbacks.best_weights() {
                    session.vars.clone_from(best);
                    self.last_eval = None;
                }
                r
            }
        })
    }

    /// Saves what the callbacks ask for with the pulled variables and optimizer state.
    fn save(
        &mut self,
        epoch: u64,
        ran: &Ran,
        logs: &Logs,
        session: &Session,
        callbacks: &mut Callbacks,
    ) -> Result<(), TrainError> {
        let epoch_end = ran.done == self.plan.train.steps_per_epoch.max(1);
        let epochs_done = if epoch_end { epoch } else { epoch - 1 };
        let step = self.step;
        let loop_state = |callbacks| LoopState {
            examples: self.examples,
            epoch_sums: if epoch_end { Sums::default() } else { ran.report.stats },
            last_epoch_sums: self.last_epoch,
            last_eval: self.last_eval.map(|(step, sums)| EvalState { step, sums }),
            callbacks,
            best_weights: false,
            worker_steps: self.job.worker_steps(),
        };
        let at = Moment { step, epoch_end, preempting: ran.vote, logs };
        let (vars, optimizer) = (&session.vars, &session.optimizer);
        let notes = callbacks.save(&at, |callbacks| {
            if let Some(t) = first_non_finite(vars, &session.tensors, &session.state_tensors) {
                return Err(TrainError::NonFinite { step, what: format!("the weight tensor `{t}`") });
            }
            Ok(SavePoint { epochs_done, cursor: Cursor::default(), loop_state: loop_state(callbacks), vars, optimizer })
        })?;
        for n in notes {
            self.progress.note(&n);
        }
        Ok(())
    }

    /// The job is left, the final evaluation, the weights and the summary.
    fn finish(
        mut self,
        stopped: StopReason,
        session: &mut Session,
        callbacks: &mut Callbacks,
        run_dir: Option<&mut RunDir>,
        resumed_from_step: Option<u64>,
    ) -> Result<Summary, TrainError> {
        let (plan, step) = (self.plan, self.step);
        let ps_stats = self.job.stats(&self.staleness);
        let transport = if self.job.encrypted { "tcp_tls" } else { "tcp" };
        leave(self.job)?;
        let final_eval = match self.last_eval {
            Some((s, e)) if s == step => Some(e),
            _ if plan.train.eval.is_some() => Some(evaluate(plan, session, self.eval_batch)?),
            _ => None,
        };
        if let Some(e) = final_eval {
            self.progress.note(&format!("test: loss: {:.4} - accuracy: {:.4}", e.loss(), e.accuracy()));
        }
        let saves = callbacks.finish(true)?;
        session.strategy.finish()?;
        if let Some(d) = run_dir.as_deref() {
            save_weights(&d.path().join("model.safetensors"), &session.vars, &session.tensors, &session.state_tensors)?;
        }
        let steady = self.steady_examples as f64 / self.steady.as_secs_f64().max(1e-9);
        Ok(summary(
            plan,
            self.opts.launched,
            session,
            Ending {
                stopped,
                last_epoch: self.last_epoch,
                final_eval,
                steps: step,
                examples: self.examples,
                first_step_s: self.first_step_s,
                // The chief reads no training batches: the workers wait for their own.
                input_wait_s: 0.0,
                steady_examples_per_s: steady,
                weights_sha256: weights_sha256(&session.vars),
                transport: Some(transport),
                resumed_from_step,
                saves,
                parameter_server: Some(ps_stats),
            },
        ))
    }
}

/// Ends the job: the workers are told to leave (dropping the coordinator), then the ps tasks.
fn leave(job: Job) -> Result<(), TrainError> {
    let Job { mut servers, coordinator, .. } = job;
    drop(coordinator);
    servers.stop()?;
    Ok(())
}

/// Loss and accuracy on the test split with the pulled variables.
/// Evaluates the variables pulled last. Every evaluation follows a join, so the workers wait
/// meanwhile and the chief evaluates with the plan's evaluation threads (every core of its
/// machine) rather than its share of the cores while they train. Evaluating a snapshot beside
/// the training workers instead hid nothing on two cores: the chief, two workers and a ps
/// already keep both busy, so the evaluation's work only slowed the steps.
fn evaluate(plan: &Plan, session: &mut Session, batch: NonZeroUsize) -> Result<Sums, TrainError> {
    let Some(test) = session.dataset.test.as_ref() else { return Ok(Sums::default()) };
    let limit = plan.train.eval.and_then(|e| e.validation_steps).map_or(usize::MAX, |v| v as usize);
    let mut batches = EvalBatches::new(test, batch, session.shard).take(limit);
    let threads = plan.parameter_server.as_ref().map_or(plan.threads, |p| p.eval_threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| remote(format!("cannot start {threads} evaluation threads: {e}")))?;
    let (strategy, vars) = (&mut session.strategy, &mut session.vars);
    Ok(pool.install(|| strategy.evaluate(vars, &mut batches))?)
}

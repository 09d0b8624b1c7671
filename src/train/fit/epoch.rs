//! The loop's evaluations and an epoch's end: the evaluation every N steps, the one at the
//! epoch's end with its metrics line, display and the callbacks' verdict.

use super::{Eval, Loop};
use crate::data::EvalBatches;
use crate::metrics::{Reading, Sums};
use crate::progress::Shown;
use crate::train::Session;
use crate::train::TrainError;
use crate::train::callbacks::{Callbacks, Control, Logs, StopReason};
use crate::train::metrics_log::{MetricsEvent, MetricsLine};
use crate::train::run_dir::RunDir;
use std::time::Duration;

impl Loop<'_> {
    /// The evaluation every N steps (unless the epoch's end evaluates anyway); returns why to
    /// stop when a callback says so.
    pub(super) fn evaluate_mid_epoch(
        &mut self,
        epoch: u64,
        done: u64,
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
        if self.join(session)? {
            return Ok(None);
        }
        let stats = self.evaluate(session)?;
        self.last_eval = Some(Eval { step: self.step, stats });
        let logs = self.logs(epoch, &self.epoch_stats, self.last_eval);
        if let Some(d) = run_dir {
            d.metrics(&self.metrics_line(MetricsEvent::Evaluation, &logs, session))?;
        }
        let (loss, accuracy) = (stats.loss(), self.accuracy(&stats));
        let shown_accuracy = accuracy.map_or(String::new(), |a| format!(" - val_accuracy: {a:.4}"));
        self.progress.note(&format!("step {}: val_loss: {loss:.4}{shown_accuracy}", self.step));
        let reason = match callbacks.on_evaluation(&logs) {
            Control::Continue => return Ok(None),
            Control::Stop(r) | Control::StopAndRestore(r) => r,
        };
        let shown = Shown { val: Some((loss, accuracy)), ..self.shown() };
        self.progress.end_epoch(epoch, done, &shown);
        self.progress.note(&format!("stopped: {}", reason.name()));
        self.last_epoch = self.epoch_stats;
        Ok(Some(reason))
    }

    /// An epoch's end: its evaluation, metrics line and display, and the callbacks' verdict
    /// (acted on here: the best weights put back when asked). Returns why to stop, if so.
    pub(super) fn end_epoch(
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
            let line = self.metrics_line(MetricsEvent::Epoch, &logs, session);
            for s in &line.stragglers {
                self.progress.note(&format!(
                    "straggler: {} steps in {:.2} ms (p50; p90 {:.2} ms), {:.1}x the job's median",
                    s.task, s.p50_ms, s.p90_ms, s.slower
                ));
            }
            d.metrics(&line)?;
        }
        let shown =
            Shown { loss: logs.loss, accuracy: logs.accuracy, val: logs.val_loss.map(|l| (l, logs.val_accuracy)) };
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

    pub(super) fn evaluate(&self, session: &mut Session) -> Result<Sums, TrainError> {
        let Some(test) = session.dataset.test.as_ref() else {
            return Ok(Sums::default());
        };
        let limit = self.plan.train.eval.and_then(|e| e.validation_steps).map_or(usize::MAX, |v| v as usize);
        let mut batches = EvalBatches::new(test, self.eval_batch, session.shard);
        let stats = session.strategy.evaluate(&mut session.vars, &mut batches.by_ref().take(limit))?;
        batches.finish()?;
        Ok(stats)
    }

    pub(super) fn metrics_line(&self, event: MetricsEvent, logs: &Logs, session: &Session) -> MetricsLine {
        let per_s = self.epoch_stats.examples() as f64 / self.timing.epoch.as_secs_f64().max(1e-9);
        let val = self.last_eval.filter(|e| e.step == self.step && logs.val_loss.is_some()).map(|e| e.stats);
        let reading = Reading::new(&self.plan.train.metrics, self.epoch_stats, val, per_s);
        let line = MetricsLine::of(event, logs, reading, self.opts.launched.elapsed().as_secs_f64());
        MetricsLine {
            parameter_server: session.strategy.parameter_server_stats(),
            stragglers: session.strategy.stragglers(),
            ..line
        }
    }
}

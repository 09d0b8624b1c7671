//! Callbacks, with Keras's meanings, behind one trait: [`Callback`]. The loop calls every
//! callback at the same points — after an evaluation, at an epoch's end, after each step for
//! checkpoints — and acts on what they return; each callback keeps its own memory and hands it
//! to backups under its name, so a resumed run decides exactly as an uninterrupted one.
//!
//! Adding a callback is a spec variant, a plan variant, a file here and one arm in [`build`].

mod backup_and_restore;
mod csv_logger;
mod early_stopping;
mod model_checkpoint;
mod reduce_lr_on_plateau;
mod stop_at_target;

use super::checkpointer::{Checkpointer, SavePoint, SaveRequest};
use crate::checkpoint::manifest::CallbacksState;
use crate::checkpoint::{CheckpointError, HeldBackup, Layout, SaveStats};
use crate::plan::{CallbackKind, Plan};
use crate::strategy::Variables;
use crate::vocab::{Direction, Monitor};
use serde::Serialize;
use std::path::PathBuf;

/// Metrics after an epoch or an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logs {
    /// 1-based epoch.
    pub epoch: u64,
    /// Optimizer steps done.
    pub step: u64,
    /// Training loss of the epoch so far.
    pub loss: f64,
    /// Training accuracy of the epoch so far; none for float targets.
    pub accuracy: Option<f64>,
    /// Test-split loss, when evaluated.
    pub val_loss: Option<f64>,
    /// Test-split accuracy, when evaluated.
    pub val_accuracy: Option<f64>,
    /// Learning rate of the last step.
    pub learning_rate: f64,
}

impl Logs {
    /// The watched metric, when known.
    pub fn get(&self, m: Monitor) -> Option<f64> {
        match m {
            Monitor::Loss => Some(self.loss),
            Monitor::Accuracy => self.accuracy,
            Monitor::ValLoss => self.val_loss,
            Monitor::ValAccuracy => self.val_accuracy,
        }
    }
}

/// Whether `current` beats `best` by more than `min_delta` in `direction`.
fn improved(direction: Direction, current: f64, best: f64, min_delta: f64) -> bool {
    match direction {
        Direction::Max => current > best + min_delta,
        Direction::Min => current < best - min_delta,
    }
}

/// The value every first measurement improves on.
fn worst(direction: Direction) -> f64 {
    match direction {
        Direction::Max => f64::NEG_INFINITY,
        Direction::Min => f64::INFINITY,
    }
}

/// Why training stopped (`summary.json`'s `stopped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Every epoch ran.
    Completed,
    /// `early_stopping` saw no improvement for `patience` epochs.
    EarlyStopping,
    /// `stop_at_target` saw its target reached.
    TargetReached,
    /// `train.stop_at_step` was reached: the run stopped there with a backup, which a later
    /// run resumes to train on.
    Paused,
}

impl StopReason {
    /// The name `summary.json` and the display use.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::EarlyStopping => "early_stopping",
            StopReason::TargetReached => "target_reached",
            StopReason::Paused => "paused",
        }
    }
}

/// What the loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep training.
    Continue,
    /// Stop now.
    Stop(StopReason),
    /// Stop now and put back the best weights seen (early stopping's `restore_best_weights`).
    StopAndRestore(StopReason),
}

/// A callback could not write its file.
#[derive(Debug, thiserror::Error)]
#[error("callback cannot write {path}: {source}")]
pub struct CallbackError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// What a backup gives back to a callback on resume.
pub struct Restore<'a> {
    /// The callback's own memory, as its `state` returned it (`Null` when the backup has none).
    pub state: &'a serde_json::Value,
    /// Epochs finished when the backup was taken.
    pub epochs_done: u64,
    /// Early stopping's best weights, when the backup kept them.
    pub best: Option<&'a Variables>,
}

/// Where the loop stands when checkpoints may be due.
#[derive(Debug, Clone, Copy)]
pub struct Moment<'a> {
    /// Optimizer steps done.
    pub step: u64,
    /// Whether `step` ends an epoch.
    pub epoch_end: bool,
    /// Every task voted to stop (SIGTERM): a backup is due regardless of its frequency.
    pub preempting: bool,
    /// The run stops here (`train.stop_at_step`) and is resumed later: a backup is due
    /// regardless of its frequency, and nothing else is.
    pub pausing: bool,
    /// Metrics now (an evaluation's only if it was taken at this step).
    pub logs: &'a Logs,
}

/// One callback. Every method has a do-nothing default, so a callback implements what it
/// reacts to.
pub trait Callback: Send {
    /// Its unique name, the key of its memory in backups.
    fn name(&self) -> &str;

    /// The learning rate to use where the schedule (and earlier callbacks) say `lr`.
    fn learning_rate(&self, lr: f64) -> f64 {
        lr
    }

    /// After an evaluation in the middle of an epoch: as in Keras, only targets act there.
    fn on_evaluation(&mut self, _logs: &Logs) -> Control {
        Control::Continue
    }

    /// At an epoch's end, with the variables as they are then.
    fn on_epoch_end(&mut self, _logs: &Logs, _vars: &Variables) -> Result<Control, CallbackError> {
        Ok(Control::Continue)
    }

    /// The checkpoint this callback wants written now, if any; `notes` collects what to tell
    /// the user.
    fn checkpoint(&mut self, _at: &Moment<'_>, _notes: &mut Vec<String>) -> Option<SaveRequest> {
        None
    }

    /// Its memory, for backups (`Null`: none).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Takes back its memory from a backup.
    fn restore(&mut self, _from: &Restore<'_>) -> Result<(), CallbackError> {
        Ok(())
    }

    /// Early stopping's best weights, kept for `restore_best_weights`.
    fn best_weights(&self) -> Option<&Variables> {
        None
    }

    /// Training is over: `completed` when it ran to its end (not preempted or failed).
    fn on_train_end(&mut self, _completed: bool) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// The run's callbacks, in spec order, and the checkpoint writer they share.
pub struct Callbacks {
    items: Vec<Box<dyn Callback>>,
    checkpointer: Option<Checkpointer>,
    /// The backup of the run's last step (its end or its pause), once [`Callbacks::finish`]
    /// has it on disk.
    last_backup: Option<HeldBackup>,
}

/// Builds `plan`'s callbacks for this task: the chief (`writes`) gets the ones that write
/// files; other workers keep the ones that decide (they see the same metrics, so they stop at
/// the same step).
pub fn build(
    plan: &Plan,
    writes: bool,
    layout: Layout,
    spec_hash: String,
    optimizer: &[&str],
) -> Result<Callbacks, CheckpointError> {
    let mut items: Vec<Box<dyn Callback>> = Vec::new();
    let mut saves = false;
    for cb in &plan.callbacks.items {
        let name = cb.name.clone();
        let item: Box<dyn Callback> = match &cb.kind {
            CallbackKind::ModelCheckpoint { dir, every, best_only, max_to_keep } if writes => {
                saves = true;
                Box::new(model_checkpoint::ModelCheckpoint::new(name, dir, *every, *best_only, *max_to_keep))
            }
            CallbackKind::BackupAndRestore { dir, every, delete_on_success } if writes => {
                saves = true;
                Box::new(backup_and_restore::BackupAndRestore::new(name, dir, *every, *delete_on_success))
            }
            CallbackKind::ModelCheckpoint { .. } | CallbackKind::BackupAndRestore { .. } => continue,
            CallbackKind::CsvLogger { path, append } if writes => {
                Box::new(csv_logger::CsvLogger::new(name, path.clone(), *append))
            }
            CallbackKind::CsvLogger { .. } => continue,
            CallbackKind::EarlyStopping { watch, min_delta, patience, restore_best_weights } => {
                Box::new(early_stopping::EarlyStopping::new(name, *watch, *min_delta, *patience, *restore_best_weights))
            }
            CallbackKind::ReduceLrOnPlateau { watch, factor, patience, min_delta, cooldown, min_lr } => {
                Box::new(reduce_lr_on_plateau::ReduceLrOnPlateau::new(
                    name, *watch, *factor, *patience, *min_delta, *cooldown, *min_lr,
                ))
            }
            CallbackKind::StopAtTarget { monitor, target } => {
                Box::new(stop_at_target::StopAtTarget::new(name, *monitor, *target))
            }
        };
        items.push(item);
    }
    let checkpointer = if saves { Some(Checkpointer::new(plan, layout, spec_hash, optimizer)?) } else { None };
    Ok(Callbacks { items, checkpointer, last_backup: None })
}

impl Callbacks {
    /// Callbacks that are only these, with no checkpoint writer (for tests and tools).
    pub fn of(items: Vec<Box<dyn Callback>>) -> Self {
        Self { items, checkpointer: None, last_backup: None }
    }

    /// Whether a backup would be written when every task stops (so a preemption can resume).
    pub fn backs_up(&self) -> bool {
        self.checkpointer.as_ref().is_some_and(Checkpointer::backs_up)
    }

    /// The learning rate to use where the schedule says `scheduled`.
    pub fn learning_rate(&self, scheduled: f64) -> f64 {
        self.items.iter().fold(scheduled, |lr, c| c.learning_rate(lr))
    }

    /// After a mid-epoch evaluation: the first callback that stops wins.
    pub fn on_evaluation(&mut self, logs: &Logs) -> Control {
        self.items
            .iter_mut()
            .map(|c| c.on_evaluation(logs))
            .find(|c| *c != Control::Continue)
            .unwrap_or(Control::Continue)
    }

    /// At an epoch's end: every callback decides (in spec order); the first stop wins.
    pub fn on_epoch_end(&mut self, logs: &Logs, vars: &Variables) -> Result<Control, CallbackError> {
        let mut control = Control::Continue;
        for c in &mut self.items {
            let decided = c.on_epoch_end(logs, vars)?;
            if control == Control::Continue {
                control = decided;
            }
        }
        Ok(control)
    }

    /// Early stopping's best weights, if a callback keeps them.
    pub fn best_weights(&self) -> Option<&Variables> {
        self.items.iter().find_map(|c| c.best_weights())
    }

    /// Every callback's memory, by name.
    pub fn state(&self) -> CallbacksState {
        self.items.iter().map(|c| (c.name().to_string(), c.state())).filter(|(_, v)| !v.is_null()).collect()
    }

    /// Gives each callback back its memory from a backup taken after `epochs_done` epochs.
    pub fn restore(
        &mut self,
        state: &CallbacksState,
        epochs_done: u64,
        best: Option<&Variables>,
    ) -> Result<(), CallbackError> {
        for c in &mut self.items {
            let own = state.get(c.name()).unwrap_or(&serde_json::Value::Null);
            c.restore(&Restore { state: own, epochs_done, best })?;
        }
        Ok(())
    }

    /// Writes what the callbacks want saved at `at`; `point` gives the rest of the training
    /// state from the callbacks' memory (only called when something is due). Returns notes for
    /// the display.
    pub fn save<'p, E: From<CheckpointError>>(
        &mut self,
        at: &Moment<'_>,
        point: impl FnOnce(CallbacksState) -> Result<SavePoint<'p>, E>,
    ) -> Result<Vec<String>, E> {
        let mut notes = Vec::new();
        let Callbacks { items, checkpointer, .. } = self;
        let Some(ck) = checkpointer else { return Ok(notes) };
        let requests: Vec<SaveRequest> = items.iter_mut().filter_map(|c| c.checkpoint(at, &mut notes)).collect();
        if requests.is_empty() {
            return Ok(notes);
        }
        let state = items.iter().map(|c| (c.name().to_string(), c.state())).filter(|(_, v)| !v.is_null()).collect();
        let best = items.iter().find_map(|c| c.best_weights());
        ck.save(requests, at, point(state)?, best)?;
        Ok(notes)
    }

    /// Waits for every save to be on disk; returns the last backup's folder.
    pub fn flush(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        match &mut self.checkpointer {
            Some(ck) => ck.flush(),
            None => Ok(None),
        }
    }

    /// The backup of the run's last step, after [`Callbacks::finish`]: a sweep's resident trial
    /// restores from it when promoted ([`crate::checkpoint::held`]).
    pub fn take_last_backup(&mut self) -> Option<HeldBackup> {
        self.last_backup.take()
    }

    /// Ends saving (every checkpoint on disk) and tells each callback how training ended.
    pub fn finish(&mut self, completed: bool) -> Result<Option<SaveStats>, CheckpointError> {
        let finished = self.checkpointer.take().map(Checkpointer::finish).transpose()?;
        let stats = finished.map(|(stats, last)| {
            self.last_backup = last;
            stats
        });
        for c in &mut self.items {
            c.on_train_end(completed)?;
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests;

//! `backup_and_restore`: Keras's `BackupAndRestore`. Backs up the whole training state every
//! epoch or every N steps, when every task is asked to stop and where the run pauses
//! (`train.stop_at_step`); the run resumes from the newest good backup (`train::resume`), and a
//! completed run removes it.

use super::{Callback, Moment};
use crate::checkpoint::policy::Policy;
use crate::checkpoint::{CheckpointError, Kind, Store};
use crate::plan::SaveEvery;
use crate::train::checkpointer::SaveRequest;
use std::path::Path;

/// The callback.
pub struct BackupAndRestore {
    name: String,
    store: Store,
    every: SaveEvery,
    delete_on_success: bool,
}

impl BackupAndRestore {
    /// Backups into `dir`.
    pub fn new(name: String, dir: &Path, every: SaveEvery, delete_on_success: bool) -> Self {
        Self { name, store: Store::new(dir), every, delete_on_success }
    }
}

impl Callback for BackupAndRestore {
    fn name(&self) -> &str {
        &self.name
    }

    fn checkpoint(&mut self, at: &Moment<'_>, _notes: &mut Vec<String>) -> Option<SaveRequest> {
        (at.preempting || at.pausing || self.every.due(at.step, at.epoch_end)).then(|| SaveRequest {
            kind: Kind::Backup,
            store: self.store.clone(),
            policy: Policy::BACKUP,
        })
    }

    fn on_train_end(&mut self, completed: bool) -> Result<(), CheckpointError> {
        if completed && self.delete_on_success { self.store.delete_all() } else { Ok(()) }
    }
}

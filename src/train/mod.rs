//! The training loop: Keras's `model.fit` over a strategy, with evaluation, callbacks,
//! checkpoints, resumption, preemption, progress and the run folder.

pub mod callbacks;
pub mod checkpointer;
pub mod ended;
pub mod evaluator;
mod fit;
pub mod metrics_log;
pub mod resume;
pub mod run_dir;
pub mod run_json;
pub mod summary;
pub mod tensorboard;
mod weights;

pub use fit::{FitOptions, eval_batch_size, fit};

pub use weights::{first_non_finite, save_weights, weights_sha256};

use crate::checkpoint::CheckpointError;
use crate::data::{Dataset, Shard};
use crate::engine::{Optimizer, TensorInfo};
use crate::strategy::{Strategy, StrategyError, Variables};
use callbacks::CallbackError;
use run_dir::RecordError;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// A loss or a weight became NaN or infinite (Keras's `TerminateOnNaN`): training stops
    /// before anything non-finite is saved, so the last good backup stays.
    #[error("{}", non_finite_text(*step, what, *backs_up))]
    NonFinite {
        /// The step whose loss or update was not finite.
        step: u64,
        /// The loss, or the first non-finite tensor by its Keras weight path.
        what: String,
        /// Whether the spec has `backup_and_restore`: what the next run starts from.
        backs_up: bool,
    },
    /// A task was asked to stop (SIGTERM): every task stopped at the same step, after the
    /// chief saved a backup to resume from.
    #[error("{}", preempted_text(*step, backup.as_deref(), *chief, *backs_up))]
    Preempted {
        /// The step every task stopped after.
        step: u64,
        /// The backup written there, when the run backs up.
        backup: Option<PathBuf>,
        /// Whether this task is the chief (the one that saves).
        chief: bool,
        /// Whether the spec has `backup_and_restore`.
        backs_up: bool,
    },
}

fn non_finite_text(step: u64, what: &str, backs_up: bool) -> String {
    let (kept, next) = if backs_up {
        (
            "the last good backup stays",
            "then run again (it resumes from the last backup, or starts over if none was saved yet)",
        )
    } else {
        (
            "there is no backup to go back to",
            "then run again: without a backup_and_restore callback the next run starts over from step 0 (add \
             `[[callbacks]] kind = \"backup_and_restore\"` to resume from the last good step next time)",
        )
    };
    format!(
        "training diverged at step {step}: {what} is not finite (NaN or infinite); nothing from this step on was \
         saved, {kept}\n  help: lower optimizer.learning_rate, add optimizer.warmup or clip gradients, {next}"
    )
}

fn preempted_text(step: u64, backup: Option<&std::path::Path>, chief: bool, backs_up: bool) -> String {
    match (backup, chief, backs_up) {
        (Some(b), _, _) => format!(
            "preempted: stopped after step {step} and saved {}; run the same command again to resume",
            b.display()
        ),
        (None, false, true) => {
            format!("preempted: stopped after step {step} with the other tasks; the chief saves the backup")
        }
        (None, _, _) => format!(
            "preempted: stopped after step {step}; without a backup_and_restore callback the next run starts over"
        ),
    }
}

/// The parts of a run the loop drives, as the builder made them.
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

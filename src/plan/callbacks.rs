//! `[[callbacks]]`, resolved: folders filled in, `mode = "auto"` decided, save frequencies
//! typed, and each callback named (Keras style: `early_stopping`, `early_stopping_1`, …) so
//! its state is saved and restored by name.

use crate::spec::{CallbackSpec, Diagnostic, Mode, SaveFreq};
use crate::vocab::{Direction, Monitor};
use serde::Serialize;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};

/// When a checkpoint callback saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveEvery {
    /// Every this many optimizer steps.
    Steps(NonZeroU64),
    /// At each epoch's end.
    Epoch,
}

impl SaveEvery {
    /// Whether a save is due after `step`, which ends an epoch when `epoch_end`.
    pub fn due(self, step: u64, epoch_end: bool) -> bool {
        match self {
            SaveEvery::Steps(n) => step.is_multiple_of(n.get()),
            SaveEvery::Epoch => epoch_end,
        }
    }
}

/// A watched metric and which way it improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Watch {
    /// The metric.
    pub monitor: Monitor,
    /// Which way is better.
    pub direction: Direction,
}

/// One callback, resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallbackKind {
    /// Keras `ModelCheckpoint`.
    ModelCheckpoint {
        dir: PathBuf,
        every: SaveEvery,
        /// `save_best_only`: only checkpoints that improve this.
        best_only: Option<Watch>,
        /// Newest checkpoints kept; older ones are deleted.
        max_to_keep: Option<NonZeroUsize>,
    },
    /// Keras `BackupAndRestore`.
    BackupAndRestore { dir: PathBuf, every: SaveEvery, delete_on_success: bool },
    /// Keras `EarlyStopping`.
    EarlyStopping { watch: Watch, min_delta: f64, patience: u32, restore_best_weights: bool },
    /// Keras `ReduceLROnPlateau`.
    ReduceLrOnPlateau { watch: Watch, factor: f64, patience: u32, min_delta: f64, cooldown: u32, min_lr: f64 },
    /// Keras `CSVLogger`: `path` inside the run folder.
    CsvLogger { path: PathBuf, append: bool },
    /// Stops as soon as an evaluation reaches `target`.
    StopAtTarget { monitor: Monitor, target: f64 },
}

impl CallbackKind {
    /// Keras's name of the callback kind.
    pub fn kind_name(&self) -> &'static str {
        match self {
            CallbackKind::ModelCheckpoint { .. } => "model_checkpoint",
            CallbackKind::BackupAndRestore { .. } => "backup_and_restore",
            CallbackKind::EarlyStopping { .. } => "early_stopping",
            CallbackKind::ReduceLrOnPlateau { .. } => "reduce_lr_on_plateau",
            CallbackKind::CsvLogger { .. } => "csv_logger",
            CallbackKind::StopAtTarget { .. } => "stop_at_target",
        }
    }
}

/// A callback with its unique name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallbackPlan {
    /// `early_stopping`, or `early_stopping_1` for the second of a kind.
    pub name: String,
    /// What it does.
    #[serde(flatten)]
    pub kind: CallbackKind,
}

/// The run's callbacks in spec order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CallbacksPlan {
    /// In the order of `[[callbacks]]`.
    pub items: Vec<CallbackPlan>,
}

impl CallbacksPlan {
    /// Each `model_checkpoint` callback's name and folder, in order.
    pub fn model_dirs(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.items.iter().filter_map(|c| match &c.kind {
            CallbackKind::ModelCheckpoint { dir, .. } => Some((c.name.as_str(), dir.as_path())),
            CallbackKind::BackupAndRestore { .. }
            | CallbackKind::EarlyStopping { .. }
            | CallbackKind::ReduceLrOnPlateau { .. }
            | CallbackKind::CsvLogger { .. }
            | CallbackKind::StopAtTarget { .. } => None,
        })
    }

    /// Whether the run backs up (`backup_and_restore`): a stopped run resumes from a backup.
    pub fn backs_up(&self) -> bool {
        self.backup_dir().is_some()
    }

    /// The folder of `backup_and_restore`, when the run backs up.
    pub fn backup_dir(&self) -> Option<&Path> {
        self.items.iter().find_map(|c| match &c.kind {
            CallbackKind::BackupAndRestore { dir, .. } => Some(dir.as_path()),
            CallbackKind::ModelCheckpoint { .. }
            | CallbackKind::EarlyStopping { .. }
            | CallbackKind::ReduceLrOnPlateau { .. }
            | CallbackKind::CsvLogger { .. }
            | CallbackKind::StopAtTarget { .. } => None,
        })
    }
}

/// `mode = "auto"` is `min` for losses and `max` for accuracies.
fn direction(monitor: Monitor, mode: Mode) -> Direction {
    match (mode, monitor) {
        (Mode::Min, _) | (Mode::Auto, Monitor::Loss | Monitor::ValLoss) => Direction::Min,
        (Mode::Max, _) | (Mode::Auto, Monitor::Accuracy | Monitor::ValAccuracy) => Direction::Max,
    }
}

fn every(f: SaveFreq) -> SaveEvery {
    match f {
        SaveFreq::Steps(n) => SaveEvery::Steps(n),
        SaveFreq::Epoch(_) => SaveEvery::Epoch,
    }
}

/// Resolves `callbacks` for a run writing to `out_dir` with (`has_eval`) or without a test split.
pub fn resolve(
    callbacks: &[CallbackSpec],
    out_dir: &Path,
    has_eval: bool,
    diags: &mut Vec<Diagnostic>,
) -> CallbacksPlan {
    let mut items: Vec<CallbackPlan> = Vec::with_capacity(callbacks.len());
    for (i, cb) in callbacks.iter().enumerate() {
        let kind = match cb {
            CallbackSpec::ModelCheckpoint { dir, save_freq, save_best_only, monitor, mode, max_to_keep } => {
                CallbackKind::ModelCheckpoint {
                    dir: dir.clone().unwrap_or_else(|| out_dir.join("checkpoints")),
                    every: every(*save_freq),
                    best_only: save_best_only
                        .then(|| Watch { monitor: *monitor, direction: direction(*monitor, *mode) }),
                    max_to_keep: max_to_keep.and_then(|n| NonZeroUsize::new(n as usize)),
                }
            }
            CallbackSpec::BackupAndRestore { backup_dir, save_freq, delete_checkpoint } => {
                CallbackKind::BackupAndRestore {
                    dir: backup_dir.clone().unwrap_or_else(|| out_dir.join("backup")),
                    every: every(*save_freq),
                    delete_on_success: *delete_checkpoint,
                }
            }
            CallbackSpec::EarlyStopping { monitor, min_delta, patience, mode, restore_best_weights } => {
                CallbackKind::EarlyStopping {
                    watch: Watch { monitor: *monitor, direction: direction(*monitor, *mode) },
                    min_delta: *min_delta,
                    patience: *patience,
                    restore_best_weights: *restore_best_weights,
                }
            }
            CallbackSpec::ReduceLrOnPlateau { monitor, factor, patience, mode, min_delta, cooldown, min_lr } => {
                CallbackKind::ReduceLrOnPlateau {
                    watch: Watch { monitor: *monitor, direction: direction(*monitor, *mode) },
                    factor: *factor,
                    patience: *patience,
                    min_delta: *min_delta,
                    cooldown: *cooldown,
                    min_lr: *min_lr,
                }
            }
            CallbackSpec::CsvLogger { filename, append } => {
                CallbackKind::CsvLogger { path: out_dir.join(filename), append: *append }
            }
            CallbackSpec::StopAtTarget { monitor, target } => {
                CallbackKind::StopAtTarget { monitor: *monitor, target: *target }
            }
        };
        if let Some(m) = watched(&kind).filter(|m| matches!(m, Monitor::ValLoss | Monitor::ValAccuracy))
            && !has_eval
        {
            diags.push(
                Diagnostic::error(
                    format!("callbacks[{i}].monitor"),
                    format!("callbacks[{i}] watches {} but the dataset has no test split", m.name()),
                )
                .help("watch \"loss\" or \"accuracy\", or add a test split"),
            );
        }
        let same = items.iter().filter(|c| c.kind.kind_name() == kind.kind_name()).count();
        let name = match same {
            0 => kind.kind_name().to_string(),
            n => format!("{}_{n}", kind.kind_name()),
        };
        items.push(CallbackPlan { name, kind });
    }
    let backups = items.iter().filter(|c| matches!(c.kind, CallbackKind::BackupAndRestore { .. })).count();
    if backups > 1 {
        diags.push(
            Diagnostic::error("callbacks", format!("{backups} backup_and_restore callbacks; a run has at most one"))
                .help("keep one"),
        );
    }
    // Two callbacks saving into one folder would delete each other's checkpoints
    // (`max_to_keep`) and resume from each other's saves.
    let folders: Vec<(usize, &str, &Path)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match &c.kind {
            CallbackKind::ModelCheckpoint { dir, .. } | CallbackKind::BackupAndRestore { dir, .. } => {
                Some((i, c.name.as_str(), dir.as_path()))
            }
            CallbackKind::EarlyStopping { .. }
            | CallbackKind::ReduceLrOnPlateau { .. }
            | CallbackKind::CsvLogger { .. }
            | CallbackKind::StopAtTarget { .. } => None,
        })
        .collect();
    for (n, (i, name, dir)) in folders.iter().enumerate() {
        // A second backup_and_restore is refused above already.
        let backup = |i: usize| matches!(items[i].kind, CallbackKind::BackupAndRestore { .. });
        if let Some((_, first, _)) = folders[..n].iter().find(|(j, _, d)| d == dir && !(backup(*i) && backup(*j))) {
            diags.push(
                Diagnostic::error(
                    format!("callbacks[{i}]"),
                    format!(
                        "{first} and {name} both save into {}: each would delete or resume the other's saves",
                        dir.display()
                    ),
                )
                .help(format!(
                    "give {name} a folder of its own (`dir = \"...\"`, or `backup_dir` for backup_and_restore)"
                )),
            );
        }
    }
    CallbacksPlan { items }
}

/// The metric a callback decides by, if any.
fn watched(kind: &CallbackKind) -> Option<Monitor> {
    match kind {
        CallbackKind::ModelCheckpoint { best_only, .. } => best_only.map(|w| w.monitor),
        CallbackKind::EarlyStopping { watch, .. } | CallbackKind::ReduceLrOnPlateau { watch, .. } => {
            Some(watch.monitor)
        }
        CallbackKind::StopAtTarget { monitor, .. } => Some(*monitor),
        CallbackKind::BackupAndRestore { .. } | CallbackKind::CsvLogger { .. } => None,
    }
}

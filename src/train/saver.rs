//! The checkpoint callbacks at run time. `model_checkpoint` and `backup_and_restore` decide
//! when to save with a cheap check every step ([`Saver::due`]); a save copies the buffers
//! into a snapshot and hands it to the background writer, so the step loop waits only for the
//! memcpy. Only the chief has a saver.

use super::callbacks::Logs;
use crate::checkpoint::manifest::{
    Best, FORMAT, LoopState, Metrics, OptimizerKind, OptimizerState, RngState, Topology,
};
use crate::checkpoint::policy::{self, Admit, Policy};
use crate::checkpoint::writer::Job;
use crate::checkpoint::{CheckpointError, Kind, Layout, Manifest, SaveStats, Store, Writer, copy_into};
use crate::data::Cursor;
use crate::engine::Optimizer;
use crate::plan::Plan;
use crate::spec::{CallbackSpec, Monitor, SaveFreq};
use crate::strategy::Variables;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Where each `model_checkpoint` writes, in order.
pub fn model_dirs(plan: &Plan) -> Vec<PathBuf> {
    plan.callbacks
        .iter()
        .filter_map(|c| match c {
            CallbackSpec::ModelCheckpoint { dir, .. } => {
                Some(dir.clone().unwrap_or_else(|| plan.out_dir.join("checkpoints")))
            }
            _ => None,
        })
        .collect()
}

/// Where the first `model_checkpoint` writes (what the evaluator watches), when there is one.
pub fn model_dir(plan: &Plan) -> Option<PathBuf> {
    model_dirs(plan).into_iter().next()
}

/// Where `backup_and_restore` writes, when the plan has one.
pub fn backup_dir(plan: &Plan) -> Option<PathBuf> {
    plan.callbacks.iter().find_map(|c| match c {
        CallbackSpec::BackupAndRestore { backup_dir, .. } => {
            Some(backup_dir.clone().unwrap_or_else(|| plan.out_dir.join("backup")))
        }
        _ => None,
    })
}

/// The job's shape, as manifests record it.
pub fn topology(plan: &Plan) -> Topology {
    Topology {
        num_workers: plan.strategy.num_workers,
        num_replicas_in_sync: plan.strategy.num_replicas_in_sync,
        per_replica_batch: plan.batch.per_replica,
        global_batch: plan.batch.global,
        accumulation_steps: plan.batch.accumulation_steps,
    }
}

/// The optimizer's kind as manifests name it.
pub fn optimizer_kind(o: &Optimizer) -> OptimizerKind {
    match o {
        Optimizer::Sgd(_) => OptimizerKind::Sgd,
        Optimizer::Adam(_) => OptimizerKind::Adam,
    }
}

struct Target {
    store: Store,
    freq: SaveFreq,
    policy: Policy,
    monitor: Monitor,
    /// The best monitored value so far (`save_best_only`).
    best: Option<f64>,
}

impl Target {
    fn new(store: Store, freq: SaveFreq, policy: Policy, monitor: Monitor) -> Self {
        Self { store, freq, policy, monitor, best: None }
    }

    fn due(&self, step: u64, epoch_end: bool) -> bool {
        match self.freq {
            SaveFreq::Steps(n) => step.is_multiple_of(n.get()),
            SaveFreq::Epoch(_) => epoch_end,
        }
    }
}

/// Where the loop stands at a save.
pub struct SavePoint<'a> {
    /// Optimizer steps done.
    pub step: u64,
    /// Epochs finished.
    pub epochs_done: u64,
    /// Whether `step` ends an epoch.
    pub epoch_end: bool,
    /// The next batch's position.
    pub cursor: Cursor,
    /// The loop's state.
    pub loop_state: LoopState,
    /// Metrics now.
    pub logs: &'a Logs,
    /// The variables.
    pub vars: &'a Variables,
    /// The optimizer.
    pub optimizer: &'a Optimizer,
    /// Early stopping's best weights, if kept.
    pub best: Option<&'a Variables>,
}

/// The chief's checkpoint callbacks.
pub struct Saver {
    writer: Writer,
    layout: Arc<Layout>,
    models: Vec<Target>,
    backup: Option<(Target, bool)>,
    spec_hash: String,
    topology: Topology,
    seed: u64,
    warned_no_value: bool,
    last_backup: Option<u64>,
}

impl Saver {
    /// The saver for `plan`'s checkpoint callbacks; `None` when it has none.
    pub fn new(
        plan: &Plan,
        layout: Layout,
        spec_hash: String,
        optimizer: &Optimizer,
    ) -> Result<Option<Self>, CheckpointError> {
        let mut models = Vec::new();
        let mut dirs = model_dirs(plan).into_iter();
        let mut backup = None;
        for c in &plan.callbacks {
            match c {
                CallbackSpec::ModelCheckpoint { save_freq, save_best_only, monitor, mode, max_to_keep, .. } => {
                    let policy = Policy {
                        max_to_keep: max_to_keep.and_then(|n| NonZeroUsize::new(n as usize)),
                        best_only: save_best_only.then_some(*mode),
                    };
                    let dir = dirs.next().unwrap_or_default();
                    models.push(Target::new(Store::new(dir), *save_freq, policy, *monitor));
                }
                CallbackSpec::BackupAndRestore { save_freq, delete_checkpoint, .. } => {
                    let dir = backup_dir(plan).unwrap_or_default();
                    let target = Target::new(Store::new(dir), *save_freq, Policy::BACKUP, Monitor::Loss);
                    backup = Some((target, *delete_checkpoint));
                }
                CallbackSpec::EarlyStopping { .. }
                | CallbackSpec::ReduceLrOnPlateau { .. }
                | CallbackSpec::CsvLogger { .. }
                | CallbackSpec::StopAtTarget { .. } => {}
            }
        }
        if models.is_empty() && backup.is_none() {
            return Ok(None);
        }
        let mut writer = Writer::start()?;
        let buffers: Vec<&str> = optimizer.state().iter().map(|(n, _)| *n).collect();
        writer.prepare(layout.params, layout.state, &buffers);
        Ok(Some(Self {
            writer,
            layout: Arc::new(layout),
            models,
            backup,
            spec_hash,
            topology: topology(plan),
            seed: plan.seed,
            warned_no_value: false,
            last_backup: None,
        }))
    }

    /// Puts back each `model_checkpoint`'s best value from a backup.
    pub fn restore_best(&mut self, best: &[Best]) {
        for (t, b) in self.models.iter_mut().zip(best) {
            t.best = b.0;
        }
    }

    /// Whether a save is due after `step`. Cheap: called every step.
    pub fn due(&self, step: u64, epoch_end: bool) -> bool {
        self.models.iter().any(|t| t.due(step, epoch_end))
            || self.backup.as_ref().is_some_and(|(t, _)| t.due(step, epoch_end))
    }

    /// Whether the run backs up (so a preemption can be resumed).
    pub fn backs_up(&self) -> bool {
        self.backup.is_some()
    }

    /// Saves what is due at `p` (and a backup regardless when `force_backup`); returns notes
    /// for the display.
    pub fn save(&mut self, mut p: SavePoint<'_>, force_backup: bool) -> Result<Vec<String>, CheckpointError> {
        let started = Instant::now();
        let mut notes = Vec::new();
        let mut model_jobs = Vec::new();
        for t in self.models.iter_mut().filter(|t| t.due(p.step, p.epoch_end)) {
            let value = t.policy.best_only.and(p.logs.get(t.monitor));
            let (admit, best) = policy::admit(&t.policy, value, t.best);
            t.best = best;
            match admit {
                Admit::Write => model_jobs.push((t.store.clone(), t.policy, false)),
                Admit::NotImproved { .. } => {}
                Admit::NoValue if !self.warned_no_value => {
                    self.warned_no_value = true;
                    notes.push(format!(
                        "model_checkpoint: {} is not known at step {}, so save_best_only skips this save (evaluate at the saves: train.evaluate_every_steps or save_freq = \"epoch\")",
                        crate::plan::monitor_name(t.monitor),
                        p.step
                    ));
                }
                Admit::NoValue => {}
            }
        }
        let mut backup_job = None;
        if let Some((t, _)) = self.backup.as_ref().filter(|(t, _)| force_backup || t.due(p.step, p.epoch_end)) {
            // The backup still waiting to be written is obsolete now: reuse its buffers.
            self.writer.reclaim(&t.store);
            backup_job = Some((t.store.clone(), t.policy, true));
            self.last_backup = Some(p.step);
        }
        if model_jobs.is_empty() && backup_job.is_none() {
            return Ok(notes);
        }
        p.loop_state.callbacks.checkpoint_best = self.models.iter().map(|t| Best(t.best)).collect();
        let mut snap = self.writer.take_snapshot();
        copy_into(&mut snap.params, &p.vars.params);
        copy_into(&mut snap.state, &p.vars.state);
        let buffers = p.optimizer.state();
        snap.optimizer.resize_with(buffers.len(), Default::default);
        for ((name, dst), (src_name, src)) in snap.optimizer.iter_mut().zip(&buffers) {
            if name != src_name {
                *name = src_name.to_string();
            }
            copy_into(dst, src);
        }
        match (p.best, &mut snap.best) {
            (Some(b), Some((params, state))) => {
                copy_into(params, &b.params);
                copy_into(state, &b.state);
            }
            (Some(b), slot) => *slot = Some((b.params.clone(), b.state.clone())),
            (None, slot) => *slot = None,
        }
        let snapshot = Arc::new(snap);
        let manifest = |kind| Manifest {
            format: FORMAT,
            trainrun_version: env!("CARGO_PKG_VERSION").to_string(),
            kind,
            step: p.step,
            epoch: p.epochs_done,
            cursor: p.cursor,
            rng: RngState { seed: self.seed, step: p.step },
            spec_hash: self.spec_hash.clone(),
            topology: self.topology,
            optimizer: OptimizerState {
                kind: optimizer_kind(p.optimizer),
                iterations: p.optimizer.iterations(),
                buffers: buffers.iter().map(|(n, _)| n.to_string()).collect(),
            },
            loop_state: LoopState { best_weights: p.best.is_some(), ..p.loop_state.clone() },
            metrics: Metrics {
                loss: Some(p.logs.loss),
                accuracy: Some(p.logs.accuracy),
                val_loss: p.logs.val_loss,
                val_accuracy: p.logs.val_accuracy,
            },
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            files: Vec::new(),
        };
        let mut jobs = Vec::new();
        let all = model_jobs.into_iter().map(|j| (j, Kind::Model)).chain(backup_job.map(|j| (j, Kind::Backup)));
        for ((store, policy, supersedable), kind) in all {
            jobs.push(Job {
                store,
                layout: self.layout.clone(),
                snapshot: snapshot.clone(),
                manifest: manifest(kind),
                policy,
                supersedable,
            });
        }
        drop(snapshot);
        self.writer.submit(jobs, started)?;
        Ok(notes)
    }

    /// Waits for every save to be on disk; returns the backup folder of the last backup.
    pub fn flush(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        self.writer.flush()?;
        Ok(self
            .backup
            .as_ref()
            .zip(self.last_backup)
            .map(|((t, _), step)| t.store.root().join(crate::checkpoint::store::name(step))))
    }

    /// The step of the last backup queued.
    pub fn last_backup(&self) -> Option<u64> {
        self.last_backup
    }

    /// Finishes writing; after a completed run, removes the backup unless told to keep it.
    pub fn finish(self, completed: bool) -> Result<SaveStats, CheckpointError> {
        let Saver { writer, backup, .. } = self;
        let stats = writer.finish()?;
        if let Some((t, true)) = backup.filter(|_| completed) {
            t.store.delete_all()?;
        }
        Ok(stats)
    }
}

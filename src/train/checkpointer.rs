//! Writing what the checkpoint callbacks ask for: one snapshot of the buffers per step (shared
//! when a model checkpoint and a backup are due together) handed to the background writer, so
//! the step loop waits only for the memcpy. Only the chief has one.

use super::callbacks::Moment;
use crate::checkpoint::manifest::{
    FORMAT, LoopState, Metrics, OptimizerState, RngState, SavedOptimizer, SavedTopology,
};
use crate::checkpoint::policy::Policy;
use crate::checkpoint::writer::SaveJob;
use crate::checkpoint::{CheckpointError, HeldBackup, Kind, Layout, Manifest, SaveStats, Store, Writer, copy_into};
use crate::data::Cursor;
use crate::engine::Optimizer;
use crate::plan::Plan;
use crate::strategy::Variables;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// A checkpoint one callback wants written.
#[derive(Debug, Clone)]
pub struct SaveRequest {
    /// A model checkpoint or a backup.
    pub kind: Kind,
    /// Where.
    pub store: Store,
    /// Retention after the write.
    pub policy: Policy,
}

/// The rest of the training state at a save.
pub struct SavePoint<'a> {
    /// Epochs finished.
    pub epochs_done: u64,
    /// The next batch's position.
    pub cursor: Cursor,
    /// The loop's state, with every callback's memory.
    pub loop_state: LoopState,
    /// The variables.
    pub vars: &'a Variables,
    /// The optimizer.
    pub optimizer: &'a Optimizer,
}

/// The job's shape, as manifests record it.
pub fn topology(plan: &Plan) -> SavedTopology {
    SavedTopology {
        num_workers: plan.strategy.num_workers,
        num_replicas_in_sync: plan.strategy.num_replicas_in_sync,
        per_replica_batch: plan.batch.per_replica,
        global_batch: plan.batch.global,
        accumulation_steps: plan.batch.accumulation_steps,
    }
}

/// The optimizer's kind as manifests name it.
pub fn optimizer_kind(o: &Optimizer) -> SavedOptimizer {
    match o {
        Optimizer::Sgd(_) => SavedOptimizer::Sgd,
        Optimizer::Adam(_) => SavedOptimizer::Adam,
    }
}

/// The background writer and what every manifest shares.
pub struct Checkpointer {
    writer: Writer,
    layout: Arc<Layout>,
    spec_hash: String,
    spec_keys: std::collections::BTreeMap<String, String>,
    topology: SavedTopology,
    seed: u64,
    /// The backup store and step of the last backup queued.
    last_backup: Option<(Store, u64)>,
    /// The backup written at the run's last step (its end or its pause), as it went to disk.
    last_held: Option<HeldBackup>,
    /// The run's last step (`train.total_steps`).
    total_steps: u64,
    backs_up: bool,
}

impl Checkpointer {
    /// Starts the writer for `plan`'s checkpoints of a model laid out as `layout`, with an
    /// optimizer keeping `buffers`.
    pub fn new(plan: &Plan, layout: Layout, spec_hash: String, buffers: &[&str]) -> Result<Self, CheckpointError> {
        let mut writer = Writer::start()?;
        writer.prepare(layout.params, layout.state, buffers);
        Ok(Self {
            writer,
            layout: Arc::new(layout),
            spec_hash,
            spec_keys: plan.hashes.training_keys.clone(),
            topology: topology(plan),
            seed: plan.seed,
            last_backup: None,
            last_held: None,
            total_steps: plan.train.total_steps,
            backs_up: plan.callbacks.backs_up(),
        })
    }

    /// Whether the run backs up (so a preemption can be resumed).
    pub fn backs_up(&self) -> bool {
        self.backs_up
    }

    /// Copies the state into one snapshot and queues a write for each request.
    pub fn save(
        &mut self,
        requests: Vec<SaveRequest>,
        at: &Moment<'_>,
        p: SavePoint<'_>,
        best: Option<&Variables>,
    ) -> Result<(), CheckpointError> {
        let started = Instant::now();
        for r in requests.iter().filter(|r| r.kind == Kind::Backup) {
            // The backup still waiting to be written is obsolete now: reuse its buffers.
            self.writer.reclaim(&r.store);
            self.last_backup = Some((r.store.clone(), at.step));
        }
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
        match (best, &mut snap.best) {
            (Some(b), Some((params, state))) => {
                copy_into(params, &b.params);
                copy_into(state, &b.state);
            }
            (Some(b), slot) => *slot = Some((b.params.clone(), b.state.clone())),
            (None, slot) => *slot = None,
        }
        let snapshot = Arc::new(snap);
        if let Some(r) = requests.iter().find(|r| r.kind == Kind::Backup) {
            // Kept only at the run's last step: holding a snapshot while training goes on would
            // keep the writer from reusing its buffers.
            let last = at.pausing || at.step == self.total_steps;
            self.last_held = last.then(|| HeldBackup::new(&r.store, at.step, snapshot.clone()));
        }
        let logs = at.logs;
        let manifest = |kind| Manifest {
            format: FORMAT,
            trainrun_version: env!("CARGO_PKG_VERSION").to_string(),
            kind,
            step: at.step,
            epoch: p.epochs_done,
            cursor: p.cursor,
            rng: RngState { seed: self.seed, step: at.step },
            spec_hash: self.spec_hash.clone(),
            spec_keys: self.spec_keys.clone(),
            topology: self.topology,
            optimizer: OptimizerState {
                kind: optimizer_kind(p.optimizer),
                iterations: p.optimizer.iterations(),
                buffers: buffers.iter().map(|(n, _)| n.to_string()).collect(),
            },
            loop_state: LoopState { best_weights: best.is_some(), ..p.loop_state.clone() },
            metrics: Metrics {
                loss: Some(logs.loss),
                accuracy: logs.accuracy,
                val_loss: logs.val_loss,
                val_accuracy: logs.val_accuracy,
            },
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            files: Vec::new(),
        };
        // Model checkpoints first, as before: a backup waiting behind them may be superseded.
        let mut ordered = requests;
        ordered.sort_by_key(|r| r.kind == Kind::Backup);
        let jobs = ordered
            .into_iter()
            .map(|r| SaveJob {
                supersedable: r.kind == Kind::Backup,
                manifest: manifest(r.kind),
                store: r.store,
                layout: self.layout.clone(),
                snapshot: snapshot.clone(),
                policy: r.policy,
            })
            .collect();
        drop(snapshot);
        self.writer.submit(jobs, started)
    }

    /// Waits for every save to be on disk; returns the folder of the last backup.
    pub fn flush(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        self.writer.flush()?;
        Ok(self.last_backup.as_ref().map(|(store, step)| store.root().join(crate::checkpoint::store::name(*step))))
    }

    /// Finishes writing; with the backup of the run's last step, once it is on disk.
    pub fn finish(mut self) -> Result<(SaveStats, Option<HeldBackup>), CheckpointError> {
        let last = self.last_held.take();
        Ok((self.writer.finish()?, last))
    }
}

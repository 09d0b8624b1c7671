//! The one builder: the running job from the plan and what exists only at run time (the
//! loaded data, the joined cluster). It makes one model per local device, the strategy over
//! them (one exhaustive match in `strategy::build`), the optimizer, the callbacks and, when a
//! backup exists, the restored state. Nothing here reads the spec.

use crate::checkpoint::{CheckpointError, HeldBackup, Layout, LoadedCheckpoint, Store, warm_start};
use crate::cluster::job::Job;
use crate::collective::Communicator;
use crate::data::{DataError, Dataset, Shard};
use crate::engine::optimizer::{Adam, Optimizer, Sgd};
use crate::engine::{Sequential, TensorInfo};
use crate::model::BuildError;
use crate::plan::{DecayPlan, OptimizerPlan, Plan, ShardPolicy};
use crate::strategy::{self, StrategyError, Variables};
use crate::train::callbacks::{self, Callbacks};
use crate::train::resume::{self, ResumePoint};
use crate::train::{Session, TrainError};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// What the builder needs besides the plan.
pub struct Resources {
    /// The loaded dataset.
    pub dataset: Arc<Dataset>,
    /// The job this process joined, when it is a task of a multi-process one.
    pub job: Option<Job>,
}

/// The running job, ready for `train::fit`.
pub struct Built {
    /// Variables, optimizer, strategy and data.
    pub session: Session,
    /// The callbacks (with the chief's checkpoint writer).
    pub callbacks: Callbacks,
    /// Where training continues, when a backup was restored.
    pub resume: Option<ResumePoint>,
    /// Whether this task is the chief (writes the run folder and checkpoints).
    pub chief: bool,
}

/// Building failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildFailure {
    /// The planned model did not build.
    #[error(transparent)]
    Model(#[from] BuildError),
    /// The strategy could not be set up.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// The data cannot be split as planned.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The checkpoint writer did not start.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The backup could not be restored.
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// One engine model per local device of the plan.
pub fn models(plan: &Plan) -> Result<Vec<Sequential>, BuildError> {
    (0..plan.strategy.devices.len().max(1)).map(|_| plan.model.build()).collect()
}

/// A fresh optimizer for `len` parameters laid out as `tensors`.
pub fn optimizer(plan: &OptimizerPlan, tensors: &[TensorInfo], len: usize) -> Optimizer {
    match *plan {
        OptimizerPlan::Sgd { momentum, nesterov, weight_decay, clip_norm } => {
            Optimizer::Sgd(Sgd::new(len, momentum as f32, nesterov, weight_decay as f32))
                .with_clip_norm(clip_norm.map(|c| c as f32))
        }
        OptimizerPlan::Adam { beta_1, beta_2, epsilon, weight_decay, decoupled, clip_norm, ref decay } => {
            let adam = Adam::new(len, beta_1 as f32, beta_2 as f32, epsilon as f32, weight_decay as f32, decoupled);
            let adam = match decay {
                DecayPlan::All => adam,
                DecayPlan::Matrices | DecayPlan::Excluding(_) => adam.with_decay_ranges(
                    tensors
                        .iter()
                        .filter(|t| decay.decays(&t.name, &t.shape))
                        .map(|t| t.offset..t.offset + t.shape.iter().product::<usize>())
                        .collect(),
                ),
            };
            Optimizer::Adam(adam).with_clip_norm(clip_norm.map(|c| c as f32))
        }
    }
}

/// Where the model's tensors lie, as checkpoints name them.
pub fn layout(model: &Sequential) -> Layout {
    Layout {
        tensors: model.tensors().to_vec(),
        state_tensors: model.state_tensors().to_vec(),
        params: model.param_len(),
        state: model.state_len(),
    }
}

/// This task's share of every batch under `plan`'s shard policy, as worker `rank` of `workers`.
fn shard(plan: &Plan, job: Option<&Job>) -> Result<Shard, DataError> {
    let comm: Option<&dyn Communicator> = job.and_then(|j| j.comm.as_deref());
    let (rank, workers) = comm.map_or((0, 1), |c| (c.rank(), c.world()));
    let count = NonZeroUsize::new(workers).unwrap_or(NonZeroUsize::MIN);
    match plan.data.shard {
        ShardPolicy::Data => Shard::new(rank, count),
        // Training reads this worker's files; evaluation still splits the test set by example.
        ShardPolicy::File => Shard::of_files(rank, count),
        // Every worker reads the same examples: the duplicates `off` asks for.
        ShardPolicy::Off => Shard::new(0, count),
        ShardPolicy::None => Ok(Shard::WHOLE),
    }
}

/// The line a warm start shows: what it loaded from where, and what it left.
pub fn warm_start_note(w: &warm_start::WarmStart) -> String {
    let mut text = format!(
        "warm start from {}: {} tensor{} ({} values) loaded, optimizer state fresh",
        w.file.display(),
        w.loaded.len(),
        if w.loaded.len() == 1 { "" } else { "s" },
        w.values()
    );
    for line in w.mismatches() {
        text.push_str(&format!("\n  left: {line}"));
    }
    text
}

/// Builds the running job `plan` describes from `resources`; `note` shows what happened (a
/// resumed backup), `warn` what went wrong on the way (a damaged backup, skipped).
pub fn build(
    plan: &Plan,
    resources: Resources,
    mut note: impl FnMut(&str),
    warn: impl FnMut(&str),
) -> Result<Built, BuildFailure> {
    let Resources { dataset, job } = resources;
    let chief = job.as_ref().is_none_or(|j| j.is_chief);
    let shard = shard(plan, job.as_ref())?;
    let models = models(plan)?;
    let first = models.first().ok_or(StrategyError::Unsupported("no model to place on a device".into()))?;
    let (mut params, mut state) = first.init(plan.seed);
    let layout = layout(first);
    if let Some(init) = &plan.model.init_from {
        // Every task loads the same file, so every replica starts from the same weights
        // without a broadcast; a resumed backup overwrites them below.
        let tensors = (layout.tensors.as_slice(), params.as_mut_slice());
        let report = warm_start::load(init, &plan.model, tensors, (&layout.state_tensors, &mut state))?;
        if chief {
            note(&warm_start_note(&report));
        }
    }
    let activation_len = first.activation_len();
    let strategy = strategy::build(plan, models, job)?;
    let (optimizer, callbacks) = fresh_optimizer_and_callbacks(plan, chief, &layout)?;
    let Layout { tensors, state_tensors, .. } = layout.clone();
    let mut session = Session {
        vars: Variables { params, state },
        optimizer,
        strategy,
        dataset,
        shard,
        tensors,
        state_tensors,
        activation_len,
    };
    let loaded = if chief { latest_backup(plan, &layout, warn)? } else { None };
    let resume = resume::restore(plan, &mut session, chief, loaded, note)?;
    Ok(Built { session, callbacks, resume, chief })
}

/// The optimizer, made afresh, and the callbacks of a job whose variables are laid out as
/// `layout`.
fn fresh_optimizer_and_callbacks(
    plan: &Plan,
    chief: bool,
    layout: &Layout,
) -> Result<(Optimizer, Callbacks), BuildFailure> {
    let optimizer = optimizer(&plan.optimizer, &layout.tensors, layout.params);
    let buffers: Vec<&str> = optimizer.state().iter().map(|(n, _)| *n).collect();
    let callbacks = callbacks::build(plan, chief, layout.clone(), plan.hashes.training.clone(), &buffers)?;
    Ok((optimizer, callbacks))
}

/// The newest good backup of the spec's `backup_and_restore`, if it has one; damaged ones are
/// skipped, each said through `warn`.
fn latest_backup(
    plan: &Plan,
    layout: &Layout,
    mut warn: impl FnMut(&str),
) -> Result<Option<LoadedCheckpoint>, BuildFailure> {
    match plan.callbacks.backup_dir() {
        Some(dir) => Ok(Store::new(dir).latest_good(layout, |w| warn(&format!("warning: {w}")))?),
        None => Ok(None),
    }
}

/// The running job `plan` describes, again, in a process that trained it before and kept its
/// `session` (a sweep's resident trial, [`crate::sweep::resident`]): the models and strategy
/// stay, with their buffers already in memory; the optimizer and callbacks are made afresh and
/// the variables and optimizer state come from the newest good backup, as in [`build`], so
/// training goes on exactly as in a process started anew. When that backup is `held`, the one
/// this process wrote last, its tensors come from memory instead of being read back
/// ([`crate::checkpoint::held`]). `Err(session)` when there is no good backup: then [`build`]
/// starts over.
pub fn rebuild(
    plan: &Plan,
    session: Session,
    held: Option<HeldBackup>,
    mut note: impl FnMut(&str),
    warn: impl FnMut(&str),
) -> Result<Result<Built, Session>, BuildFailure> {
    let layout = Layout {
        tensors: session.tensors.clone(),
        state_tensors: session.state_tensors.clone(),
        params: session.vars.params.len(),
        state: session.vars.state.len(),
    };
    let store = plan.callbacks.backup_dir().map(Store::new);
    let from_memory = held.zip(store.as_ref()).and_then(|(held, store)| held.load_if_newest(store, &layout));
    let loaded = match from_memory {
        Some(loaded) => {
            note(&format!(
                "the backup {} is the one this process wrote last: its tensors are taken from memory",
                loaded.path.display()
            ));
            Some(loaded)
        }
        None => latest_backup(plan, &layout, warn)?,
    };
    let Some(loaded) = loaded else { return Ok(Err(session)) };
    let (optimizer, callbacks) = fresh_optimizer_and_callbacks(plan, true, &layout)?;
    let mut session = Session { optimizer, ..session };
    let resume = resume::restore(plan, &mut session, true, Some(loaded), note)?;
    Ok(Ok(Built { session, callbacks, resume, chief: true }))
}

//! Distribution strategies behind one small trait: how a step's gradient is computed over the
//! replicas and reduced. Adding a strategy is an enum variant, a file, and a match arm.

mod central_storage;
mod cross_device;
mod default;
#[cfg(feature = "cuda")]
mod gpu;
mod local;
mod mirrored;
mod multi_worker_mirrored;
mod one_device;
pub mod parameter_server;
mod replica;

pub use multi_worker_mirrored::{MultiWorkerMirrored, check_devices as check_multi_worker_devices};
pub use replica::{BatchView, MicroStep, Replica};

use crate::cluster::job::Job;
use crate::data::Batch;
use crate::engine::{BatchStats, Optimizer, Sequential};
use crate::plan::{CrossDevice, Plan, Reduction, StrategyKind};
use crate::vocab::{Device, DeviceKind};

/// The model's variables: trainable parameters and non-trainable state, each one flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Variables {
    /// Trainable values, in the model's arena order.
    pub params: Vec<f32>,
    /// Non-trainable values (batch-norm moving statistics).
    pub state: Vec<f32>,
}

/// A strategy could not run.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The spec asks for hardware or a build feature that is missing.
    #[error("{0}")]
    Unsupported(String),
    /// A device failed while training (a kernel launch, a copy, an out-of-memory).
    #[error("{0}")]
    Device(String),
    /// The control plane failed: a task died, went silent, or was refused.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The data plane failed: a peer is gone or did not answer in time.
    #[error(transparent)]
    Collective(#[from] crate::collective::CollectiveError),
    /// The job was already left.
    #[error("the job was already left")]
    Finished,
    /// A task of a parameter-server job failed, left or went silent (the text names it).
    #[error("{0}")]
    Remote(String),
}

/// What one step's gradient computation found, the same at every task.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Step {
    /// Loss and accuracy sums over the whole global batch.
    pub stats: BatchStats,
    /// Some task was asked to stop (SIGTERM) before this step: every task sees it at the same
    /// step, so they stop together.
    pub stop: bool,
}

/// How one task computes and reduces each step's gradient.
pub trait Strategy: Send {
    /// The strategy's kind.
    fn kind(&self) -> StrategyKind;

    /// Forward and backward over this task's `micro` batches of one optimizer step, leaving in
    /// the strategy's gradient buffer the gradient of the mean loss over the whole global
    /// batch (all replicas), and returning loss and accuracy sums over the whole global batch.
    /// `stop` is this task's vote to stop; the result says whether any task voted. A strategy
    /// may leave part of that work for [`Strategy::apply`] to fuse into the update (one replica
    /// in one process defers backward; local replicas defer their sum).
    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError>;

    /// Applies the optimizer with the gradients of the last [`Strategy::compute_gradients`].
    /// Synchronous strategies update every replica's copy identically.
    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError>;

    /// How gradients travel between worker processes, if they do.
    fn transport(&self) -> Option<&'static str> {
        None
    }

    /// Copies the chief's `data` to every task (restored state at start); a no-op in one
    /// process.
    fn broadcast(&mut self, _data: &mut [f32]) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Leaves the job cleanly at the end of training (the chief waits for the workers).
    fn finish(&mut self) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Loss and accuracy sums over `batches` (this task's share), across all replicas.
    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<BatchStats, StrategyError>;
}

/// The strategy `plan` asks for, over `models` (one per local device of the plan) and, for a
/// task of a multi-process job, the `job` it joined. One exhaustive match: adding a strategy
/// is a variant, a file and an arm here.
pub fn build(plan: &Plan, models: Vec<Sequential>, job: Option<Job>) -> Result<Box<dyn Strategy>, StrategyError> {
    let devices = &plan.strategy.devices;
    let on_gpus = devices.iter().any(|d| d.kind == DeviceKind::Gpu);
    match plan.strategy.kind {
        StrategyKind::Default => Ok(Box::new(default::new(one(replicas(plan, models))?))),
        StrategyKind::OneDevice | StrategyKind::Mirrored if on_gpus => gpus(plan, models),
        StrategyKind::OneDevice => Ok(Box::new(one_device::new(one(replicas(plan, models))?))),
        StrategyKind::Mirrored => {
            let algorithm = match plan.strategy.reduction {
                Reduction::CrossDevice { algorithm, .. } => algorithm,
                Reduction::None | Reduction::Collective(_) | Reduction::ParameterServer => {
                    CrossDevice::ReductionToOneDevice
                }
            };
            Ok(Box::new(mirrored::new(replicas(plan, models), algorithm)))
        }
        StrategyKind::CentralStorage => {
            cpus_only(devices)?;
            Ok(Box::new(central_storage::new(replicas(plan, models))))
        }
        StrategyKind::MultiWorkerMirrored => {
            check_multi_worker_devices(devices)?;
            let bytes_per_pack = match plan.strategy.reduction {
                Reduction::Collective(c) => c.bytes_per_pack.get(),
                Reduction::None | Reduction::CrossDevice { .. } | Reduction::ParameterServer => usize::MAX,
            };
            let job = job.ok_or_else(|| {
                StrategyError::Unsupported(
                    "multi_worker_mirrored runs in a task of a job: name the task with --task".into(),
                )
            })?;
            Ok(Box::new(MultiWorkerMirrored::new(replicas(plan, models), job, bytes_per_pack)?))
        }
        StrategyKind::ParameterServer => {
            cpus_only(devices)?;
            // The chief only evaluates, while the workers wait: with every thread it has.
            let threads = plan.parameter_server.as_ref().map_or(plan.threads, |p| p.eval_threads);
            let model = models
                .into_iter()
                .next()
                .ok_or_else(|| StrategyError::Unsupported("no model to place on a device".into()))?;
            let replica = Replica::new(model, plan.train.loss_fn(), plan.model.classes, threads);
            Ok(Box::new(parameter_server::chief::new(replica, job)))
        }
    }
}

/// Refuses, before anything starts, a plan this build cannot run: GPU devices where only
/// CPUs run.
pub fn runnable(plan: &Plan) -> Result<(), StrategyError> {
    let devices = &plan.strategy.devices;
    match plan.strategy.kind {
        StrategyKind::Default | StrategyKind::OneDevice | StrategyKind::Mirrored => Ok(()),
        StrategyKind::CentralStorage | StrategyKind::ParameterServer => cpus_only(devices),
        StrategyKind::MultiWorkerMirrored => check_multi_worker_devices(devices),
    }
}

/// One replica per model, the process's threads shared out among them.
fn replicas(plan: &Plan, models: Vec<Sequential>) -> Vec<Replica> {
    let threads = (plan.threads / models.len().max(1)).max(1);
    let classes = plan.model.classes;
    models.into_iter().map(|m| Replica::new(m, plan.train.loss_fn(), classes, threads)).collect()
}

fn one(mut replicas: Vec<Replica>) -> Result<Replica, StrategyError> {
    if replicas.is_empty() {
        Err(StrategyError::Unsupported("no model to place on a device".into()))
    } else {
        Ok(replicas.remove(0))
    }
}

/// Replicas on GPUs: the CUDA engine.
#[cfg(feature = "cuda")]
fn gpus(plan: &Plan, models: Vec<Sequential>) -> Result<Box<dyn Strategy>, StrategyError> {
    Ok(Box::new(gpu::new(plan, models)?))
}

/// Replicas on GPUs need the CUDA build.
#[cfg(not(feature = "cuda"))]
fn gpus(plan: &Plan, _models: Vec<Sequential>) -> Result<Box<dyn Strategy>, StrategyError> {
    cpus_only(&plan.strategy.devices)?;
    Err(StrategyError::Unsupported("GPU devices need a GPU build of trainrun".into()))
}

/// Strategies whose replicas run on CPUs only refuse GPU devices, saying what would run them.
fn cpus_only(devices: &[Device]) -> Result<(), StrategyError> {
    #[cfg(not(feature = "cuda"))]
    let why = "which needs a GPU build of trainrun (cargo build --release --features cuda); this one runs on CPUs only";
    #[cfg(feature = "cuda")]
    let why = "but this strategy runs on CPUs only; use strategy.kind = \"mirrored\" or \"one_device\" for GPUs";
    match devices.iter().find(|d| d.kind == DeviceKind::Gpu) {
        Some(d) => Err(StrategyError::Unsupported(format!("strategy.devices includes \"{d}\", {why}"))),
        None => Ok(()),
    }
}

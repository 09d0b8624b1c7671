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
mod replica;

pub use multi_worker_mirrored::{MultiWorkerMirrored, check_devices as check_multi_worker_devices};
pub use replica::{BatchView, Replica};

use crate::data::Batch;
use crate::engine::{BatchStats, Optimizer, Sequential};
use crate::plan::{Plan, StrategyKind};

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
    /// The spec is valid but this build cannot run it yet.
    #[error(
        "strategy.kind = \"{0}\" is not built yet in this version of trainrun; use \"multi_worker_mirrored\" for several workers, or \"mirrored\" for several replicas in one process"
    )]
    NotBuilt(&'static str),
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

/// The strategy `plan` asks for, over `models`: one per local device of the plan.
pub fn build(plan: &Plan, models: Vec<Sequential>) -> Result<Box<dyn Strategy>, StrategyError> {
    // The process's threads are shared out among its replicas.
    let threads = (plan.threads / models.len().max(1)).max(1);
    let classes = plan.data.facts.classes as usize;
    let mut replicas: Vec<Replica> =
        models.into_iter().map(|m| Replica::new(m, plan.train.loss_fn(), classes, threads)).collect();
    let mut one = || {
        if replicas.is_empty() {
            Err(StrategyError::Unsupported("no model to place on a device".into()))
        } else {
            Ok(replicas.remove(0))
        }
    };
    match plan.strategy.kind {
        StrategyKind::Default => Ok(Box::new(default::new(one()?))),
        StrategyKind::OneDevice => {
            let device = plan.strategy.devices.first().copied().unwrap_or_default();
            #[cfg(feature = "cuda")]
            if device.kind == crate::spec::DeviceKind::Gpu {
                return Ok(Box::new(gpu::new(plan)?));
            }
            Ok(Box::new(one_device::new(device, one()?)?))
        }
        StrategyKind::Mirrored => {
            #[cfg(feature = "cuda")]
            if plan.strategy.devices.iter().any(|d| d.kind == crate::spec::DeviceKind::Gpu) {
                return Ok(Box::new(gpu::new(plan)?));
            }
            let algorithm = match plan.strategy.reduction {
                crate::plan::Reduction::CrossDevice { algorithm, .. } => algorithm,
                _ => crate::spec::CrossDeviceOps::ReductionToOneDevice,
            };
            gpu_free(&plan.strategy.devices)?;
            Ok(Box::new(mirrored::new(replicas, algorithm)))
        }
        StrategyKind::CentralStorage => {
            gpu_free(&plan.strategy.devices)?;
            Ok(Box::new(central_storage::new(replicas)))
        }
        kind @ (StrategyKind::MultiWorkerMirrored | StrategyKind::ParameterServer) => {
            Err(StrategyError::NotBuilt(kind.name()))
        }
    }
}

/// Replicas on GPUs need the CUDA build, and there only `one_device` and `mirrored` use them.
fn gpu_free(devices: &[crate::spec::Device]) -> Result<(), StrategyError> {
    #[cfg(not(feature = "cuda"))]
    let why = "which needs a GPU build of trainrun (cargo build --release --features cuda); this one runs on CPUs only";
    #[cfg(feature = "cuda")]
    let why = "but this strategy runs on CPUs only; use strategy.kind = \"mirrored\" or \"one_device\" for GPUs";
    match devices.iter().find(|d| d.kind == crate::spec::DeviceKind::Gpu) {
        Some(d) => Err(StrategyError::Unsupported(format!("strategy.devices includes \"{d}\", {why}"))),
        None => Ok(()),
    }
}

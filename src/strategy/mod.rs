//! Distribution strategies behind one seam, [`Strategy`]: how each optimizer step runs over the
//! replicas, which is all the training loop (`train::fit`, one loop for every strategy) leaves
//! to them. Synchronous strategies compute every step's gradient in lockstep and apply it
//! ([`Synchronous`], run through [`lockstep::Lockstep`]); under `parameter_server` the chief
//! schedules closures of steps on the workers instead (`parameter_server::chief`). Adding a
//! strategy is a variant of `plan::Distribution`, a file, and an arm in [`build`].

mod central_storage;
mod cross_device;
mod default;
#[cfg(feature = "cuda")]
mod gpu;
mod input;
mod local;
mod lockstep;
mod mirrored;
mod multi_worker_mirrored;
mod one_device;
pub mod parameter_server;
mod replica;

pub use input::Input;
pub use multi_worker_mirrored::{MultiWorkerMirrored, check_devices as check_multi_worker_devices};
pub use parameter_server::stats::ParameterServerStats;
pub use replica::{BatchView, MicroStep, Replica};

use crate::cluster::job::Job;
use crate::data::Batch;
use crate::engine::{Optimizer, Sequential};
use crate::metrics::Sums;
use crate::plan::{Distribution, Plan, StrategyKind};
use crate::vocab::{Device, DeviceKind};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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
    /// The input pipeline failed (the training loop reports it as the data error it is).
    #[error(transparent)]
    Input(Box<crate::data::DataError>),
}

/// What one step's gradient computation found, the same at every task.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Step {
    /// Loss and accuracy sums over the whole global batch.
    pub stats: Sums,
    /// Some task was asked to stop (SIGTERM) before this step: every task sees it at the same
    /// step, so they stop together.
    pub stop: bool,
}

/// One execution of the training loop: the steps to run (or schedule) next.
pub struct Execution<'a> {
    /// The variables the steps start from (synchronous strategies update them in place).
    pub vars: &'a mut Variables,
    /// This task's input (synchronous strategies read each step's micro-batches from it).
    pub input: &'a mut Input,
    /// The first step's index, counted from 0 over the whole run.
    pub step: u64,
    /// The learning rate of each step.
    pub lrs: &'a [f32],
    /// The run's seed; each step's randomness derives from it and the step.
    pub seed: u64,
    /// This task was asked to stop (SIGTERM) before these steps.
    pub stop: bool,
}

/// What an execution did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Executed {
    /// The step's gradient is computed in this task and waits for [`Strategy::apply`].
    Computed {
        /// Its statistics over the whole global batch, and whether any task voted to stop.
        step: Step,
        /// Time spent waiting for the input pipeline's batches.
        input_wait: Duration,
    },
    /// The steps went to the workers, which run them on their own: their statistics come
    /// with [`Strategy::join`].
    Scheduled {
        /// Steps applied since the last [`Strategy::join`], for the progress display.
        applied: u64,
    },
    /// A stop was asked: nothing was scheduled, and `unrun` steps queued earlier were
    /// cancelled before any worker started them.
    Stopped { unrun: u64 },
}

/// How one task runs the training steps of its strategy: the seam between the training loop
/// and the strategies.
pub trait Strategy: Send {
    /// The most steps one [`Strategy::execute`] takes (1 unless closures carry several).
    fn steps_per_execution(&self) -> u64 {
        1
    }

    /// Training begins from `vars` and `optimizer` (restored from a backup, when one was);
    /// `worker_steps` are the steps each worker had completed before (parameter servers).
    fn start(&mut self, _vars: &Variables, _optimizer: &Optimizer, _worker_steps: &[u64]) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Runs or schedules the steps of `cx` (one step, unless [`Strategy::steps_per_execution`]
    /// allows more).
    fn execute(&mut self, cx: Execution<'_>) -> Result<Executed, StrategyError>;

    /// Applies the optimizer with the gradient [`Executed::Computed`] left, at `lr`, and gives
    /// the step's batches back to `input`.
    fn apply(
        &mut self,
        vars: &mut Variables,
        optimizer: &mut Optimizer,
        input: &mut Input,
        lr: f32,
    ) -> Result<(), StrategyError>;

    /// Waits until every step executed so far is applied, makes `vars` and `optimizer` the
    /// job's current ones, and adds the statistics of steps not reported yet to `stats`, in
    /// the order they were applied. Once `stop` is set, steps not started yet are dropped
    /// instead of waited for; returns how many. A no-op where every step completes in
    /// [`Strategy::execute`] and [`Strategy::apply`].
    fn join(
        &mut self,
        _vars: &mut Variables,
        _optimizer: &mut Optimizer,
        _stats: &mut Sums,
        _stop: &AtomicBool,
    ) -> Result<u64, StrategyError> {
        Ok(0)
    }

    /// Loss and accuracy sums over `batches` (this task's share), across all replicas.
    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut (dyn Iterator<Item = Batch> + Send),
    ) -> Result<Sums, StrategyError>;

    /// Copies the chief's `data` to every task (restored state at start); a no-op in one
    /// process.
    fn broadcast(&mut self, _data: &mut [f32]) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Leaves the job cleanly at the end of training (the chief waits for the workers).
    fn finish(&mut self) -> Result<(), StrategyError> {
        Ok(())
    }

    /// How gradients travel between tasks, if they do.
    fn transport(&self) -> Option<&'static str> {
        None
    }

    /// The steps each worker has completed, this run and before it, where workers keep their
    /// own place in the data (parameter servers); empty otherwise.
    fn worker_steps(&self) -> Vec<u64> {
        Vec::new()
    }

    /// What the parameter-server coordinator did, under `parameter_server`.
    fn parameter_server_stats(&self) -> Option<ParameterServerStats> {
        None
    }

    /// The tasks whose steps stand out, as the chief of a multi-worker job sees them.
    fn stragglers(&self) -> Vec<crate::cluster::Straggler> {
        Vec::new()
    }
}

/// How one task of a synchronous strategy computes and reduces each step's gradient: every
/// replica of every task takes each step together ([`lockstep::Lockstep`] runs it).
pub trait Synchronous: Send {
    /// The strategy's kind.
    fn kind(&self) -> StrategyKind;

    /// Forward and backward over this task's `micro` batches of one optimizer step, leaving in
    /// the strategy's gradient buffer the gradient of the mean loss over the whole global
    /// batch (all replicas), and returning loss and accuracy sums over the whole global batch.
    /// `stop` is this task's vote to stop; the result says whether any task voted. A strategy
    /// may leave part of that work for [`Synchronous::apply`] to fuse into the update (one
    /// replica in one process defers backward; local replicas defer their sum).
    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError>;

    /// Applies the optimizer with the gradients of the last [`Synchronous::compute_gradients`].
    /// Every replica's copy is updated identically.
    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError>;

    /// How gradients travel between worker processes, if they do.
    fn transport(&self) -> Option<&'static str> {
        None
    }

    /// The tasks whose steps stand out, as the chief of a multi-worker job sees them.
    fn stragglers(&self) -> Vec<crate::cluster::Straggler> {
        Vec::new()
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
    ) -> Result<Sums, StrategyError>;
}

/// The strategy `plan` asks for, over `models` (one per local device of the plan) and, for a
/// task of a multi-process job, the `job` it joined. One exhaustive match: adding a strategy
/// is a variant, a file and an arm here.
pub fn build(plan: &Plan, models: Vec<Sequential>, job: Option<Job>) -> Result<Box<dyn Strategy>, StrategyError> {
    let devices = &plan.strategy.devices;
    let on_gpus = devices.iter().any(|d| d.kind == DeviceKind::Gpu);
    let synchronous: Box<dyn Synchronous> = match &plan.strategy.distribution {
        Distribution::Default => Box::new(default::new(one(replicas(plan, models))?)),
        Distribution::OneDevice | Distribution::Mirrored(_) if on_gpus => gpus(plan, models)?,
        Distribution::OneDevice => Box::new(one_device::new(one(replicas(plan, models))?)),
        Distribution::Mirrored(cross_device) => Box::new(mirrored::new(replicas(plan, models), cross_device.algorithm)),
        Distribution::CentralStorage => {
            cpus_only(devices)?;
            Box::new(central_storage::new(replicas(plan, models)))
        }
        Distribution::MultiWorkerMirrored(collective) => {
            check_multi_worker_devices(devices)?;
            let job = job.ok_or_else(|| {
                StrategyError::Unsupported(
                    "multi_worker_mirrored runs in a task of a job: name the task with --task".into(),
                )
            })?;
            Box::new(MultiWorkerMirrored::new(replicas(plan, models), job, collective.bytes_per_pack.get())?)
        }
        Distribution::ParameterServer(ps) => {
            cpus_only(devices)?;
            // The chief only evaluates, while the workers wait: with every thread it has.
            let model = models
                .into_iter()
                .next()
                .ok_or_else(|| StrategyError::Unsupported("no model to place on a device".into()))?;
            let replica = Replica::new(model, plan.train.loss_fn(), plan.model.classes, ps.eval_threads);
            let timeouts = (plan.cluster.startup_timeout, plan.cluster.timeout);
            return Ok(Box::new(parameter_server::chief::new(replica, job, ps.clone(), timeouts)?));
        }
    };
    Ok(Box::new(lockstep::Lockstep::new(synchronous, plan.batch.accumulation_steps)))
}

/// Refuses, before anything starts, a plan this build cannot run: GPU devices where only
/// CPUs run.
pub fn runnable(plan: &Plan) -> Result<(), StrategyError> {
    let devices = &plan.strategy.devices;
    match plan.strategy.kind() {
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
fn gpus(plan: &Plan, models: Vec<Sequential>) -> Result<Box<dyn Synchronous>, StrategyError> {
    Ok(Box::new(gpu::new(plan, models)?))
}

/// Replicas on GPUs need the CUDA build.
#[cfg(not(feature = "cuda"))]
fn gpus(plan: &Plan, _models: Vec<Sequential>) -> Result<Box<dyn Synchronous>, StrategyError> {
    cpus_only(&plan.strategy.devices)?;
    Err(StrategyError::Unsupported("GPU devices need a GPU build of trainrun".into()))
}

/// Strategies whose replicas run on CPUs only refuse GPU devices, saying what would run them.
fn cpus_only(devices: &[Device]) -> Result<(), StrategyError> {
    #[cfg(not(feature = "cuda"))]
    let why = "which needs a GPU build of trainrun (cargo build --release, without --no-default-features); this one runs on CPUs only";
    #[cfg(feature = "cuda")]
    let why = "but this strategy runs on CPUs only; use strategy.kind = \"mirrored\" or \"one_device\" for GPUs";
    match devices.iter().find(|d| d.kind == DeviceKind::Gpu) {
        Some(d) => Err(StrategyError::Unsupported(format!("strategy.devices includes \"{d}\", {why}"))),
        None => Ok(()),
    }
}

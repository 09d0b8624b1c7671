//! `one_device` on a GPU and `mirrored` over GPUs (the default `cuda` feature): one replica per GPU,
//! each driven by its own thread, gradients summed with NCCL, the SGD update applied on every
//! GPU alike.
//!
//! The training loop keeps the variables (and the optimizer's velocity) on the host, where
//! checkpoints read them. The GPUs keep their own copies; a host copy is uploaded only when it
//! differs from what the GPUs were last given (a restored checkpoint), and the results are
//! downloaded after each update, so both sides always agree.

use super::replica::BatchView;
use super::{Step, StrategyError, Synchronous, Variables};
use crate::data::Batch;
use crate::engine::cuda::worker::{GpuThread, Pending};
use crate::engine::cuda::{CudaError, GpuReplica, SgdConfig, kernels, model, probe};
use crate::engine::{Optimizer, Sequential};
use crate::metrics::Sums;
use crate::plan::CrossDevice;
use crate::plan::{CrossDevicePlan, Distribution, OptimizerPlan, Plan, StrategyKind};
use crate::vocab::DeviceKind;
use std::sync::Arc;

/// Replicas on GPUs.
pub struct Gpus {
    kind: StrategyKind,
    workers: Vec<GpuThread>,
    /// What the GPUs hold, as last uploaded or downloaded.
    params: Vec<f32>,
    state: Vec<f32>,
    velocity: Vec<f32>,
    /// Whether the GPUs hold anything yet.
    loaded: bool,
}

/// One replica's share of a batch: images, labels, examples.
type ReplicaShare = (Vec<f32>, Vec<u32>, usize);

/// A GPU problem found while setting up: the spec cannot run here (exit code 3).
fn err(e: CudaError) -> StrategyError {
    StrategyError::Unsupported(format!("GPU: {e}"))
}

/// A GPU problem while training: the run failed (exit code 1).
fn failed(e: CudaError) -> StrategyError {
    StrategyError::Device(format!("GPU: {e}"))
}

/// The GPU strategy for `plan` (`one_device` on a GPU, or `mirrored` over GPUs), placing the
/// GPU twin of each of `models` (one per GPU) on its device.
pub fn new(plan: &Plan, models: Vec<Sequential>) -> Result<Gpus, StrategyError> {
    let devices = &plan.strategy.devices;
    if let Some(cpu) = devices.iter().find(|d| d.kind == DeviceKind::Cpu) {
        return Err(StrategyError::Unsupported(format!(
            "strategy.devices mixes GPUs with \"{cpu}\"; list only GPUs (or only CPUs)"
        )));
    }
    if let Distribution::Mirrored(CrossDevicePlan { algorithm, .. }) = plan.strategy.distribution
        && devices.len() > 1
        && algorithm != CrossDevice::Nccl
    {
        return Err(StrategyError::Unsupported(format!(
            "strategy.cross_device_ops = \"{}\" on GPUs is not built; use \"nccl\" (or \"auto\")",
            algorithm.name()
        )));
    }
    let momentum = match plan.optimizer {
        OptimizerPlan::Sgd { momentum, .. } => momentum > 0.0,
        OptimizerPlan::Adam { .. } => {
            return Err(StrategyError::Unsupported(
                "GPU: optimizer.kind = \"adam\" has no GPU kernel yet; use \"sgd\", or train on CPUs".into(),
            ));
        }
    };
    model::check_loss(plan.train.loss_fn()).map_err(err)?;
    model::check_metrics(&plan.train.metrics).map_err(err)?;
    let indices: Vec<usize> = devices.iter().map(|d| d.index as usize).collect();
    probe::training(&indices).map_err(err)?;
    let ptx: Arc<str> = kernels::compile().map_err(err)?.to_src().into();
    let id = if indices.len() > 1 { Some(crate::engine::cuda::nccl::new_id().map_err(err)?) } else { None };
    let classes = plan.model.classes;
    let world = indices.len();
    let mut workers = Vec::with_capacity(world);
    let mut ready = Vec::with_capacity(world);
    for ((rank, &index), cpu) in indices.iter().enumerate().zip(models) {
        let ptx = ptx.clone();
        let (worker, init) = GpuThread::spawn(index, move || {
            let mut replica = GpuReplica::new(index, &ptx, &cpu, classes, momentum)?;
            if let Some(id) = id {
                // Blocks until every GPU's thread has joined.
                replica.join(rank, world, id)?;
            }
            Ok(replica)
        })
        .map_err(err)?;
        workers.push(worker);
        ready.push(init);
    }
    wait_all(ready, err)?;
    let kind = plan.strategy.kind();
    Ok(Gpus { kind, workers, params: Vec::new(), state: Vec::new(), velocity: Vec::new(), loaded: false })
}

/// Every GPU thread's answer, the first error reported through `report` (set-up or training).
fn wait_all<R>(pending: Vec<Pending<R>>, report: fn(CudaError) -> StrategyError) -> Result<Vec<R>, StrategyError> {
    // Wait for every answer before reporting the first error, so no thread is left mid-call.
    let results: Vec<Result<R, CudaError>> = pending.into_iter().map(Pending::wait).collect();
    results.into_iter().map(|r| r.map_err(report)).collect()
}

impl Gpus {
    /// Uploads whatever the host holds that the GPUs do not.
    fn sync_in(&mut self, vars: &Variables, velocity: Option<&[f32]>) -> Result<(), StrategyError> {
        let params = (!self.loaded || self.params != vars.params).then(|| Arc::new(vars.params.clone()));
        let state = (!self.loaded || self.state != vars.state).then(|| Arc::new(vars.state.clone()));
        let velocity = velocity.filter(|v| !self.loaded || self.velocity != *v).map(|v| Arc::new(v.to_vec()));
        if params.is_none() && state.is_none() && velocity.is_none() {
            return Ok(());
        }
        let mut pending = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            let (p, s, v) = (params.clone(), state.clone(), velocity.clone());
            pending.push(
                w.submit(move |r| {
                    let (gpu, arena) = (r.gpu(), r.arena());
                    if let Some(p) = p {
                        arena.upload_params(gpu, &p)?;
                    }
                    if let Some(s) = s {
                        arena.upload_state(gpu, &s)?;
                    }
                    if let Some(v) = v {
                        arena.upload_velocity(gpu, &v)?;
                    }
                    Ok(())
                })
                .map_err(failed)?,
            );
        }
        wait_all(pending, failed)?;
        self.params.clone_from(&vars.params);
        self.state.clone_from(&vars.state);
        if let Some(v) = velocity {
            self.velocity = v.to_vec();
        }
        self.loaded = true;
        Ok(())
    }

    /// Each replica's contiguous part of every batch, copied for its thread.
    fn parts(&self, micro: &[Batch]) -> Vec<Vec<ReplicaShare>> {
        let n = self.workers.len();
        (0..n)
            .map(|r| {
                micro
                    .iter()
                    .map(|b| {
                        let v = BatchView::part(b, r, n);
                        (v.x.to_vec(), v.y.to_vec(), v.n)
                    })
                    .collect()
            })
            .collect()
    }
}

impl Synchronous for Gpus {
    fn kind(&self) -> StrategyKind {
        self.kind
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        _seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError> {
        self.sync_in(vars, None)?;
        let scale = 1.0 / micro.iter().map(Batch::global_rows).sum::<usize>().max(1) as f32;
        let mut pending = Vec::with_capacity(self.workers.len());
        for (w, parts) in self.workers.iter().zip(self.parts(micro)) {
            let state_len = vars.state.len();
            pending.push(
                w.submit(move |r| {
                    let mut stats = Sums::default();
                    for (i, (x, y, n)) in parts.iter().enumerate() {
                        stats.add(r.train_step(x, y, *n, scale, i > 0)?);
                    }
                    r.all_reduce()?;
                    let mut state = vec![0.0; state_len];
                    r.arena().download_state(r.gpu(), &mut state)?;
                    Ok((stats, state))
                })
                .map_err(failed)?,
            );
        }
        let results = wait_all(pending, failed)?;
        let mut total = Sums::default();
        let count = results.len() as f32;
        let mut state: Option<Vec<f32>> = None;
        for (stats, s) in results {
            total.add(stats);
            match &mut state {
                None => state = Some(s),
                Some(acc) => acc.iter_mut().zip(&s).for_each(|(a, v)| *a += v),
            }
        }
        // Every replica saw different examples: keep the mean of their statistics, as the CPU
        // mirrored strategy does (the GPUs get it with the next upload).
        if let Some(mut s) = state {
            if count > 1.0 {
                s.iter_mut().for_each(|v| *v /= count);
            } else {
                self.state.clone_from(&s);
            }
            vars.state = s;
        }
        Ok(Step { stats: total, stop })
    }

    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError> {
        let Optimizer::Sgd(sgd) = optimizer else {
            return Err(StrategyError::Unsupported("GPU: only SGD runs on the GPU".into()));
        };
        if sgd.clip_norm.is_some() {
            return Err(StrategyError::Unsupported(
                "GPU: optimizer.clip_norm has no GPU kernel yet; remove it, or train on CPUs".into(),
            ));
        }
        let cfg = SgdConfig { momentum: sgd.momentum, nesterov: sgd.nesterov, weight_decay: sgd.weight_decay };
        self.sync_in(vars, sgd.velocity.as_deref())?;
        let (len, momentum) = (vars.params.len(), sgd.velocity.is_some());
        let mut pending = Vec::with_capacity(self.workers.len());
        for (rank, w) in self.workers.iter().enumerate() {
            pending.push(
                w.submit(move |r| {
                    r.sgd(lr, cfg)?;
                    // Every GPU applied the same update to the same values: one copy is enough.
                    if rank > 0 {
                        return Ok(None);
                    }
                    let mut params = vec![0.0; len];
                    r.arena().download_params(r.gpu(), &mut params)?;
                    let mut velocity = vec![0.0; if momentum { len } else { 0 }];
                    r.arena().download_velocity(r.gpu(), &mut velocity)?;
                    Ok(Some((params, velocity)))
                })
                .map_err(failed)?,
            );
        }
        if let Some(Some((params, velocity))) = wait_all(pending, failed)?.into_iter().next() {
            vars.params.clone_from(&params);
            self.params = params;
            if let Some(v) = sgd.velocity.as_mut() {
                v.clone_from(&velocity);
                self.velocity = velocity;
            }
        }
        sgd.iterations += 1;
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<Sums, StrategyError> {
        self.sync_in(vars, None)?;
        let mut total = Sums::default();
        for batch in batches {
            let mut pending = Vec::with_capacity(self.workers.len());
            for (w, mut parts) in self.workers.iter().zip(self.parts(std::slice::from_ref(&batch))) {
                let (x, y, n) = parts.pop().unwrap_or_default();
                pending.push(w.submit(move |r| r.evaluate(&x, &y, n)).map_err(failed)?);
            }
            wait_all(pending, failed)?.into_iter().for_each(|s| total.add(s));
        }
        Ok(total)
    }
}

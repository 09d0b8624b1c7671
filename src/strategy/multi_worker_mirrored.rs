//! `multi_worker_mirrored`: TensorFlow's `MultiWorkerMirroredStrategy`. Every worker process
//! holds a replica; each step, gradients are summed across workers by the collective data
//! plane, so every worker applies the same update to identical variables.
//!
//! With shared memory, backward writes gradients straight into this worker's slot of the
//! segment and one all-reduce follows (0.2 ms for 11 MB between two processes): overlapping
//! it with backward measured slower on 2 cores, where the reduction competes with the other
//! worker's backward. Over TCP, gradients travel in `bytes_per_pack` packs while backward
//! continues, which hides about a third of the transfer.
//!
//! With several devices per worker the reduction is hierarchical, as in TensorFlow: the local
//! replicas' gradients are summed onto the first one (`reduction_to_one_device`), that sum
//! crosses workers, and the local "broadcast" is free because the local replicas read one
//! shared copy of the variables.

use super::local::LocalReplicas;
use super::{Replica, Step, StrategyError, Synchronous, Variables};
use crate::cluster::job::Job;
use crate::collective::{BucketReducer, Communicator, Packs};
use crate::data::Batch;
use crate::engine::Optimizer;
use crate::engine::init::derive_seed;
use crate::engine::sequential::GradSink;
use crate::metrics::Sums;
use crate::plan::{CrossDevice, StrategyKind};
use crate::vocab::{Device, DeviceKind};
use std::ops::Range;
use std::time::{Duration, Instant};

impl GradSink for Packs<'_> {
    fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
        let (start, len) = (range.start, range.len());
        match self.get_mut(range) {
            Some(s) => s,
            // Backward writes layers back to front and marks each finished prefix, so it never
            // asks for a range it already handed off.
            None => panic!("backward asked for gradients {start}..{} after handing them off", start + len),
        }
    }

    fn ready(&mut self, k: usize) {
        Packs::ready(self, k);
    }
}

/// This worker's replicas.
enum WorkerReplicas {
    /// One device: backward can feed the all-reduce pack by pack.
    One(Replica),
    /// Several devices: summed locally before the cross-worker all-reduce.
    Many(LocalReplicas),
}

impl WorkerReplicas {
    fn param_len(&self) -> usize {
        match self {
            WorkerReplicas::One(r) => r.model().param_len(),
            WorkerReplicas::Many(l) => l.param_len(),
        }
    }
}

/// Workers run CPU replicas only: NCCL across processes is not built yet, and silently
/// training on CPUs what the spec places on GPUs would mislead.
pub fn check_devices(devices: &[Device]) -> Result<(), StrategyError> {
    match devices.iter().find(|d| d.kind == DeviceKind::Gpu) {
        Some(d) => Err(StrategyError::Unsupported(format!(
            "strategy.devices includes \"{d}\", but multi_worker_mirrored runs on CPU devices only in this version \
             (NCCL between processes is not built yet); use strategy.kind = \"mirrored\" for the GPUs of one machine"
        ))),
        None => Ok(()),
    }
}

/// A worker of a multi-worker job.
pub struct MultiWorkerMirrored {
    replicas: WorkerReplicas,
    job: Option<Job>,
    /// Gradients, unless they live in the shared-memory arena.
    grads: Vec<f32>,
    packs: BucketReducer,
    rank: u64,
}

impl MultiWorkerMirrored {
    /// The strategy for this worker's `replicas` (one per local device) in `job`, which must
    /// hold a data plane.
    pub fn new(mut replicas: Vec<Replica>, mut job: Job, bytes_per_pack: usize) -> Result<Self, StrategyError> {
        let comm = job.comm.as_deref_mut().ok_or(StrategyError::Finished)?;
        let rank = comm.rank() as u64;
        let per_worker = replicas.len() as u64;
        let replicas = match replicas.len() {
            0 => return Err(StrategyError::Unsupported("no model to place on a device".into())),
            1 => WorkerReplicas::One(replicas.remove(0)),
            // Replicas are numbered across the job so that dropout masks differ between them.
            _ => {
                WorkerReplicas::Many(LocalReplicas::new(replicas, CrossDevice::ReductionToOneDevice, rank * per_worker))
            }
        };
        let len = replicas.param_len();
        // Backward writes straight into the transport's arena when it has one.
        let grads = if comm.arena().is_some() { Vec::new() } else { vec![0.0; len] };
        Ok(Self { replicas, job: Some(job), grads, packs: BucketReducer::new(bytes_per_pack), rank })
    }

    fn comm(&mut self) -> Result<&mut (dyn Communicator + 'static), StrategyError> {
        self.job.as_mut().and_then(|j| j.comm.as_deref_mut()).ok_or(StrategyError::Finished)
    }
}

impl Synchronous for MultiWorkerMirrored {
    fn kind(&self) -> StrategyKind {
        StrategyKind::MultiWorkerMirrored
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError> {
        let len = self.replicas.param_len();
        let scale = 1.0 / micro.iter().map(Batch::global_rows).sum::<usize>().max(1) as f32;
        let (rank, packs) = (self.rank, self.packs);
        let Self { replicas, job, grads, .. } = self;
        let job = job.as_mut().ok_or(StrategyError::Finished)?;
        // A peer that died shows here at once, not at the next collective's timeout.
        job.plane.check()?;
        let comm = job.comm.as_deref_mut().ok_or(StrategyError::Finished)?;
        // This task's own work, waits for the others excluded: what tells a straggler apart.
        let (local, busy) = match replicas {
            WorkerReplicas::One(replica) => one_replica(replica, comm, grads, packs, vars, micro, (scale, seed, rank))?,
            WorkerReplicas::Many(local) => {
                let began = Instant::now();
                if let Some(arena) = comm.arena() {
                    let stats = local.gradients(vars, &mut arena[..len], micro, scale, seed)?;
                    let busy = began.elapsed();
                    comm.all_reduce_arena(len)?;
                    (stats, busy)
                } else {
                    let stats = local.gradients(vars, grads, micro, scale, seed)?;
                    let busy = began.elapsed();
                    comm.all_reduce_sum(grads)?;
                    (stats, busy)
                }
            }
        };
        job.plane.record_step(busy);
        // Batch-norm moving statistics are averaged so every worker keeps the same ones.
        if !vars.state.is_empty() {
            comm.all_reduce_sum(&mut vars.state)?;
            let world = comm.world() as f32;
            vars.state.iter_mut().for_each(|v| *v /= world);
        }
        // The stop votes ride on the statistics' all-reduce: every worker learns at the same
        // step that some task was asked to stop, at no extra round trip.
        let mut global = [0.0; Sums::LEN + 1];
        global[..Sums::LEN].copy_from_slice(&local.summable());
        global[Sums::LEN] = if stop { 1.0 } else { 0.0 };
        comm.all_reduce_sum_f64(&mut global)?;
        let stats = Sums::from_values(std::array::from_fn(|i| global[i]));
        Ok(Step { stats, stop: global[Sums::LEN] > 0.0 })
    }

    fn broadcast(&mut self, data: &mut [f32]) -> Result<(), StrategyError> {
        Ok(self.comm()?.broadcast(data, 0)?)
    }

    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError> {
        let len = self.replicas.param_len();
        let Self { job, grads, .. } = self;
        let comm = job.as_mut().and_then(|j| j.comm.as_deref_mut()).ok_or(StrategyError::Finished)?;
        match comm.arena() {
            Some(arena) => optimizer.step(&mut vars.params, &arena[..len], lr),
            None => optimizer.step(&mut vars.params, grads, lr),
        }
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<Sums, StrategyError> {
        let mut local = Sums::default();
        for b in batches {
            local.add(match &mut self.replicas {
                WorkerReplicas::One(r) => r.evaluate(vars, &b),
                WorkerReplicas::Many(l) => l.evaluate(vars, &b),
            });
        }
        let mut global = local.summable();
        self.comm()?.all_reduce_sum_f64(&mut global)?;
        Ok(Sums::from_values(global))
    }

    fn transport(&self) -> Option<&'static str> {
        let comm = self.job.as_ref().and_then(|j| j.comm.as_deref())?;
        Some(comm.transport().name())
    }

    fn stragglers(&self) -> Vec<crate::cluster::Straggler> {
        self.job.as_ref().map(|j| j.plane.stragglers()).unwrap_or_default()
    }

    fn finish(&mut self) -> Result<(), StrategyError> {
        if let Some(job) = self.job.take() {
            drop(job.comm);
            job.plane.shutdown();
        }
        Ok(())
    }
}

/// One replica's forward and backward over `micro`, its gradients summed across workers:
/// straight in the transport's arena when it has one, else in `grads`, handed over pack by
/// pack during the last backward when the transport gains from overlap. Returns the sums and
/// the time spent computing (with overlap, the wait for the last packs counts as computing).
fn one_replica(
    replica: &mut Replica,
    comm: &mut dyn Communicator,
    grads: &mut Vec<f32>,
    packs: BucketReducer,
    vars: &mut Variables,
    micro: &[Batch],
    (scale, seed, rank): (f32, u64, u64),
) -> Result<(Sums, Duration), StrategyError> {
    let len = replica.model().param_len();
    let mut local = Sums::default();
    let mut busy = Duration::ZERO;
    let last = micro.len().saturating_sub(1);
    for (i, batch) in micro.iter().enumerate() {
        let s = derive_seed(&[seed, i as u64, rank]);
        let accumulate = i > 0;
        let began = Instant::now();
        if let Some(arena) = comm.arena() {
            let mut arena = &mut arena[..len];
            local.add(replica.forward_backward(vars, &mut arena, batch, scale, s, accumulate));
            busy += began.elapsed();
            if i == last {
                comm.all_reduce_arena(len)?;
            }
        } else if i == last && comm.overlaps_backward() {
            let stats =
                packs.run(&mut *comm, grads, |p| replica.forward_backward(vars, p, batch, scale, s, accumulate))?;
            busy += began.elapsed();
            local.add(stats);
        } else {
            local.add(replica.forward_backward(vars, grads, batch, scale, s, accumulate));
            busy += began.elapsed();
            if i == last {
                comm.all_reduce_sum(grads)?;
            }
        }
    }
    Ok((local, busy))
}

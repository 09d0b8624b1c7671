//! Everything one GPU holds for training: the device, the model's GPU twin, its arena, and its
//! all-reduce membership when there are several GPUs.

use super::arena::{Arena, SgdConfig};
use super::device::Gpu;
use super::error::CudaError;
use super::model::GpuModel;
use super::nccl::AllReduce;
use crate::engine::Sequential;
use crate::metrics::Sums;

/// A model replica on one GPU.
pub struct GpuReplica {
    gpu: Gpu,
    model: GpuModel,
    arena: Arena,
    comm: Option<AllReduce>,
}

impl GpuReplica {
    /// Opens `gpu:index` with the kernels `ptx` and places the GPU twin of the built CPU model
    /// `cpu` on it; `momentum` keeps an SGD velocity.
    pub fn new(index: usize, ptx: &str, cpu: &Sequential, classes: usize, momentum: bool) -> Result<Self, CudaError> {
        let gpu = Gpu::open(index, ptx)?;
        let model = GpuModel::new(&gpu, cpu, classes)?;
        let arena = Arena::new(&gpu, cpu.param_len(), cpu.state_len(), momentum)?;
        Ok(Self { gpu, model, arena, comm: None })
    }

    /// Joins an all-reduce group (several GPUs); call on every replica's thread at once.
    pub fn join(&mut self, rank: usize, world: usize, id: cudarc::nccl::Id) -> Result<(), CudaError> {
        self.comm = Some(AllReduce::join(&self.gpu, rank, world, id)?);
        Ok(())
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The device arena.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Forward and backward of one batch into the gradient arena (see [`GpuModel::train_step`]).
    pub fn train_step(
        &mut self,
        x: &[f32],
        y: &[u32],
        n: usize,
        scale: f32,
        accumulate: bool,
    ) -> Result<Sums, CudaError> {
        self.model.train_step(&self.gpu, &self.arena, (x, y, n), scale, accumulate)
    }

    /// Sums the gradients over the group; a no-op alone.
    pub fn all_reduce(&mut self) -> Result<(), CudaError> {
        match &self.comm {
            Some(comm) => comm.sum_in_place(self.arena.grads_mut()),
            None => Ok(()),
        }
    }

    /// One SGD update.
    pub fn sgd(&self, lr: f32, cfg: SgdConfig) -> Result<(), CudaError> {
        self.arena.sgd(&self.gpu, lr, cfg)
    }

    /// Loss and accuracy sums in inference mode.
    pub fn evaluate(&mut self, x: &[f32], y: &[u32], n: usize) -> Result<Sums, CudaError> {
        self.model.evaluate(&self.gpu, &self.arena, x, y, n)
    }

    /// Logits in inference mode.
    pub fn predict(&mut self, x: &[f32], n: usize) -> Result<Vec<f32>, CudaError> {
        self.model.predict(&self.gpu, &self.arena, x, n)
    }
}

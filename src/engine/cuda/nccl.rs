//! NCCL all-reduce (sum) of a device's gradient arena with the same arena on the other GPUs of
//! this process. One communicator per device, created and used on that device's thread
//! (`nccl::Comm` is neither `Send` nor `Sync`); ranks meet through an [`Id`] made once and
//! copied to every thread.

use super::device::{Buf, Gpu};
use super::error::CudaError;
use super::probe::{Library, require};
use cudarc::nccl::{Comm, Id, ReduceOp};

/// The unique id every rank of one group joins with; probes NCCL first.
pub fn new_id() -> Result<Id, CudaError> {
    require(&[Library::Nccl])?;
    Ok(Id::new()?)
}

/// This device's member of an all-reduce group.
pub struct AllReduce {
    comm: Comm,
}

impl AllReduce {
    /// Joins group `id` as `rank` of `world`; blocks until every rank has joined, so each rank
    /// must call this on its own thread.
    pub fn join(gpu: &Gpu, rank: usize, world: usize, id: Id) -> Result<Self, CudaError> {
        require(&[Library::Nccl])?;
        Ok(Self { comm: Comm::from_rank(gpu.stream().clone(), rank, world, id)? })
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// Sums the f32 values of `buf` over all ranks, in place, on the device's stream (every
    /// rank passes a buffer of the same length).
    pub fn sum_in_place(&self, buf: &mut Buf) -> Result<(), CudaError> {
        let len = buf.len_f32();
        if len == 0 {
            return Ok(());
        }
        let mut view = buf.view_f32()?;
        self.comm.all_reduce_in_place(&mut view, &ReduceOp::Sum)?;
        Ok(())
    }
}

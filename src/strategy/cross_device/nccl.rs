//! `nccl`: NVIDIA's collective library between GPUs of one process. Replicas on CPUs have no
//! NCCL; the plan already refuses that combination, and this build has no GPU backend.

use crate::strategy::StrategyError;

/// Always an error in a build without CUDA.
pub fn reduce(_buffers: &mut [&mut [f32]]) -> Result<(), StrategyError> {
    Err(StrategyError::Unsupported(
        "cross_device_ops = \"nccl\" needs GPU devices and a CUDA build of trainrun; on CPUs use \"reduction_to_one_device\" or \"hierarchical_copy\"".into(),
    ))
}

//! `central_storage`: TensorFlow's `CentralStorageStrategy`: the variables live once on the
//! CPU, compute is replicated over the local devices, and their gradients are summed onto the
//! central copy before the update. With one device, everything lives on it.

use super::Replica;
use super::local::Replicated;
use crate::plan::CrossDevice;
use crate::plan::StrategyKind;

/// The central-storage strategy over `replicas`: gradients always meet on the CPU.
pub fn new(replicas: Vec<Replica>) -> Replicated {
    Replicated::new(StrategyKind::CentralStorage, replicas, CrossDevice::ReductionToOneDevice)
}

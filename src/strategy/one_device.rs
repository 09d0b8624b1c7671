//! `one_device`: one replica placed on a named device (`OneDeviceStrategy`). On a CPU it is
//! the default strategy with an explicit placement.

use super::local::Replicated;
use super::{Replica, StrategyError};
use crate::plan::StrategyKind;
use crate::spec::{CrossDeviceOps, Device, DeviceKind};

/// One replica on `device`; only CPU devices exist in a build without CUDA.
pub fn new(device: Device, replica: Replica) -> Result<Replicated, StrategyError> {
    match device.kind {
        DeviceKind::Cpu => {
            Ok(Replicated::new(StrategyKind::OneDevice, vec![replica], CrossDeviceOps::ReductionToOneDevice))
        }
        DeviceKind::Gpu => Err(StrategyError::Unsupported(format!(
            "strategy.device = \"{device}\" needs a GPU build of trainrun (cargo build --release --features cuda); this one runs on CPUs only"
        ))),
    }
}

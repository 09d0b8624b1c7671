//! `one_device`: one replica placed on a named device (`OneDeviceStrategy`). On a CPU it is
//! the default strategy with an explicit placement; on a GPU, `strategy::build` gives the
//! GPU engine instead.

use super::Replica;
use super::local::Replicated;
use crate::plan::{CrossDevice, StrategyKind};

/// One replica on a CPU device.
pub fn new(replica: Replica) -> Replicated {
    Replicated::new(StrategyKind::OneDevice, vec![replica], CrossDevice::ReductionToOneDevice)
}

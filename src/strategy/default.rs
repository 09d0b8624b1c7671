//! `default`: no distribution, one replica in this process (`tf.distribute.get_strategy()`).

use super::Replica;
use super::local::Replicated;
use crate::plan::CrossDevice;
use crate::plan::StrategyKind;

/// The default strategy over one replica.
pub fn new(replica: Replica) -> Replicated {
    Replicated::new(StrategyKind::Default, vec![replica], CrossDevice::ReductionToOneDevice)
}

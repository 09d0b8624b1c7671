//! `one_device`: one replica placed on a named device (`OneDeviceStrategy`). On a CPU it is
//! the default strategy with an explicit placement.

use super::default::DefaultStrategy;
use super::{Replica, Step, Strategy, StrategyError, Variables};
use crate::data::Batch;
use crate::engine::{BatchStats, Optimizer};
use crate::plan::StrategyKind;
use crate::spec::{Device, DeviceKind};

/// One replica on one device.
pub struct OneDevice {
    inner: DefaultStrategy,
}

impl OneDevice {
    /// The strategy on `device`; only CPU devices exist in a build without CUDA.
    pub fn new(device: Device, replica: Replica) -> Result<Self, StrategyError> {
        match device.kind {
            DeviceKind::Cpu => Ok(Self { inner: DefaultStrategy::new(replica) }),
            DeviceKind::Gpu => Err(StrategyError::Unsupported(format!(
                "strategy.device = \"{device}\" needs a GPU build of trainrun (cargo build --release --features cuda); this one runs on CPUs only"
            ))),
        }
    }
}

impl Strategy for OneDevice {
    fn kind(&self) -> StrategyKind {
        StrategyKind::OneDevice
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError> {
        self.inner.compute_gradients(vars, micro, seed, stop)
    }

    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError> {
        self.inner.apply(vars, optimizer, lr)
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<BatchStats, StrategyError> {
        self.inner.evaluate(vars, batches)
    }
}

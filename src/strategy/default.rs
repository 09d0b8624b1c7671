//! `default`: no distribution, one replica in this process (`tf.distribute.get_strategy()`).

use super::{Replica, Step, Strategy, StrategyError, Variables};
use crate::data::Batch;
use crate::engine::{BatchStats, Optimizer};
use crate::plan::StrategyKind;

/// One replica, nothing to reduce.
pub struct DefaultStrategy {
    replica: Replica,
    grads: Vec<f32>,
}

impl DefaultStrategy {
    /// The strategy over `replica`.
    pub fn new(replica: Replica) -> Self {
        let grads = vec![0.0; replica.model().param_len()];
        Self { replica, grads }
    }
}

impl Strategy for DefaultStrategy {
    fn kind(&self) -> StrategyKind {
        StrategyKind::Default
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError> {
        let total: usize = micro.iter().map(|b| b.global_n).sum();
        let scale = 1.0 / total.max(1) as f32;
        let mut stats = BatchStats::default();
        for (i, batch) in micro.iter().enumerate() {
            let s = crate::engine::init::derive_seed(&[seed, i as u64]);
            stats.add(self.replica.forward_backward(vars, &mut self.grads, batch, scale, s, i > 0));
        }
        Ok(Step { stats, stop })
    }

    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError> {
        optimizer.step(&mut vars.params, &self.grads, lr);
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<BatchStats, StrategyError> {
        let mut stats = BatchStats::default();
        for b in batches {
            stats.add(self.replica.evaluate(vars, &b));
        }
        Ok(stats)
    }
}

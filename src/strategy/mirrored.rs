//! `mirrored`: TensorFlow's `MirroredStrategy`: one replica per local device in one process,
//! gradients summed by `cross_device_ops`, every replica then seeing the same update.

use super::local::LocalReplicas;
use super::{Replica, Strategy, StrategyError, Variables};
use crate::data::Batch;
use crate::engine::{BatchStats, Optimizer};
use crate::plan::StrategyKind;
use crate::spec::CrossDeviceOps;

/// Replicas in this process, reduced in place; also the engine of `central_storage`.
pub struct Replicated {
    local: LocalReplicas,
    grads: Vec<f32>,
    kind: StrategyKind,
}

impl Replicated {
    /// `replicas` of strategy `kind`, summed with `algorithm`.
    pub fn new(kind: StrategyKind, replicas: Vec<Replica>, algorithm: CrossDeviceOps) -> Self {
        let local = LocalReplicas::new(replicas, algorithm, 0);
        let grads = vec![0.0; local.param_len()];
        Self { local, grads, kind }
    }
}

/// The mirrored strategy over `replicas` (one per device), reduced with `algorithm`.
pub fn new(replicas: Vec<Replica>, algorithm: CrossDeviceOps) -> Replicated {
    Replicated::new(StrategyKind::Mirrored, replicas, algorithm)
}

impl Strategy for Replicated {
    fn kind(&self) -> StrategyKind {
        self.kind
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
    ) -> Result<BatchStats, StrategyError> {
        let scale = 1.0 / micro.iter().map(|b| b.global_n).sum::<usize>().max(1) as f32;
        self.local.gradients(vars, &mut self.grads, micro, scale, seed)
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
            stats.add(self.local.evaluate(vars, &b));
        }
        Ok(stats)
    }
}

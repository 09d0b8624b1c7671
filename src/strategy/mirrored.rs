//! `mirrored`: TensorFlow's `MirroredStrategy`: one replica per local device in one process,
//! gradients summed by `cross_device_ops`, every replica then seeing the same update.

use super::Replica;
use super::local::Replicated;
use crate::plan::CrossDevice;
use crate::plan::StrategyKind;

/// The mirrored strategy over `replicas` (one per device), reduced with `algorithm`.
pub fn new(replicas: Vec<Replica>, algorithm: CrossDevice) -> Replicated {
    Replicated::new(StrategyKind::Mirrored, replicas, algorithm)
}

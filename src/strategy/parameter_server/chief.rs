//! The chief's strategy under `parameter_server`: the coordinator computes no step (the
//! workers do, through `train::coordinate`), so its strategy is the one replica it evaluates
//! the pulled variables with, and the job it leaves at the end.

use crate::cluster::job::Job;
use crate::data::Batch;
use crate::engine::Optimizer;
use crate::metrics::Sums;
use crate::plan::{CrossDevice, StrategyKind};
use crate::strategy::local::Replicated;
use crate::strategy::{Replica, Step, Strategy, StrategyError, Variables};

/// The coordinator's replica and its place in the job.
pub struct Chief {
    local: Replicated,
    job: Option<Job>,
}

/// The chief of a parameter-server job over `replica`.
pub fn new(replica: Replica, job: Option<Job>) -> Chief {
    Chief {
        local: Replicated::new(StrategyKind::ParameterServer, vec![replica], CrossDevice::ReductionToOneDevice),
        job,
    }
}

fn scheduled() -> StrategyError {
    StrategyError::Unsupported(
        "under parameter_server the chief schedules steps on the workers (train::coordinate); it computes none".into(),
    )
}

impl Strategy for Chief {
    fn kind(&self) -> StrategyKind {
        StrategyKind::ParameterServer
    }

    fn compute_gradients(&mut self, _: &mut Variables, _: &[Batch], _: u64, _: bool) -> Result<Step, StrategyError> {
        Err(scheduled())
    }

    fn apply(&mut self, _: &mut Variables, _: &mut Optimizer, _: f32) -> Result<(), StrategyError> {
        Err(scheduled())
    }

    fn transport(&self) -> Option<&'static str> {
        Some("tcp")
    }

    /// The ps tasks and workers have been told to leave; the chief leaves the control plane
    /// last, waiting for their goodbyes.
    fn finish(&mut self) -> Result<(), StrategyError> {
        if let Some(job) = self.job.take() {
            job.plane.shutdown();
        }
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<Sums, StrategyError> {
        self.local.evaluate(vars, batches)
    }
}

//! Synchronous strategies in the training loop: each execution is one optimizer step whose
//! micro-batches (`batch.accumulation_steps` of them) come from this task's input, computed by
//! the strategy in lockstep with every other replica and task, then applied.

use super::{Executed, Execution, Input, Strategy, StrategyError, Synchronous, Variables};
use crate::data::Batch;
use crate::engine::Optimizer;
use crate::engine::init::{STEP_DOMAIN, derive_seed};
use crate::metrics::Sums;
use std::time::Instant;

/// A [`Synchronous`] strategy, stepping one optimizer step at a time.
pub struct Lockstep {
    inner: Box<dyn Synchronous>,
    /// Micro-batches per optimizer step.
    accumulation: usize,
    /// The step's micro-batches, between `execute` and `apply`.
    micro: Vec<Batch>,
}

impl Lockstep {
    /// Runs `inner` with `accumulation` micro-batches per optimizer step.
    pub fn new(inner: Box<dyn Synchronous>, accumulation: usize) -> Self {
        Self { inner, accumulation, micro: Vec::with_capacity(accumulation) }
    }
}

impl Strategy for Lockstep {
    fn execute(&mut self, cx: Execution<'_>) -> Result<Executed, StrategyError> {
        let waiting = Instant::now();
        for _ in 0..self.accumulation {
            self.micro.push(cx.input.next_batch().map_err(|e| StrategyError::Input(Box::new(e)))?);
        }
        let input_wait = waiting.elapsed();
        let seed = derive_seed(&[cx.seed, STEP_DOMAIN, cx.step]);
        let step = self.inner.compute_gradients(cx.vars, &self.micro, seed, cx.stop)?;
        Ok(Executed::Computed { step, input_wait })
    }

    fn apply(
        &mut self,
        vars: &mut Variables,
        optimizer: &mut Optimizer,
        input: &mut Input,
        lr: f32,
    ) -> Result<(), StrategyError> {
        self.inner.apply(vars, optimizer, lr)?;
        for b in self.micro.drain(..) {
            input.recycle(b);
        }
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut (dyn Iterator<Item = Batch> + Send),
    ) -> Result<Sums, StrategyError> {
        self.inner.evaluate(vars, batches)
    }

    fn broadcast(&mut self, data: &mut [f32]) -> Result<(), StrategyError> {
        self.inner.broadcast(data)
    }

    fn finish(&mut self) -> Result<(), StrategyError> {
        self.inner.finish()
    }

    fn transport(&self) -> Option<&'static str> {
        self.inner.transport()
    }

    fn stragglers(&self) -> Vec<crate::cluster::Straggler> {
        self.inner.stragglers()
    }
}

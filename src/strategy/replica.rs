//! One replica: a model copy that runs forward and backward on its share of a batch.

use super::Variables;
use crate::data::Batch;
use crate::engine::sequential::GradSink;
use crate::engine::{BatchStats, LossFn, Pass, Sequential};

/// A model copy with its loss.
pub struct Replica {
    model: Sequential,
    loss: LossFn,
    classes: usize,
    threads: usize,
}

impl Replica {
    /// A replica of `model` using `threads` threads.
    pub fn new(model: Sequential, loss: LossFn, classes: usize, threads: usize) -> Self {
        Self { model, loss, classes, threads }
    }

    /// The replica's model.
    pub fn model(&self) -> &Sequential {
        &self.model
    }

    /// Adds (or, unless `accumulate`, writes) the gradient of `batch` into `grads`, each
    /// example's loss weighted by `scale` (1 / examples in the whole step).
    pub fn forward_backward(
        &mut self,
        vars: &mut Variables,
        grads: &mut dyn GradSink,
        batch: &Batch,
        scale: f32,
        seed: u64,
        accumulate: bool,
    ) -> BatchStats {
        if batch.n == 0 {
            // A short global batch can leave this replica nothing: it adds no gradient.
            let len = self.model.param_len();
            if !accumulate {
                grads.slice(0..len).fill(0.0);
            }
            grads.ready(len);
            return BatchStats::default();
        }
        let pass = Pass { training: true, seed, accumulate, threads: self.threads };
        self.model.forward(pass, &vars.params, &mut vars.state, &batch.x, batch.n);
        let (out, dout) = self.model.output_and_grad(batch.n);
        let stats = self.loss.evaluate(out, &batch.y, self.classes, scale, Some(dout));
        self.model.backward(pass, &vars.params, grads, &batch.x, batch.n);
        stats
    }

    /// Loss and accuracy sums of `batch` in inference mode.
    pub fn evaluate(&mut self, vars: &mut Variables, batch: &Batch) -> BatchStats {
        if batch.n == 0 {
            return BatchStats::default();
        }
        let pass = Pass { training: false, seed: 0, accumulate: false, threads: self.threads };
        let out = self.model.forward(pass, &vars.params, &mut vars.state, &batch.x, batch.n);
        self.loss.evaluate(out, &batch.y, self.classes, 1.0, None)
    }
}

//! One replica: a model copy that runs forward and backward on its share of a batch.

use super::Variables;
use crate::data::Batch;
use crate::engine::meet::Meeting;
use crate::engine::sequential::GradSink;
use crate::engine::{LossFn, Optimizer, Pass, Sequential, Truth};
use crate::metrics::Sums;

/// A model copy with its loss.
pub struct Replica {
    model: Sequential,
    loss: LossFn,
    classes: usize,
    threads: usize,
    /// The last [`Replica::forward_loss`]'s pass and batch size, while its backward waits.
    pending: Option<(Pass, usize)>,
    /// That forward's input, which backward needs.
    input: Vec<f32>,
}

impl Replica {
    /// A replica of `model` using `threads` threads.
    pub fn new(model: Sequential, loss: LossFn, classes: usize, threads: usize) -> Self {
        Self { model, loss, classes, threads, pending: None, input: Vec::new() }
    }

    /// Forward and loss of `batch` (not empty), keeping its input and the loss gradient (each
    /// example weighted by `scale`) so that [`Replica::backward_update`] or
    /// [`Replica::backward_pending`] can finish the step later.
    pub fn forward_loss(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        batch: BatchView<'_>,
        scale: f32,
        seed: u64,
    ) -> Sums {
        let pass = Pass { training: true, seed, accumulate: false, threads: self.threads };
        self.model.forward(pass, params, state, batch.x, batch.n);
        let (out, dout) = self.model.output_and_grad(batch.n);
        let stats = self.loss.evaluate(out, batch.truth(), self.classes, scale, Some(dout));
        self.input.clear();
        self.input.extend_from_slice(batch.x);
        self.pending = Some((pass, batch.n));
        stats
    }

    /// Backward of the last [`Replica::forward_loss`] applying `optimizer` at `lr` to `params`
    /// layer by layer ([`Sequential::backward_update`]), so no gradient is stored; when the
    /// optimizer cannot fuse (Adam, Nesterov) or the model ties weights, through `grads` and one optimizer pass. Returns
    /// whether there was a forward to finish.
    pub fn backward_update(
        &mut self,
        params: &mut [f32],
        optimizer: &mut Optimizer,
        lr: f32,
        grads: &mut [f32],
    ) -> bool {
        let Some((pass, n)) = self.pending.take() else { return false };
        // Tied tensors are whole only after several layers' backward: never fuse them.
        let fused = if self.model.has_ties() { None } else { optimizer.fused(lr) };
        match fused {
            Some(mut step) => self.model.backward_update(pass, params, &mut step, &self.input, n),
            None => {
                self.model.backward(pass, params, &mut &mut *grads, &self.input, n);
                optimizer.step(params, grads, lr);
            }
        }
        true
    }

    /// Backward of the last [`Replica::forward_loss`] into `grads`, as
    /// [`Replica::forward_backward`] would have left them; `false` when none is pending.
    pub fn backward_pending(&mut self, params: &[f32], grads: &mut [f32]) -> bool {
        let Some((pass, n)) = self.pending.take() else { return false };
        self.model.backward(pass, params, &mut &mut *grads, &self.input, n);
        true
    }

    /// [`Replica::forward_loss`], then backward down to the model's meeting layer
    /// ([`Sequential::backward_above`]), the gradients of the layers after it into `grads`.
    /// [`Replica::meet`] and [`Replica::backward_rest`] finish the step.
    pub fn forward_above(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        batch: BatchView<'_>,
        scale: f32,
        seed: u64,
    ) -> Sums {
        let stats = self.forward_loss(params, state, batch, scale, seed);
        if let Some((pass, n)) = self.pending {
            self.model.backward_above(pass, params, grads, &self.input, n);
        }
        stats
    }

    /// Whether [`Replica::forward_above`] left this replica at its meeting layer.
    pub fn at_meeting(&self) -> bool {
        self.pending.is_some() && self.model.at_meeting()
    }

    /// The meeting layer's backward short of its kernel ([`Sequential::meet`]), the other
    /// tensors' gradients into `grads`; `None` unless [`Replica::at_meeting`].
    pub fn meet(&mut self, grads: &mut [f32]) -> Option<Meeting<'_>> {
        let (pass, n) = self.pending?;
        self.model.meet(pass, grads, &self.input, n)
    }

    /// Finishes the backward [`Replica::forward_above`] paused, through the layers left (the
    /// meeting layer's too unless [`Replica::meet`] ran), into `grads`; `false` when none was
    /// paused.
    pub fn backward_rest(&mut self, params: &[f32], grads: &mut [f32]) -> bool {
        let Some((pass, n)) = self.pending.take() else { return false };
        self.model.backward_rest(pass, params, grads, &self.input, n)
    }

    /// Threads this replica computes with.
    pub fn threads(&self) -> usize {
        self.threads
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
    ) -> Sums {
        let view = BatchView::of(batch);
        let micro = MicroStep { scale, seed, accumulate };
        self.forward_backward_view(&vars.params, &mut vars.state, grads, view, micro)
    }

    /// [`Replica::forward_backward`] on part of a batch, with the parameters read-only, so
    /// several replicas can share one copy of them.
    pub fn forward_backward_view(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut dyn GradSink,
        batch: BatchView<'_>,
        micro: MicroStep,
    ) -> Sums {
        let MicroStep { scale, seed, accumulate } = micro;
        self.pending = None;
        if batch.n == 0 {
            // A short global batch can leave this replica nothing: it adds no gradient.
            let len = self.model.param_len();
            if !accumulate {
                grads.slice(0..len).fill(0.0);
            }
            grads.ready(len);
            return Sums::default();
        }
        let pass = Pass { training: true, seed, accumulate, threads: self.threads };
        self.model.forward(pass, params, state, batch.x, batch.n);
        let (out, dout) = self.model.output_and_grad(batch.n);
        let stats = self.loss.evaluate(out, batch.truth(), self.classes, scale, Some(dout));
        self.model.backward(pass, params, grads, batch.x, batch.n);
        stats
    }

    /// Loss and accuracy sums of `batch` in inference mode.
    pub fn evaluate(&mut self, vars: &mut Variables, batch: &Batch) -> Sums {
        self.evaluate_view(&vars.params, &mut vars.state, BatchView::of(batch))
    }

    /// [`Replica::evaluate`] on part of a batch.
    pub fn evaluate_view(&mut self, params: &[f32], state: &mut [f32], batch: BatchView<'_>) -> Sums {
        // Forward overwrites the activations a pending backward would need.
        self.pending = None;
        if batch.n == 0 {
            return Sums::default();
        }
        let pass = Pass { training: false, seed: 0, accumulate: false, threads: self.threads };
        let out = self.model.forward(pass, params, state, batch.x, batch.n);
        self.loss.evaluate(out, batch.truth(), self.classes, 1.0, None)
    }
}

/// How one micro-batch's gradient joins its step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MicroStep {
    /// Each example's loss weight: 1 / examples in the whole step.
    pub scale: f32,
    /// The seed of the micro-batch's randomness (dropout masks).
    pub seed: u64,
    /// Add to the gradient of the micro-batches before it instead of overwriting it.
    pub accumulate: bool,
}

/// Part of a batch: `n` examples' features and labels.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    /// Features, one example after the other.
    pub x: &'a [f32],
    /// Class labels: one per example, or one per position (empty for float targets).
    pub y: &'a [u32],
    /// Float targets (empty for class labels).
    pub targets: &'a [f32],
    /// Examples.
    pub n: usize,
}

impl<'a> BatchView<'a> {
    /// All of `batch`.
    pub fn of(batch: &'a Batch) -> Self {
        BatchView { x: &batch.x, y: &batch.y, targets: &batch.targets, n: batch.n }
    }

    /// What the loss compares the outputs with.
    pub fn truth(&self) -> Truth<'a> {
        if self.targets.is_empty() { Truth::Classes(self.y) } else { Truth::Targets(self.targets) }
    }

    /// Part `part` of `batch` cut into `parts` contiguous views, the first ones one example
    /// longer (and the last ones empty when the batch is smaller than `parts`).
    pub fn part(batch: &'a Batch, part: usize, parts: usize) -> BatchView<'a> {
        let per_example = |len: usize| len.checked_div(batch.n).unwrap_or(0);
        let (per, labels, targets) =
            (per_example(batch.x.len()), per_example(batch.y.len()), per_example(batch.targets.len()));
        let parts = parts.max(1);
        let (base, extra) = (batch.n / parts, batch.n % parts);
        let start = part * base + part.min(extra);
        let len = if part < parts { base + usize::from(part < extra) } else { 0 };
        BatchView {
            x: &batch.x[start * per..(start + len) * per],
            y: &batch.y[start * labels..(start + len) * labels],
            targets: &batch.targets[start * targets..(start + len) * targets],
            n: len,
        }
    }
}

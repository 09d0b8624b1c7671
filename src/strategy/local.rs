//! Several replicas in one process (one for `default` and `one_device`): each takes a contiguous share of every batch and runs
//! forward and backward on its own thread with its own activations and gradient buffer; the
//! buffers are then summed by a cross-device algorithm. On CPU devices the replicas read one
//! shared copy of the variables (TensorFlow's mirrored copies would be bit-identical
//! duplicates) and batch-norm statistics are averaged over replicas after each step.

use super::cross_device;
use super::replica::{BatchView, MicroStep};
use super::{Replica, Step, StrategyError, Synchronous, Variables};
use crate::data::Batch;
use crate::engine::Optimizer;
use crate::engine::init::derive_seed;
use crate::engine::meet::{Meeting, update_kernel};
use crate::engine::optimizer::FusedStep;
use crate::metrics::Sums;
use crate::plan::CrossDevice;
use crate::plan::StrategyKind;

/// The replicas of this process.
pub struct LocalReplicas {
    replicas: Vec<Replica>,
    /// Gradients of replicas 1.. (replica 0 writes into the caller's buffer).
    grads: Vec<Vec<f32>>,
    /// Batch-norm state of replicas 1.. (replica 0 uses the variables' own).
    states: Vec<Vec<f32>>,
    algorithm: CrossDevice,
    /// This process's first replica among all replicas of the job, to seed dropout apart.
    first_replica: u64,
    /// The meeting layer's per-block gradient products ([`update_kernel`]).
    meet_scratch: Vec<f32>,
}

impl LocalReplicas {
    /// `replicas` summed with `algorithm`; `first_replica` numbers them within the job.
    pub fn new(replicas: Vec<Replica>, algorithm: CrossDevice, first_replica: u64) -> Self {
        let len = replicas.first().map_or(0, |r| r.model().param_len());
        let extra = replicas.len().saturating_sub(1);
        let (grads, states) = (vec![vec![0.0; len]; extra], vec![Vec::new(); extra]);
        Self { replicas, grads, states, algorithm, first_replica, meet_scratch: Vec::new() }
    }

    /// Trainable values of one replica's model.
    pub fn param_len(&self) -> usize {
        self.replicas.first().map_or(0, |r| r.model().param_len())
    }

    /// Forward and backward over `micro`, each batch split across the replicas, leaving the
    /// sum of their gradients (each example weighted by `scale`) in `primary`.
    pub fn gradients(
        &mut self,
        vars: &mut Variables,
        primary: &mut [f32],
        micro: &[Batch],
        scale: f32,
        seed: u64,
    ) -> Result<Sums, StrategyError> {
        let stats = self.gradients_unreduced(vars, primary, micro, scale, seed);
        let mut buffers: Vec<&mut [f32]> =
            std::iter::once(primary).chain(self.grads.iter_mut().map(|g| g.as_mut_slice())).collect();
        cross_device::reduce(self.algorithm, &mut buffers)?;
        Ok(stats)
    }

    /// [`LocalReplicas::gradients`] leaving each replica's gradient in its own buffer
    /// (`primary`, then `self.grads`) for the update to sum.
    fn gradients_unreduced(
        &mut self,
        vars: &mut Variables,
        primary: &mut [f32],
        micro: &[Batch],
        scale: f32,
        seed: u64,
    ) -> Sums {
        let parts = self.replicas.len();
        let first = self.first_replica;
        for s in &mut self.states {
            s.clone_from(&vars.state);
        }
        let params = &vars.params;
        let results = self.each(primary, &mut vars.state, |r, replica, grads, state| {
            let mut stats = Sums::default();
            let mut grads = grads;
            for (i, batch) in micro.iter().enumerate() {
                let s = derive_seed(&[seed, i as u64, first + r as u64]);
                let view = BatchView::part(batch, r, parts);
                let micro = MicroStep { scale, seed: s, accumulate: i > 0 };
                stats.add(replica.forward_backward_view(params, state, &mut grads, view, micro));
            }
            stats
        });
        self.average_states(&mut vars.state);
        let mut total = Sums::default();
        results.into_iter().for_each(|s| total.add(s));
        total
    }

    /// Runs `work(r, replica, its gradient buffer, its state)` for every replica, each on its
    /// own thread (replica 0 on this one, with `primary` and `state`), and returns the results
    /// in replica order.
    fn each<T: Default + Clone + Send>(
        &mut self,
        primary: &mut [f32],
        state: &mut [f32],
        work: impl Fn(usize, &mut Replica, &mut [f32], &mut [f32]) -> T + Sync,
    ) -> Vec<T> {
        let Some((lead, rest)) = self.replicas.split_first_mut() else { return Vec::new() };
        let mut results = vec![T::default(); rest.len() + 1];
        let (lead_out, rest_out) = results.split_at_mut(1);
        let work = &work;
        rayon::scope(|scope| {
            for (((r, replica), (grads, state)), out) in rest
                .iter_mut()
                .enumerate()
                .zip(self.grads.iter_mut().zip(self.states.iter_mut()))
                .zip(rest_out.iter_mut())
            {
                scope.spawn(move |_| *out = work(r + 1, replica, grads, state));
            }
            lead_out[0] = work(0, lead, primary, state);
        });
        results
    }

    /// Every replica saw different examples: keeps the mean of their batch-norm statistics.
    fn average_states(&mut self, state: &mut [f32]) {
        if !self.states.is_empty() && !state.is_empty() {
            let n = self.replicas.len() as f32;
            for (i, v) in state.iter_mut().enumerate() {
                *v = self.states.iter().fold(*v, |acc, s| acc + s[i]) / n;
            }
        }
    }

    /// Whether every replica can run `batch` meeting the others inside backward
    /// ([`LocalReplicas::forward_above`]): a model with a meeting layer and no tied weights,
    /// and examples for every replica.
    fn can_meet(&self, batch: &Batch) -> bool {
        batch.n >= self.replicas.len() && self.replicas.iter().all(|r| r.model().meeting_kernel().is_some())
    }

    /// Forward over `batch` split across the replicas, and backward down to the meeting layer
    /// ([`Replica::forward_above`]), each replica's gradients of the layers after it into its
    /// own buffer (`primary`, then `self.grads`).
    fn forward_above(
        &mut self,
        vars: &mut Variables,
        primary: &mut [f32],
        batch: &Batch,
        scale: f32,
        seed: u64,
    ) -> Sums {
        let (parts, first) = (self.replicas.len(), self.first_replica);
        for s in &mut self.states {
            s.clone_from(&vars.state);
        }
        let params = &vars.params;
        let results = self.each(primary, &mut vars.state, |r, replica, grads, state| {
            let s = derive_seed(&[seed, 0, first + r as u64]);
            replica.forward_above(params, state, grads, BatchView::part(batch, r, parts), scale, s)
        });
        self.average_states(&mut vars.state);
        let mut total = Sums::default();
        results.into_iter().for_each(|s| total.add(s));
        total
    }

    /// `optimizer`'s update from the sum of the replicas' buffers (`primary`, then
    /// `self.grads`), added in the update pass.
    fn step_sum(&self, params: &mut [f32], primary: &[f32], optimizer: &mut Optimizer, lr: f32) {
        let all: Vec<&[f32]> = std::iter::once(primary).chain(self.grads.iter().map(Vec::as_slice)).collect();
        optimizer.step_sum(params, &all, lr);
    }

    /// Whether every replica waits at the meeting layer.
    fn at_meeting(&self) -> bool {
        self.replicas.iter().all(Replica::at_meeting)
    }

    /// Finishes the backward [`LocalReplicas::forward_above`] paused without meeting, each
    /// replica's gradient into its own buffer.
    fn backward_rest(&mut self, params: &[f32], primary: &mut [f32]) {
        self.each(primary, &mut [], |_, replica, grads, _| {
            replica.backward_rest(params, grads);
        });
    }

    /// Finishes the step [`LocalReplicas::forward_above`] began, all replicas at the meeting
    /// layer (see [`LocalReplicas::at_meeting`]): its kernel takes `step` from the sum of their
    /// products ([`update_kernel`]), then each replica's backward goes on below it, and the
    /// other tensors take `step` from the sum of the replicas' buffers, in replica order.
    fn finish_met(&mut self, params: &mut [f32], step: &mut FusedStep<'_>, primary: &mut [f32]) {
        let Some(kernel) = self.replicas.first().and_then(|r| r.model().meeting_kernel()) else { return };
        let (parts, replicas) = (self.replicas.iter().map(Replica::threads).sum(), self.replicas.len());
        let buffers = std::iter::once(&mut *primary).chain(self.grads.iter_mut().map(Vec::as_mut_slice));
        let mut meetings: Vec<Meeting<'_>> =
            self.replicas.iter_mut().zip(buffers).filter_map(|(r, g)| r.meet(g)).collect();
        debug_assert_eq!(meetings.len(), replicas, "a replica was not at the meeting layer");
        update_kernel(
            &mut params[kernel.clone()],
            &mut step.slice(kernel.clone()),
            &mut meetings,
            parts,
            &mut self.meet_scratch,
        );
        drop(meetings);
        self.backward_rest(params, primary);
        let all: Vec<&[f32]> = std::iter::once(&*primary).chain(self.grads.iter().map(Vec::as_slice)).collect();
        for r in [0..kernel.start, kernel.end..params.len()] {
            let grads: Vec<&[f32]> = all.iter().map(|g| &g[r.clone()]).collect();
            step.slice(r.clone()).apply_sum(&mut params[r], &grads);
        }
    }

    /// Loss and accuracy sums over `batch`, split across the replicas.
    pub fn evaluate(&mut self, vars: &mut Variables, batch: &Batch) -> Sums {
        let parts = self.replicas.len();
        for s in &mut self.states {
            s.clone_from(&vars.state);
        }
        let params = &vars.params;
        let results = self.each(&mut [], &mut vars.state, |r, replica, _, state| {
            replica.evaluate_view(params, state, BatchView::part(batch, r, parts))
        });
        let mut total = Sums::default();
        results.into_iter().for_each(|s| total.add(s));
        total
    }
}

/// The in-process strategies (`default`, `one_device`, `mirrored`, `central_storage`):
/// replicas in this process, their gradients reduced in place, one update.
pub struct Replicated {
    local: LocalReplicas,
    grads: Vec<f32>,
    kind: StrategyKind,
    /// Work `compute_gradients` left for `apply` to fuse into the update.
    deferred: Deferred,
}

/// What [`Replicated::apply`] still has to do before (or while) updating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deferred {
    /// Nothing: the gradient is in `grads`.
    Nothing,
    /// One replica, one micro-batch: forward is done; backward runs with the update fused in.
    Backward,
    /// Several replicas: their gradients are summed inside the optimizer pass.
    Sum,
    /// Several replicas paused backward at the meeting layer: they finish it together with
    /// the update ([`LocalReplicas::finish_met`]).
    Meet,
}

impl Replicated {
    /// `replicas` of strategy `kind`, summed with `algorithm`.
    pub fn new(kind: StrategyKind, replicas: Vec<Replica>, algorithm: CrossDevice) -> Self {
        let local = LocalReplicas::new(replicas, algorithm, 0);
        let grads = vec![0.0; local.param_len()];
        Self { local, grads, kind, deferred: Deferred::Nothing }
    }

    /// Runs a backward `compute_gradients` deferred, so the gradients are in the buffers.
    fn materialize(&mut self, vars: &Variables) {
        match self.deferred {
            Deferred::Backward => {
                self.local.replicas[0].backward_pending(&vars.params, &mut self.grads);
                self.deferred = Deferred::Nothing;
            }
            Deferred::Meet => {
                self.local.backward_rest(&vars.params, &mut self.grads);
                self.deferred = Deferred::Sum;
            }
            Deferred::Nothing | Deferred::Sum => {}
        }
    }
}

impl Synchronous for Replicated {
    fn kind(&self) -> StrategyKind {
        self.kind
    }

    fn compute_gradients(
        &mut self,
        vars: &mut Variables,
        micro: &[Batch],
        seed: u64,
        stop: bool,
    ) -> Result<Step, StrategyError> {
        let scale = 1.0 / micro.iter().map(Batch::global_rows).sum::<usize>().max(1) as f32;
        let local = &mut self.local;
        let meet = local.algorithm == CrossDevice::ReductionToOneDevice && matches!(micro, [b] if local.can_meet(b));
        let (stats, deferred) = match (&mut local.replicas[..], micro) {
            // Nothing else reads this gradient: backward waits for the update to fuse into it.
            ([one], [batch]) if batch.n > 0 => {
                let view = BatchView::of(batch);
                let s = derive_seed(&[seed, 0, local.first_replica]);
                (one.forward_loss(&vars.params, &mut vars.state, view, scale, s), Deferred::Backward)
            }
            // The replicas can meet inside backward and sum in reduction_to_one_device's order.
            ([_, _, ..], [batch]) if meet => {
                (local.forward_above(vars, &mut self.grads, batch, scale, seed), Deferred::Meet)
            }
            // The sum in reduction_to_one_device's order can happen in the update pass.
            ([_, _, ..], _) if local.algorithm == CrossDevice::ReductionToOneDevice => {
                (local.gradients_unreduced(vars, &mut self.grads, micro, scale, seed), Deferred::Sum)
            }
            _ => (local.gradients(vars, &mut self.grads, micro, scale, seed)?, Deferred::Nothing),
        };
        self.deferred = deferred;
        Ok(Step { stats, stop })
    }

    fn apply(&mut self, vars: &mut Variables, optimizer: &mut Optimizer, lr: f32) -> Result<(), StrategyError> {
        let (params, grads) = (&mut vars.params, &mut self.grads);
        match std::mem::replace(&mut self.deferred, Deferred::Nothing) {
            Deferred::Backward => {
                // Always pending here: only this strategy runs the replica, and `evaluate`
                // materializes the gradient (clearing `deferred`) before its forward passes.
                let pending = self.local.replicas[0].backward_update(params, optimizer, lr, grads);
                debug_assert!(pending, "a deferred backward had no forward to finish");
            }
            // Only SGD without Nesterov or clipping updates inside backward.
            Deferred::Meet => match if self.local.at_meeting() { optimizer.fused(lr) } else { None } {
                Some(mut step) => self.local.finish_met(params, &mut step, grads),
                None => {
                    self.local.backward_rest(params, grads);
                    self.local.step_sum(params, grads, optimizer, lr);
                }
            },
            Deferred::Sum => self.local.step_sum(params, grads, optimizer, lr),
            Deferred::Nothing => optimizer.step(params, grads, lr),
        }
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<Sums, StrategyError> {
        self.materialize(vars);
        let mut stats = Sums::default();
        for b in batches {
            stats.add(self.local.evaluate(vars, &b));
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LossFn;
    use crate::engine::optimizer::Sgd;
    use crate::vocab::LossKind;

    /// The tutorial model's shape, small, with a 576 × 128 dense layer to meet at.
    fn replica() -> Replica {
        let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
        Replica::new(crate::engine::sequential::tests::small_tutorial(14, 128), loss, 5, 1)
    }

    /// Two steps of two mirrored replicas, with or without an evaluation between each
    /// `compute_gradients` and `apply`: the evaluation first finishes the backward the
    /// replicas paused at the meeting layer, and the update then sums their stored gradients,
    /// which are the bits the replicas meeting give.
    #[test]
    fn an_evaluation_between_compute_and_apply_keeps_the_step() {
        let x = (0..128 * 196).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let y = (0..128).map(|i| (i * 7 % 5) as u32).collect();
        let batch = Batch { x, y, targets: vec![], n: 128, global_n: 128, rows_per_example: 1 };
        let run = |evaluate: bool, momentum: f32| {
            let mut s =
                Replicated::new(StrategyKind::Mirrored, vec![replica(), replica()], CrossDevice::ReductionToOneDevice);
            let (params, state) = s.local.replicas[0].model().init(3);
            let mut vars = Variables { params, state };
            let mut opt = Optimizer::Sgd(Sgd::new(vars.params.len(), momentum, false, 0.0));
            for step in 0..2 {
                s.compute_gradients(&mut vars, std::slice::from_ref(&batch), step, false).unwrap();
                assert_eq!(s.deferred, Deferred::Meet);
                if evaluate {
                    s.evaluate(&mut vars, &mut std::iter::once(batch.clone())).unwrap();
                    assert_eq!(s.deferred, Deferred::Sum);
                }
                s.apply(&mut vars, &mut opt, 0.05).unwrap();
            }
            vars.params
        };
        for momentum in [0.0, 0.9] {
            let met = run(false, momentum);
            assert!(met == run(true, momentum), "momentum {momentum}: meeting changed the bits");
            assert!(met != replica().model().init(3).0, "the steps moved the weights");
        }
    }
}

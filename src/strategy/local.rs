//! Several replicas in one process (one for `default` and `one_device`): each takes a contiguous share of every batch and runs
//! forward and backward on its own thread with its own activations and gradient buffer; the
//! buffers are then summed by a cross-device algorithm. On CPU devices the replicas read one
//! shared copy of the variables (TensorFlow's mirrored copies would be bit-identical
//! duplicates) and batch-norm statistics are averaged over replicas after each step.

use super::cross_device;
use super::replica::BatchView;
use super::{Replica, Step, Strategy, StrategyError, Variables};
use crate::data::Batch;
use crate::engine::init::derive_seed;
use crate::engine::{BatchStats, Optimizer};
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
}

impl LocalReplicas {
    /// `replicas` summed with `algorithm`; `first_replica` numbers them within the job.
    pub fn new(replicas: Vec<Replica>, algorithm: CrossDevice, first_replica: u64) -> Self {
        let len = replicas.first().map_or(0, |r| r.model().param_len());
        let extra = replicas.len().saturating_sub(1);
        Self { replicas, grads: vec![vec![0.0; len]; extra], states: vec![Vec::new(); extra], algorithm, first_replica }
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
    ) -> Result<BatchStats, StrategyError> {
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
    ) -> BatchStats {
        let parts = self.replicas.len();
        let first = self.first_replica;
        for s in &mut self.states {
            s.clone_from(&vars.state);
        }
        let params = &vars.params;
        let work = |r: usize, replica: &mut Replica, grads: &mut [f32], state: &mut [f32]| -> BatchStats {
            let mut stats = BatchStats::default();
            let mut grads = grads;
            for (i, batch) in micro.iter().enumerate() {
                let s = derive_seed(&[seed, i as u64, first + r as u64]);
                let view = BatchView::part(batch, r, parts);
                stats.add(replica.forward_backward_view(params, state, &mut grads, view, scale, s, i > 0));
            }
            stats
        };
        let Some((lead, rest)) = self.replicas.split_first_mut() else { return BatchStats::default() };
        let mut results = vec![BatchStats::default(); parts];
        let (lead_stats, rest_stats) = results.split_at_mut(1);
        rayon::scope(|scope| {
            for (((r, replica), (grads, state)), out) in rest
                .iter_mut()
                .enumerate()
                .zip(self.grads.iter_mut().zip(self.states.iter_mut()))
                .zip(rest_stats.iter_mut())
            {
                let work = &work;
                scope.spawn(move |_| *out = work(r + 1, replica, grads, state));
            }
            lead_stats[0] = work(0, lead, primary, &mut vars.state);
        });
        if !self.states.is_empty() && !vars.state.is_empty() {
            // Every replica saw different examples: keep the mean of their statistics.
            let n = parts as f32;
            for (i, v) in vars.state.iter_mut().enumerate() {
                *v = self.states.iter().fold(*v, |acc, s| acc + s[i]) / n;
            }
        }
        let mut total = BatchStats::default();
        results.into_iter().for_each(|s| total.add(s));
        total
    }

    /// Loss and accuracy sums over `batch`, split across the replicas.
    pub fn evaluate(&mut self, vars: &mut Variables, batch: &Batch) -> BatchStats {
        let parts = self.replicas.len();
        for s in &mut self.states {
            s.clone_from(&vars.state);
        }
        let params = &vars.params;
        let Some((lead, rest)) = self.replicas.split_first_mut() else { return BatchStats::default() };
        let mut results = vec![BatchStats::default(); parts];
        let (lead_stats, rest_stats) = results.split_at_mut(1);
        rayon::scope(|scope| {
            for (((r, replica), state), out) in
                rest.iter_mut().enumerate().zip(self.states.iter_mut()).zip(rest_stats.iter_mut())
            {
                scope.spawn(move |_| *out = replica.evaluate_view(params, state, BatchView::part(batch, r + 1, parts)));
            }
            lead_stats[0] = lead.evaluate_view(params, &mut vars.state, BatchView::part(batch, 0, parts));
        });
        let mut total = BatchStats::default();
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
}

impl Replicated {
    /// `replicas` of strategy `kind`, summed with `algorithm`.
    pub fn new(kind: StrategyKind, replicas: Vec<Replica>, algorithm: CrossDevice) -> Self {
        let local = LocalReplicas::new(replicas, algorithm, 0);
        let grads = vec![0.0; local.param_len()];
        Self { local, grads, kind, deferred: Deferred::Nothing }
    }

    /// Runs a backward `compute_gradients` deferred, so the gradient is in `grads`.
    fn materialize(&mut self, vars: &Variables) {
        if self.deferred == Deferred::Backward {
            self.local.replicas[0].backward_pending(&vars.params, &mut self.grads);
            self.deferred = Deferred::Nothing;
        }
    }
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
        stop: bool,
    ) -> Result<Step, StrategyError> {
        let scale = 1.0 / micro.iter().map(Batch::global_rows).sum::<usize>().max(1) as f32;
        let local = &mut self.local;
        let (stats, deferred) = match (&mut local.replicas[..], micro) {
            // Nothing else reads this gradient: backward waits for the update to fuse into it.
            ([one], [batch]) if batch.n > 0 => {
                let view = BatchView::of(batch);
                let s = derive_seed(&[seed, 0, local.first_replica]);
                (one.forward_loss(&vars.params, &mut vars.state, view, scale, s), Deferred::Backward)
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
            Deferred::Sum => {
                let all: Vec<&[f32]> =
                    std::iter::once(grads.as_slice()).chain(self.local.grads.iter().map(Vec::as_slice)).collect();
                optimizer.step_sum(params, &all, lr);
            }
            Deferred::Nothing => optimizer.step(params, grads, lr),
        }
        Ok(())
    }

    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<BatchStats, StrategyError> {
        self.materialize(vars);
        let mut stats = BatchStats::default();
        for b in batches {
            stats.add(self.local.evaluate(vars, &b));
        }
        Ok(stats)
    }
}

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
        let Some((lead, rest)) = self.replicas.split_first_mut() else { return Ok(BatchStats::default()) };
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
        let mut buffers: Vec<&mut [f32]> =
            std::iter::once(primary).chain(self.grads.iter_mut().map(|g| g.as_mut_slice())).collect();
        cross_device::reduce(self.algorithm, &mut buffers)?;
        let mut total = BatchStats::default();
        results.into_iter().for_each(|s| total.add(s));
        Ok(total)
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
}

impl Replicated {
    /// `replicas` of strategy `kind`, summed with `algorithm`.
    pub fn new(kind: StrategyKind, replicas: Vec<Replica>, algorithm: CrossDevice) -> Self {
        let local = LocalReplicas::new(replicas, algorithm, 0);
        let grads = vec![0.0; local.param_len()];
        Self { local, grads, kind }
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
        let scale = 1.0 / micro.iter().map(|b| b.global_n).sum::<usize>().max(1) as f32;
        let stats = self.local.gradients(vars, &mut self.grads, micro, scale, seed)?;
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
            stats.add(self.local.evaluate(vars, &b));
        }
        Ok(stats)
    }
}

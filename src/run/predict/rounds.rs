//! Sharded prediction, as `model.predict` under a strategy: the batches are dealt to the
//! replicas, round by round. A round is one batch per replica of every worker (`mirrored`'s
//! replicas are model copies on this process's threads; `multi_worker_mirrored`'s workers are
//! processes joined over the job's sockets): batch `round × per_round + slot`, where a
//! worker's replicas own consecutive slots. Each replica predicts whole batches of the size
//! one process uses, so no row's arithmetic depends on the strategy; the round's outputs are
//! gathered by one all-reduce of a buffer in which every slot a worker did not fill holds
//! −0.0, the sum's neutral element (`x + −0.0 = x` for every float, −0.0 included), so the
//! chief receives every worker's bits unchanged and writes them in input order.

use crate::collective::Communicator;
use crate::data::{DataError, Split};
use crate::engine::{Pass, Sequential};
use crate::exit::RunError;
use crate::strategy::StrategyError;
use std::ops::Range;

/// Who predicts which batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sharding {
    /// Model copies in this process, each predicting whole batches on its own thread
    /// ([`copies`]).
    pub copies: usize,
    /// Processes predicting together.
    pub workers: usize,
    /// This process's place among them.
    pub rank: usize,
}

impl Sharding {
    /// Batches predicted per round, by every replica of every worker.
    pub fn per_round(self) -> usize {
        self.copies * self.workers
    }

    /// This worker's slots of a round.
    pub fn mine(self) -> Range<usize> {
        self.rank * self.copies..(self.rank + 1) * self.copies
    }
}

/// Model copies a process that predicts alone uses, for `replicas` replicas on `threads`
/// threads: one per thread, each predicting whole batches on that thread, but no more than
/// `fit` (the copies whose activations fit in memory, [`fit`]), and at least one per
/// replica. (A worker of `multi_worker_mirrored` keeps one per replica: every worker must
/// deal the same rounds, and workers on other hosts may have other thread counts.)
///
/// Why not every thread on each batch: a batch's layers hand work between threads several
/// times (the convolution's parts, the dense product's blocks), and on a VM a sleeping thread
/// takes tens of µs to wake, while a thread with its own batch never waits. Measured on the
/// tutorial model (2 threads, the spec's own weights): 27,300 → 32,900–35,300 examples/s at
/// batch 64 and 20,600–21,800 → 28,200–29,400 at 32 (medians of 8 passes, two sittings).
/// Each batch's rows are the same bits either way: no layer's arithmetic depends on the
/// thread count.
pub(crate) fn copies(replicas: usize, threads: usize, fit: usize) -> usize {
    threads.min(fit).max(replicas).max(1)
}

/// The model copies a process predicting alone under `plan` uses on this machine (`env` may
/// set `TRAINRUN_MEMORY_LIMIT`).
pub(crate) fn copies_alone(plan: &crate::plan::Plan, env: &[(String, String)]) -> usize {
    let machine = crate::machine_memory::read(env).map_or(crate::plan::ADDRESS_SPACE, |m| m.bytes);
    let replicas = plan.strategy.devices.len().max(1);
    copies(replicas, plan.threads, fit(plan.memory.as_ref().map(|m| m.activations), machine))
}

/// How many model copies' activations fit in a quarter of the memory the machine gives
/// (`machine`, bytes), from the plan's estimate of a batch's `activations` (bytes), which
/// counts each value twice (kept for backward, and its gradient) where predicting keeps it
/// once. Without this bound the copies of a large model on a machine of many cores (a GPT on
/// 64 threads) would need tens of gigabytes that one copy per replica does not. No estimate:
/// no bound.
pub(crate) fn fit(activations: Option<u64>, machine: u64) -> usize {
    let Some(activations) = activations else { return usize::MAX };
    usize::try_from(machine / 4 / (activations / 2).max(1)).unwrap_or(usize::MAX)
}

/// One model copy and its own buffers.
pub(crate) struct ModelCopy {
    pub model: Sequential,
    pub state: Vec<f32>,
}

/// What every round reads.
pub(crate) struct Rounds<'a> {
    pub split: &'a Split,
    /// Examples per batch.
    pub batch: usize,
    /// Outputs per example.
    pub width: usize,
    pub params: &'a [f32],
    pub sharding: Sharding,
    /// Threads each replica's forward pass may use.
    pub threads: usize,
}

impl Rounds<'_> {
    /// Batches over the whole split.
    pub fn batches(&self) -> usize {
        self.split.len().div_ceil(self.batch)
    }

    /// Rounds over the whole split; the same on every worker.
    pub fn count(&self) -> usize {
        self.batches().div_ceil(self.sharding.per_round())
    }

    /// Values of one slot of the round's buffer.
    pub fn slot_len(&self) -> usize {
        self.batch * self.width
    }

    /// The examples of batch `b`.
    fn rows(&self, b: usize) -> Range<usize> {
        (b * self.batch).min(self.split.len())..((b + 1) * self.batch).min(self.split.len())
    }

    /// Predicts round `r`'s batches of this worker's replicas into `buffer` (every other slot
    /// −0.0), then gathers every worker's into it over `comm`. Returns each batch of the round,
    /// in order, as its examples' outputs.
    pub(crate) fn run<'b>(
        &self,
        r: usize,
        replicas: &mut [ModelCopy],
        buffer: &'b mut [f32],
        comm: Option<&mut (dyn Communicator + '_)>,
    ) -> Result<Vec<(&'b [f32], usize)>, RunError> {
        buffer.fill(-0.0);
        let slot = self.slot_len();
        let first = r * self.sharding.per_round();
        let mine = self.sharding.mine();
        let mut slots = buffer[mine.start * slot..mine.end * slot].chunks_exact_mut(slot);
        let pass = Pass { training: false, seed: 0, accumulate: false, threads: self.threads };
        let predict = |k: usize, out: &mut [f32], replica: &mut ModelCopy| -> Result<(), DataError> {
            let rows = self.rows(first + mine.start + k);
            if rows.is_empty() {
                return Ok(());
            }
            let b = self.split.read(rows)?;
            let y = replica.model.forward(pass, self.params, &mut replica.state, &b.x, b.n);
            out[..b.n * self.width].copy_from_slice(&y[..b.n * self.width]);
            Ok(())
        };
        let mut results: Vec<Result<(), DataError>> = replicas.iter().map(|_| Ok(())).collect();
        if let [replica] = replicas {
            // One replica predicts on this thread, with every thread of the pool it runs in.
            results[0] = slots.next().map_or(Ok(()), |out| predict(0, out, replica));
        } else {
            rayon::scope(|s| {
                for (k, ((out, replica), result)) in slots.zip(replicas.iter_mut()).zip(&mut results).enumerate() {
                    let predict = &predict;
                    s.spawn(move |_| *result = predict(k, out, replica));
                }
            });
        }
        results.into_iter().collect::<Result<(), DataError>>()?;
        if let Some(comm) = comm {
            comm.all_reduce_sum(buffer).map_err(|e| RunError::from(StrategyError::Collective(e)))?;
        }
        let per_round = self.sharding.per_round();
        let buffer: &'b [f32] = buffer;
        Ok(buffer
            .chunks_exact(slot)
            .take(per_round)
            .enumerate()
            .map(|(k, out)| (out, self.rows(first + k).len()))
            .take_while(|(_, n)| *n > 0)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_zero_is_the_neutral_element_of_the_gather() {
        for v in [-0.0f32, 0.0, 1.5, -3.25, f32::MIN_POSITIVE, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!((v + -0.0).to_bits(), v.to_bits(), "{v}");
            assert_eq!((-0.0 + v).to_bits(), v.to_bits(), "{v}");
        }
    }

    #[test]
    fn a_process_alone_predicts_with_a_copy_per_thread_and_at_least_one_per_replica() {
        assert_eq!(
            [copies(1, 1, 9), copies(1, 2, 9), copies(1, 3, 9), copies(2, 2, 9), copies(2, 1, 9), copies(1, 0, 9)],
            [1, 2, 3, 2, 2, 1]
        );
        // As many as fit, and still one per replica when fewer fit.
        assert_eq!([copies(1, 64, 3), copies(1, 64, 0), copies(2, 64, 1)], [3, 1, 2]);
        // A batch's activations of 1 GiB (2 GiB as the estimate counts them) on 16 GiB: 4 fit.
        let gib = 1u64 << 30;
        assert_eq!(
            [fit(Some(2 * gib), 16 * gib), fit(Some(2 * gib), gib), fit(None, gib), fit(Some(0), 8)],
            [4, 0, usize::MAX, 2]
        );
    }

    #[test]
    fn a_round_deals_consecutive_slots_to_each_workers_replicas() {
        let s = Sharding { copies: 2, workers: 3, rank: 1 };
        assert_eq!((s.per_round(), s.mine()), (6, 2..4));
    }
}

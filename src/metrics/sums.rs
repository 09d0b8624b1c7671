//! [`Sums`]: what a span of batches (a micro-batch, a step across replicas and workers, a
//! parameter-server closure, an epoch, an evaluation) leaves for the metrics to read, one slot
//! per sum, in the order of [`super::SLOTS`].
//!
//! Counts (examples, correct predictions) are f64 like the other sums. An f64 holds every
//! integer up to 2^53 exactly (9·10^15 examples: 285 years at a million a second), and
//! integers below that add exactly in any order, so a count reads as the u64 it used to be;
//! the workers' all-reduce already carried them as f64.

use super::{Reduction, SLOTS, Slot, accuracy, loss};

/// Every slot adds: what [`Sums::summable`] assumes. A slot that reduces otherwise makes this
/// match fail to compile, then the assertion in `summable`.
const ALL_SUMMED: bool = {
    let mut all = true;
    let mut i = 0;
    while i < SLOTS.len() {
        all &= match SLOTS[i].reduction {
            Reduction::Sum => true,
        };
        i += 1;
    }
    all
};

/// The sums of a span of batches, one per [`Slot`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums([f64; Sums::LEN]);

impl Sums {
    /// Slots.
    pub const LEN: usize = SLOTS.len();

    /// Nothing summed yet over `examples` examples (the loss function's start on a batch).
    pub fn of_examples(examples: usize) -> Self {
        let mut sums = Self::default();
        sums.accumulate(loss::EXAMPLES, examples as f64);
        sums
    }

    /// The slots as they travel (the parameter-server wire) and are stored (checkpoints).
    pub fn from_values(values: [f64; Self::LEN]) -> Self {
        Self(values)
    }

    /// The slots, in order.
    pub fn values(&self) -> [f64; Self::LEN] {
        self.0
    }

    /// The slots, for an all-reduce that adds them across workers: right while every slot's
    /// reduction is a sum, which the compiler checks here.
    pub fn summable(&self) -> [f64; Self::LEN] {
        const { assert!(ALL_SUMMED, "a slot does not add: reduce it by its own operation across workers") };
        self.0
    }

    /// Each slot with its value, in order.
    pub fn slots(&self) -> impl Iterator<Item = (Slot, f64)> + '_ {
        SLOTS.iter().copied().zip(self.0)
    }

    /// The value of `slot`.
    pub fn get(&self, slot: Slot) -> f64 {
        self.0[slot.index]
    }

    /// Adds `value` (one row's part, one batch's) into `slot`, by the slot's reduction.
    pub fn accumulate(&mut self, slot: Slot, value: f64) {
        self.0[slot.index] = slot.reduction.combine(self.0[slot.index], value);
    }

    /// Adds another span's sums, slot by slot, each by its reduction.
    pub fn add(&mut self, other: Sums) {
        for (slot, value) in other.slots() {
            self.accumulate(slot, value);
        }
    }

    /// Examples seen.
    pub fn examples(&self) -> u64 {
        self.get(loss::EXAMPLES) as u64
    }

    /// Sum of per-example losses: not finite once training diverged.
    pub fn loss_sum(&self) -> f64 {
        self.get(loss::SUM)
    }

    /// Mean loss (0 with no examples).
    pub fn loss(&self) -> f64 {
        loss::mean(self)
    }

    /// Accuracy (0 with no examples).
    pub fn accuracy(&self) -> f64 {
        accuracy::fraction(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{mae, rmse};

    #[test]
    fn spans_add_slot_by_slot_and_counts_stay_exact() {
        let mut a = Sums::of_examples(3);
        a.accumulate(loss::SUM, 1.5);
        a.accumulate(accuracy::CORRECT, 2.0);
        let mut b = Sums::of_examples(1);
        b.accumulate(mae::ABS_ERROR, 0.25);
        b.accumulate(rmse::SQUARED_ERROR, 0.5);
        a.add(b);
        assert_eq!((a.examples(), a.loss_sum(), a.get(accuracy::CORRECT)), (4, 1.5, 2.0));
        assert_eq!((a.get(mae::ABS_ERROR), a.get(rmse::SQUARED_ERROR)), (0.25, 0.5));
        assert_eq!((a.loss(), a.accuracy()), (1.5 / 4.0, 0.5));
        assert_eq!(Sums::from_values(a.values()), a);
        // Counts are exact up to 2^53.
        let mut big = Sums::of_examples(1 << 53);
        big.add(Sums::of_examples(0));
        assert_eq!(big.examples(), 1 << 53);
    }

    #[test]
    fn no_examples_read_zero() {
        assert_eq!((Sums::default().loss(), Sums::default().accuracy()), (0.0, 0.0));
    }
}

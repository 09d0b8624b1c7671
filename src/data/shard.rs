//! [`Shard`]: which part of every global batch one worker keeps (TensorFlow's `DATA` auto-shard
//! policy, applied at batch level): worker `i` of `N` keeps positions `i, i+N, i+2N, …`. A
//! shard [`by_files`](Shard::by_files) (TensorFlow's `FILE` policy) instead reads files
//! `i, i+N, …` of a streamed split for its training batches, keeping the same number of
//! examples per global batch; evaluation is still split by example.
//!
//! Every worker walks the same global batches, so a short last batch leaves some workers with
//! fewer examples, possibly none; they still produce a (possibly empty) batch, so collectives
//! stay in step and nobody waits forever.

use super::error::DataError;
use std::num::NonZeroUsize;

/// One worker's share of the data: index `index` of `count` shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    index: usize,
    count: NonZeroUsize,
    by_files: bool,
}

impl Shard {
    /// The whole data, unsharded.
    pub const WHOLE: Shard = Shard { index: 0, count: NonZeroUsize::MIN, by_files: false };

    /// Shard `index` of `count`; `index` must be below `count`.
    pub fn new(index: usize, count: NonZeroUsize) -> Result<Self, DataError> {
        if index >= count.get() {
            return Err(DataError::BadShard { index, count: count.get() });
        }
        Ok(Self { index, count, by_files: false })
    }

    /// Shard `index` of `count` under the `file` policy: its training examples come from
    /// files `index, index + count, …`.
    pub fn of_files(index: usize, count: NonZeroUsize) -> Result<Self, DataError> {
        Self::new(index, count).map(|s| Self { by_files: true, ..s })
    }

    /// Whether training examples are split by file.
    pub fn by_files(&self) -> bool {
        self.by_files
    }

    /// The files of `files` this shard reads under the `file` policy.
    pub fn files(&self, files: usize) -> Vec<usize> {
        (self.index..files).step_by(self.count.get()).collect()
    }

    /// This shard's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of shards.
    pub fn count(&self) -> NonZeroUsize {
        self.count
    }

    /// How many of a global batch of `global_len` examples this shard keeps.
    pub fn len_of(&self, global_len: usize) -> usize {
        global_len.saturating_sub(self.index).div_ceil(self.count.get())
    }

    /// The positions this shard keeps within a global batch of `global_len`, in order.
    pub fn positions(&self, global_len: usize) -> impl Iterator<Item = usize> + use<> {
        (self.index..global_len).step_by(self.count.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_every_batch_in_order() {
        for count in 1..=5 {
            let count = NonZeroUsize::new(count).unwrap();
            for global_len in 0..12 {
                let mut seen = vec![];
                for index in 0..count.get() {
                    let shard = Shard::new(index, count).unwrap();
                    let pos: Vec<usize> = shard.positions(global_len).collect();
                    assert_eq!(pos.len(), shard.len_of(global_len));
                    seen.extend(pos);
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..global_len).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn index_out_of_range_is_an_error() {
        let err = Shard::new(3, NonZeroUsize::new(3).unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "shard index 3 is out of range for 3 shards");
    }
}

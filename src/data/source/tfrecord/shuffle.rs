//! `tf.data.Dataset.shuffle(buffer_size)` over a stream: the buffer fills with the first
//! `buffer_size` items, each output is a uniformly drawn slot, and the slot is refilled with the
//! next input item; once the input ends, the last slot moves into each emptied one and draws
//! continue over what remains. The buffer never holds more than `buffer_size` items.
//!
//! The draws come from the same seeded stream as the in-memory pipeline's buffered shuffle
//! (`ChaCha8` keyed by the seed, stream = data-epoch, Lemire's bounded draw), so the order of
//! `n` streamed records equals the pipeline's `Shuffle::Buffer` order of `n` examples.

use crate::data::pipeline::below;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use std::num::NonZeroUsize;

/// Separates the shuffle's use of the run seed from its other uses (the pipeline's value).
const SHUFFLE_DOMAIN: u64 = 0x5348_5546_464c_4531; // "SHUFFLE1"

/// A bounded shuffle buffer, deterministic from `(seed, epoch)`.
pub struct ShuffleBuffer<T> {
    items: Vec<T>,
    capacity: usize,
    rng: ChaCha8Rng,
}

impl<T> ShuffleBuffer<T> {
    /// An empty buffer of `capacity` items whose draws depend on `seed` and `epoch`.
    pub fn new(capacity: NonZeroUsize, seed: u64, epoch: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SHUFFLE_DOMAIN);
        rng.set_stream(epoch);
        Self { items: Vec::with_capacity(capacity.get().min(1 << 16)), capacity: capacity.get(), rng }
    }

    /// Items held now (never more than the capacity).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when the buffer holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The next output: fills the buffer from `next` (which gives `None` once the input has
    /// ended), draws a slot, and refills it. `None` once input and buffer are both empty.
    pub fn next_from<E>(&mut self, mut next: impl FnMut() -> Result<Option<T>, E>) -> Result<Option<T>, E> {
        // Filling happens once at the start; later each output refills its own slot.
        while self.items.len() < self.capacity {
            match next()? {
                Some(item) => self.items.push(item),
                None => break,
            }
        }
        if self.items.is_empty() {
            return Ok(None);
        }
        let slot = below(&mut self.rng, self.items.len());
        let out = match next()? {
            Some(item) => std::mem::replace(&mut self.items[slot], item),
            None => self.items.swap_remove(slot),
        };
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn shuffled(n: usize, capacity: usize, seed: u64, epoch: u64) -> (Vec<usize>, usize) {
        let mut buffer = ShuffleBuffer::new(NonZeroUsize::new(capacity).unwrap(), seed, epoch);
        let mut input = 0..n;
        let mut out = vec![];
        let mut most = 0;
        while let Some(x) = buffer.next_from(|| Ok::<_, Infallible>(input.next())).unwrap() {
            out.push(x);
            most = most.max(buffer.len());
        }
        (out, most)
    }

    #[test]
    fn outputs_a_permutation_that_stays_within_the_buffer_window() {
        let (order, most) = shuffled(1000, 64, 7, 0);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert!(most <= 64);
        // Output k was read at most `buffer_size` items after it: no item travels further back.
        for (k, &x) in order.iter().enumerate() {
            assert!(x < k + 64, "output {k} is item {x}");
        }
        assert_ne!(order, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn is_deterministic_per_seed_and_epoch() {
        assert_eq!(shuffled(500, 100, 1, 3).0, shuffled(500, 100, 1, 3).0);
        assert_ne!(shuffled(500, 100, 1, 3).0, shuffled(500, 100, 1, 4).0);
        assert_ne!(shuffled(500, 100, 1, 3).0, shuffled(500, 100, 2, 3).0);
        assert_eq!(shuffled(50, 1, 9, 0).0, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn matches_the_in_memory_pipelines_buffered_order() {
        use crate::data::source::idx::IdxArray;
        use crate::data::{Cursor, Dataset, ExampleShape, Pipeline, PipelineOptions, Shard, Shuffle, Split};
        // One global batch of the whole set; each example's label is its index.
        let n = 200;
        let labels: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let shape = ExampleShape { height: 1, width: 1, channels: 1 };
        let train =
            Split::new(IdxArray::from_parts(vec![n, 1, 1], vec![0; n]), IdxArray::from_parts(vec![n], labels), shape);
        let data = std::sync::Arc::new(Dataset {
            train,
            test: None,
            labels: crate::data::LabelKind::Class { classes: 200 },
            vocabulary: None,
            classes: None,
        });
        for (size, seed, epoch) in [(32, 42, 2), (1, 7, 0), (500, 3, 9)] {
            let options = PipelineOptions {
                seed,
                shuffle: Shuffle::Buffer(NonZeroUsize::new(size).unwrap()),
                global_batch: NonZeroUsize::new(n).unwrap(),
                drop_remainder: false,
                prefetch: 1,
                shard: Shard::WHOLE,
            };
            let mut pipeline = Pipeline::new(data.clone(), &options, Cursor { epoch, offset: 0 }).unwrap();
            let order: Vec<usize> = pipeline.next_batch().unwrap().y.iter().map(|&y| y as usize).collect();
            assert_eq!(shuffled(n, size, seed, epoch).0, order, "buffer {size}, seed {seed}, epoch {epoch}");
        }
    }
}

//! The input pipeline, with `tf.data` semantics: shuffle (whole-set, buffered, or off),
//! reshuffled every data-epoch, batched to the global batch, repeated forever, sharded per
//! worker, and prefetched on a background thread that also turns bytes into `f32`.
//!
//! The batch sequence is a pure function of (dataset, seed, options, start [`Cursor`]): the
//! order of data-epoch `e` comes from a random stream keyed by `(seed, e)`, so any epoch can be
//! computed without replaying earlier ones, and a run resumed from a checkpoint's cursor sees
//! exactly the batches it would have seen. Batches never span data-epochs.
//!
//! A whole-set shuffle lists a Fisher–Yates permutation of a split of examples, and computes
//! each position of a split of token windows from a seeded bijection ([`WholeShuffle`]): one
//! window per token would make the list the largest thing in memory. A shuffle buffer is run
//! as the epoch is read ([`BufferOrder`]), holding its `buffer_size` indices and nothing per
//! example, so it costs O(buffer) whatever the split (a corpus's windows included).

use super::bijection::Bijection;
use super::error::DataError;
use super::examples::WholeShuffle;
use super::streamed::{self, Streamed};
use super::{Dataset, Shard, Split};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

/// Separates the shuffle's use of the run seed from its other uses.
const SHUFFLE_DOMAIN: u64 = 0x5348_5546_464c_4531; // "SHUFFLE1"

/// More batches ahead than any training step can use; the channel allocates its slots up
/// front, so an absurd `data.prefetch` must be refused rather than attempted.
const MAX_PREFETCH: usize = 64;

/// How the training examples are ordered in each data-epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shuffle {
    /// File order, every epoch.
    Off,
    /// A uniform permutation of the whole training set.
    Full,
    /// `tf.data.Dataset.shuffle(buffer_size)`: a buffer of this many examples; each output is
    /// a uniformly drawn slot, refilled with the next example in file order.
    Buffer(NonZeroUsize),
}

impl Shuffle {
    /// From `data.shuffle_buffer`: unset is the whole set, `0` is off.
    pub fn from_buffer_size(size: Option<usize>) -> Self {
        match size.map(NonZeroUsize::new) {
            None => Shuffle::Full,
            Some(None) => Shuffle::Off,
            Some(Some(b)) => Shuffle::Buffer(b),
        }
    }
}

/// A position in the endless batch sequence: a data-epoch and the offset, in examples, of the
/// next global batch within that epoch's order. Checkpoints store it to resume mid-epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cursor {
    pub epoch: u64,
    pub offset: usize,
}

/// Everything that decides the batch sequence, plus how far ahead to prepare it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineOptions {
    /// The run seed.
    pub seed: u64,
    pub shuffle: Shuffle,
    /// Examples per global batch, across all workers.
    pub global_batch: NonZeroUsize,
    /// Drop each data-epoch's last partial global batch instead of emitting it short.
    pub drop_remainder: bool,
    /// Batches prepared ahead on the background thread.
    pub prefetch: usize,
    /// This worker's share of every global batch.
    pub shard: Shard,
}

/// This worker's part of one global batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Features, `n` examples of the split's shape one after the other (images: NHWC, each
    /// byte divided by 255, so in `[0, 1]`; text: token ids).
    pub x: Vec<f32>,
    /// Class labels: one per example, or one per position of a sequence (empty for float
    /// targets).
    pub y: Vec<u32>,
    /// Float targets, the same number per example (empty for class labels).
    pub targets: Vec<f32>,
    /// Examples in this part; may be 0 when a short global batch leaves none for this worker.
    pub n: usize,
    /// Examples in the whole global batch (to weight a short batch's loss).
    pub global_n: usize,
    /// Loss terms per example: a sequence's positions, else 1.
    pub rows_per_example: usize,
}

impl Default for Batch {
    /// An empty batch of examples with one loss term each.
    fn default() -> Self {
        Self { x: vec![], y: vec![], targets: vec![], n: 0, global_n: 0, rows_per_example: 1 }
    }
}

impl Batch {
    /// Loss terms in the whole global batch: the mean loss divides by this, so gradients are
    /// the mean over every example (or every position) of the global batch.
    pub fn global_rows(&self) -> usize {
        self.global_n * self.rows_per_example
    }

    /// What the loss compares the outputs with.
    pub fn truth(&self) -> crate::engine::Truth<'_> {
        if self.targets.is_empty() {
            crate::engine::Truth::Classes(&self.y)
        } else {
            crate::engine::Truth::Targets(&self.targets)
        }
    }
}

/// The pure arithmetic of the batch sequence.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchSchedule {
    examples: usize,
    pub(super) seed: u64,
    pub(super) shuffle: Shuffle,
    global_batch: usize,
    drop_remainder: bool,
    /// How `Shuffle::Full` is made for this split.
    whole: WholeShuffle,
}

impl BatchSchedule {
    fn new(examples: usize, options: &PipelineOptions, whole: WholeShuffle) -> Self {
        Self {
            examples,
            seed: options.seed,
            shuffle: options.shuffle,
            global_batch: options.global_batch.get(),
            drop_remainder: options.drop_remainder,
            whole,
        }
    }

    /// Moves a cursor that has no batch left in its epoch to the start of the next epoch.
    fn normalize(&self, c: Cursor) -> Cursor {
        let exhausted =
            if self.drop_remainder { c.offset + self.global_batch > self.examples } else { c.offset >= self.examples };
        if exhausted { Cursor { epoch: c.epoch.wrapping_add(1), offset: 0 } } else { c }
    }

    /// Positions, in the epoch's order, of the global batch at a normalized cursor.
    pub(super) fn batch_at(&self, c: Cursor) -> Range<usize> {
        c.offset..(c.offset + self.global_batch).min(self.examples)
    }

    pub(super) fn advance(&self, c: Cursor) -> Cursor {
        let end = self.batch_at(c).end;
        self.normalize(Cursor { offset: end, ..c })
    }

    fn batches_per_epoch(&self) -> usize {
        if self.drop_remainder { self.examples / self.global_batch } else { self.examples.div_ceil(self.global_batch) }
    }

    /// The order of the training examples in data-epoch `epoch`.
    fn epoch_order(&self, epoch: u64) -> EpochOrder {
        let n = self.examples;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ SHUFFLE_DOMAIN);
        rng.set_stream(epoch);
        match (self.shuffle, self.whole) {
            (Shuffle::Off, _) => EpochOrder::Identity,
            (Shuffle::Full, WholeShuffle::FisherYates) => {
                let mut order: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    order.swap(i, below(&mut rng, i + 1));
                }
                EpochOrder::Listed(order)
            }
            (Shuffle::Full, WholeShuffle::Bijection) => EpochOrder::Computed(Bijection::new(n, &mut rng)),
            (Shuffle::Buffer(size), _) => EpochOrder::Buffered(Box::new(BufferOrder::new(n, size.get(), rng))),
        }
    }
}

/// The examples of one data-epoch, by position.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EpochOrder {
    /// Position `p` holds example `p` (no shuffle).
    Identity,
    /// Every position's example, listed (Fisher–Yates).
    Listed(Vec<usize>),
    /// Computed per position (token windows shuffled whole).
    Computed(Bijection),
    /// A shuffle buffer's outputs, made as the positions are read.
    Buffered(Box<BufferOrder>),
}

impl EpochOrder {
    /// The examples at positions `range` of the epoch. Positions are read forward (a run's
    /// batches, one after the other): a shuffle buffer behind `range.start` starts its epoch
    /// again.
    fn take(&mut self, range: Range<usize>) -> Vec<usize> {
        match self {
            EpochOrder::Identity => range.collect(),
            EpochOrder::Listed(order) => order[range].to_vec(),
            EpochOrder::Computed(bijection) => range.map(|p| bijection.at(p)).collect(),
            EpochOrder::Buffered(buffer) => buffer.take(range),
        }
    }
}

/// `tf.data`'s shuffle buffer over `0..n`, run as the epoch is read: it holds `size` indices
/// (fewer once the input runs out, when the last slot moves into each emptied one and draws
/// continue over what remains), never a list of the epoch. Reaching position `p` costs `p`
/// draws from the start of the epoch, which a resumed run pays once (a few ns a draw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BufferOrder {
    n: usize,
    size: usize,
    /// The draws' stream as the epoch starts, to start it again.
    start: ChaCha8Rng,
    rng: ChaCha8Rng,
    buffer: Vec<usize>,
    /// The next example to enter the buffer.
    next: usize,
    /// Positions given so far.
    given: usize,
}

impl BufferOrder {
    fn new(n: usize, size: usize, rng: ChaCha8Rng) -> Self {
        let size = size.min(n);
        Self { n, size, start: rng.clone(), rng, buffer: (0..size).collect(), next: size, given: 0 }
    }

    /// The example at the next position; `None` past the epoch's end.
    fn next(&mut self) -> Option<usize> {
        if self.buffer.is_empty() {
            return None;
        }
        let slot = below(&mut self.rng, self.buffer.len());
        let out = self.buffer[slot];
        if self.next < self.n {
            self.buffer[slot] = self.next;
            self.next += 1;
        } else {
            self.buffer.swap_remove(slot);
        }
        self.given += 1;
        Some(out)
    }

    fn take(&mut self, range: Range<usize>) -> Vec<usize> {
        if range.start < self.given {
            *self = Self::new(self.n, self.size, self.start.clone());
        }
        while self.given < range.start && self.next().is_some() {}
        range.map_while(|_| self.next()).collect()
    }

    /// Indices held (the buffer's memory, for tests).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.buffer.capacity()
    }
}

/// A uniform draw from `0..n` (Lemire's multiply-and-reject). Written out rather than taken from
/// `rand` so the sequence, which checkpoints depend on, cannot change with a `rand` release.
/// The TFRecord shuffle buffer draws with it too, so the two shuffles agree.
pub(crate) fn below(rng: &mut impl Rng, n: usize) -> usize {
    let n = n as u64;
    let threshold = n.wrapping_neg() % n;
    loop {
        let m = u128::from(rng.next_u64()) * u128::from(n);
        if (m as u64) >= threshold {
            return (m >> 64) as usize;
        }
    }
}

/// Fills `batch` with this shard's part of a global batch of `global_len` examples, where
/// position `p` of the global batch is example `index(p)`; training batches name their
/// data-epoch (`epoch`), which draws their augmentation.
fn fill(
    batch: &mut Batch,
    split: &Split,
    epoch: Option<u64>,
    global_len: usize,
    shard: Shard,
    index: impl Fn(usize) -> usize,
) -> Result<(), DataError> {
    batch.x.clear();
    batch.y.clear();
    batch.targets.clear();
    let n = shard.len_of(global_len);
    batch.x.reserve(n * split.example_len());
    let indices: Vec<usize> = shard.positions(global_len).map(index).collect();
    match epoch {
        Some(e) => split.append_many_in_epoch(e, &indices, batch)?,
        None => split.append_many(&indices, batch)?,
    }
    batch.n = n;
    batch.global_n = global_len;
    batch.rows_per_example = split.rows_per_example();
    Ok(())
}

/// The training input: an endless sequence of this worker's batches, prepared on a background
/// thread. Dropping it stops the thread.
pub struct Pipeline {
    batches: Option<Receiver<Result<Batch, DataError>>>,
    recycled: Sender<Batch>,
    worker: Option<JoinHandle<()>>,
    schedule: BatchSchedule,
    cursor: Cursor,
}

impl Pipeline {
    /// Starts the pipeline over `data.train` at `start` (`Cursor::default()` for a new run).
    pub fn new(data: Arc<Dataset>, options: &PipelineOptions, start: Cursor) -> Result<Self, DataError> {
        let streamed = data.train.records().map(|r| Streamed::new(r, options)).transpose()?;
        if options.shard.by_files() && streamed.is_none() {
            return Err(DataError::Unstreamable { what: "split a source that is not made of files by file" });
        }
        let examples = match (&streamed, data.train.records()) {
            (Some(how), Some(records)) => how.examples(records),
            _ => data.train.len(),
        };
        if examples == 0 {
            return Err(DataError::EmptyTrainingSet);
        }
        let global_batch = options.global_batch.get();
        if options.drop_remainder && global_batch > examples {
            return Err(DataError::BatchLargerThanData { global_batch, examples });
        }
        if options.prefetch > MAX_PREFETCH {
            return Err(DataError::PrefetchTooLarge { prefetch: options.prefetch, max: MAX_PREFETCH });
        }
        if start.offset > examples {
            return Err(DataError::BadCursor { offset: start.offset, examples });
        }
        let schedule = BatchSchedule::new(examples, options, data.train.whole_shuffle());
        let cursor = schedule.normalize(start);
        let (send, batches) = mpsc::sync_channel(options.prefetch);
        let (recycle, recycled) = mpsc::channel();
        let shard = options.shard;
        let worker = std::thread::Builder::new()
            .name("trainrun-input".into())
            .spawn(move || match streamed {
                Some(how) => streamed::produce(&data.train, &how, schedule, shard, cursor, &send, &recycled),
                None => produce(&data.train, schedule, shard, cursor, &send, &recycled),
            })
            .map_err(|source| DataError::Thread { source })?;
        Ok(Self { batches: Some(batches), recycled: recycle, worker: Some(worker), schedule, cursor })
    }

    /// The next batch of this worker. Hand it back with [`Pipeline::recycle`] once used, so its
    /// buffers are reused instead of allocated every step. An example that cannot be read
    /// (a corrupt image) is its error, and the pipeline stops.
    pub fn next_batch(&mut self) -> Result<Batch, DataError> {
        let batches = self.batches.as_ref().ok_or(DataError::PipelineStopped)?;
        let batch = batches.recv().map_err(|_| DataError::PipelineStopped)??;
        self.cursor = self.schedule.advance(self.cursor);
        Ok(batch)
    }

    /// Returns a batch's buffers for reuse.
    pub fn recycle(&self, batch: Batch) {
        // The producer may have stopped; then the buffers are simply freed.
        let _ = self.recycled.send(batch);
    }

    /// Where the next batch returned by [`Pipeline::next_batch`] starts (not where the
    /// prefetch thread is), so it is what a checkpoint should store.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Global batches in one data-epoch (steps per epoch, when one step is one global batch).
    pub fn batches_per_epoch(&self) -> usize {
        self.schedule.batches_per_epoch()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // Closing the channel makes the producer's next (or current, blocked) send fail, and
        // it returns; then joining cannot wait long.
        drop(self.batches.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn produce(
    split: &Split,
    schedule: BatchSchedule,
    shard: Shard,
    mut cursor: Cursor,
    send: &SyncSender<Result<Batch, DataError>>,
    recycled: &Receiver<Batch>,
) {
    let mut epoch = cursor.epoch;
    let mut order = schedule.epoch_order(epoch);
    loop {
        if cursor.epoch != epoch {
            epoch = cursor.epoch;
            order = schedule.epoch_order(epoch);
        }
        let range = schedule.batch_at(cursor);
        let examples = order.take(range.clone());
        let mut batch = recycled.try_recv().unwrap_or_default();
        let filled = fill(&mut batch, split, Some(epoch), range.len(), shard, |p| examples[p]);
        let failed = filled.is_err();
        if send.send(filled.map(|()| batch)).is_err() || failed {
            return;
        }
        cursor = schedule.advance(cursor);
    }
}

/// Evaluation batches over a split: in order, unshuffled, every example once, the last batch
/// short; sharded like training, so every worker walks the same number of global batches.
/// An example that cannot be read ends the iteration early; [`EvalBatches::finish`] then
/// returns its error, so callers iterate (`by_ref`) and then call `finish`.
#[derive(Debug)]
pub struct EvalBatches<'a> {
    split: &'a Split,
    global_batch: usize,
    shard: Shard,
    next: usize,
    error: Option<DataError>,
}

impl<'a> EvalBatches<'a> {
    /// Batches of `global_batch` examples of `split`, this worker's `shard` of each.
    pub fn new(split: &'a Split, global_batch: NonZeroUsize, shard: Shard) -> Self {
        Self { split, global_batch: global_batch.get(), shard, next: 0, error: None }
    }

    /// The error that ended the iteration early, if one did.
    pub fn finish(self) -> Result<(), DataError> {
        self.error.map_or(Ok(()), Err)
    }
}

impl Iterator for EvalBatches<'_> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let n = self.split.len();
        if self.next >= n || self.error.is_some() {
            return None;
        }
        let start = self.next;
        let end = (start + self.global_batch).min(n);
        self.next = end;
        let mut batch = Batch::default();
        match fill(&mut batch, self.split, None, end - start, self.shard, |p| start + p) {
            Ok(()) => Some(batch),
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // An unreadable example may end the iteration early, so the count is only a bound.
        let left = self.split.len().saturating_sub(self.next).div_ceil(self.global_batch);
        (0, Some(if self.error.is_some() { 0 } else { left }))
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;

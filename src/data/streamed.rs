//! The input pipeline over a split read only in order ([`StreamSplit`]: TFRecord files, Parquet
//! row groups): each
//! data-epoch is one pass of a stream, in file order or through a shuffle buffer keyed by the
//! run seed and the epoch, so it is the same pass every time it is made. A pipeline started at
//! a cursor replays its epoch's stream up to the cursor, skipping without decoding: exact
//! resume without storing the buffer in checkpoints.
//!
//! Under the `data` policy every worker walks the whole stream and decodes only its positions
//! of each global batch. Under the `file` policy ([`Shard::by_files`]) worker `i` of `N`
//! streams units (files, row groups) `i, i+N, …` and takes its usual share `b_i` of every
//! global batch from them;
//! a data-epoch lasts until the worker with the most steps' worth of records is done (workers
//! that run out first send empty batches, so every collective stays in step and every record
//! is read once per epoch), or, with `drop_remainder`, until the first worker cannot fill its
//! share. Each step's global batch size is the sum of the shares, which every worker computes
//! from the files' record counts.

use super::error::DataError;
use super::examples::{Split, StreamReader, StreamSplit};
use super::pipeline::{Batch, BatchSchedule, Cursor, PipelineOptions, Shuffle};
use super::shard::Shard;
use super::source::tfrecord::Order;
use std::sync::mpsc::{Receiver, SyncSender};

/// How one worker reads a streamed split.
#[derive(Debug, Clone)]
pub(super) struct Streamed {
    /// The files this worker reads, in order.
    files: Vec<usize>,
    /// Under the `file` policy: every worker's records and share.
    shares: Option<Shares>,
    global_batch: usize,
}

/// The `file` policy's arithmetic, the same on every worker.
#[derive(Debug, Clone)]
struct Shares {
    /// Records in each worker's files.
    records: Vec<usize>,
    /// Each worker's examples of a full global batch.
    batch: Vec<usize>,
    /// This worker.
    me: usize,
    drop_remainder: bool,
}

impl Shares {
    /// Global batches in one data-epoch.
    fn steps(&self) -> usize {
        let per = self.records.iter().zip(&self.batch);
        if self.drop_remainder {
            per.map(|(&r, &b)| r / b.max(1)).min().unwrap_or(0)
        } else {
            per.map(|(&r, &b)| r.div_ceil(b.max(1))).max().unwrap_or(0)
        }
    }

    /// Examples worker `w` reads before step `step` of an epoch.
    fn before(&self, w: usize, step: usize) -> usize {
        (step * self.batch[w]).min(self.records[w])
    }

    /// Examples worker `w` contributes to step `step`.
    fn at(&self, w: usize, step: usize) -> usize {
        self.before(w, step + 1) - self.before(w, step)
    }

    fn global_at(&self, step: usize) -> usize {
        (0..self.records.len()).map(|w| self.at(w, step)).sum()
    }
}

impl Streamed {
    /// How this worker reads `records` under `options`, checked.
    pub(super) fn new(split: &dyn StreamSplit, options: &PipelineOptions) -> Result<Self, DataError> {
        if options.shuffle == Shuffle::Full {
            return Err(DataError::Unstreamable { what: "shuffle a stream whole; it needs a shuffle buffer" });
        }
        let lens = split.unit_lens();
        let (shard, global_batch) = (options.shard, options.global_batch.get());
        if !shard.by_files() {
            return Ok(Self { files: (0..lens.len()).collect(), shares: None, global_batch });
        }
        let count = shard.count().get();
        let workers: Vec<Shard> = (0..count).filter_map(|w| Shard::of_files(w, shard.count()).ok()).collect();
        let records: Vec<usize> = workers.iter().map(|s| s.files(lens.len()).iter().map(|&f| lens[f]).sum()).collect();
        let batch: Vec<usize> = workers.iter().map(|s| s.len_of(global_batch)).collect();
        if let Some(w) = (0..count).find(|&w| records[w] == 0 || (options.drop_remainder && records[w] < batch[w])) {
            return Err(split.refused(format!(
                "auto_shard_policy = \"file\": worker {w}'s files hold {} records, fewer than its {} examples of \
                     each global batch; use more (or more even) files, or auto_shard_policy = \"data\"",
                records[w], batch[w]
            )));
        }
        let shares = Shares { records, batch, me: shard.index(), drop_remainder: options.drop_remainder };
        Ok(Self { files: shard.files(lens.len()), shares: Some(shares), global_batch })
    }

    /// Examples in one data-epoch, as the schedule counts them: the records under the `data`
    /// policy; whole global batches of steps under the `file` policy (the cursor's offset is
    /// then `step × global_batch`).
    pub(super) fn examples(&self, records: &dyn StreamSplit) -> usize {
        match &self.shares {
            None => records.unit_lens().iter().sum(),
            Some(shares) => shares.steps() * self.global_batch,
        }
    }
}

/// The stream of the epoch being read.
struct EpochStream {
    epoch: u64,
    reader: Box<dyn StreamReader>,
    /// Outputs of the stream consumed (taken or skipped).
    read: usize,
}

impl EpochStream {
    /// Moves the stream to output `to`.
    fn seek(&mut self, to: usize, records: &dyn StreamSplit) -> Result<(), DataError> {
        let k = to.saturating_sub(self.read);
        if self.reader.skip(k)? < k {
            return Err(records.ended_early());
        }
        self.read = self.read.max(to);
        Ok(())
    }

    fn take(&mut self, records: &dyn StreamSplit) -> Result<(), DataError> {
        if !self.reader.take()? {
            return Err(records.ended_early());
        }
        self.read += 1;
        Ok(())
    }

    /// Decodes the examples taken into `batch`.
    fn decode(&mut self, batch: &mut Batch) -> Result<(), DataError> {
        self.reader.decode(batch)
    }
}

fn order(schedule: &BatchSchedule, epoch: u64) -> Order {
    match schedule.shuffle {
        Shuffle::Buffer(buffer_size) => Order::Shuffled { buffer_size, seed: schedule.seed, epoch },
        // `Full` is refused by `Streamed::new`.
        Shuffle::Off | Shuffle::Full => Order::Files,
    }
}

/// Fills `batch` with this worker's part of the global batch at `cursor`, and `positions`
/// with where in the epoch's stream each of its examples was (one output, the two together).
fn fill(
    (batch, positions): (&mut Batch, &mut Vec<usize>),
    records: &dyn StreamSplit,
    how: &Streamed,
    schedule: &BatchSchedule,
    shard: Shard,
    cursor: Cursor,
    pass: &mut Option<EpochStream>,
) -> Result<(), DataError> {
    batch.x.clear();
    batch.y.clear();
    batch.targets.clear();
    positions.clear();
    let pass = match pass {
        Some(p) if p.epoch == cursor.epoch => p,
        _ => pass.insert(EpochStream {
            epoch: cursor.epoch,
            reader: records.open_units(&how.files, order(schedule, cursor.epoch)),
            read: 0,
        }),
    };
    let range = schedule.batch_at(cursor);
    let (n, global_n) = match &how.shares {
        None => {
            for p in shard.positions(range.len()) {
                pass.seek(range.start + p, records)?;
                positions.push(pass.read);
                pass.take(records)?;
            }
            (shard.len_of(range.len()), range.len())
        }
        Some(shares) => {
            let step = cursor.offset / how.global_batch;
            pass.seek(shares.before(shares.me, step), records)?;
            let n = shares.at(shares.me, step);
            for _ in 0..n {
                positions.push(pass.read);
                pass.take(records)?;
            }
            (n, shares.global_at(step))
        }
    };
    pass.decode(batch)?;
    batch.n = n;
    batch.global_n = global_n;
    batch.rows_per_example = 1;
    Ok(())
}

/// The pipeline thread's loop over a streamed split (see `pipeline::produce`).
pub(super) fn produce(
    split: &Split,
    how: &Streamed,
    schedule: BatchSchedule,
    shard: Shard,
    mut cursor: Cursor,
    send: &SyncSender<Result<Batch, DataError>>,
    recycled: &Receiver<Batch>,
) {
    let Some(records) = split.records() else {
        let _ = send.send(Err(DataError::Unstreamable { what: "stream a split that is not read in order" }));
        return;
    };
    let (mut pass, mut positions) = (None, Vec::new());
    loop {
        let mut batch = recycled.try_recv().unwrap_or_default();
        let filled = fill((&mut batch, &mut positions), records, how, &schedule, shard, cursor, &mut pass)
            .and_then(|()| split.transform_streamed(cursor.epoch, &positions, &mut batch));
        let failed = filled.is_err();
        if send.send(filled.map(|()| batch)).is_err() || failed {
            return;
        }
        cursor = schedule.advance(cursor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_shares_cover_every_record_once_and_agree_on_the_global_batch() {
        // Worker 0 has 10 records, worker 1 has 7; a global batch of 6 is 3 + 3.
        let shares = |drop_remainder| Shares { records: vec![10, 7], batch: vec![3, 3], me: 0, drop_remainder };
        let keep = shares(false);
        assert_eq!(keep.steps(), 4);
        let per_step: Vec<(usize, usize, usize)> =
            (0..4).map(|s| (keep.at(0, s), keep.at(1, s), keep.global_at(s))).collect();
        assert_eq!(per_step, [(3, 3, 6), (3, 3, 6), (3, 1, 4), (1, 0, 1)]);
        let drop = shares(true);
        assert_eq!(drop.steps(), 2);
        assert_eq!((drop.before(0, 2), drop.before(1, 2)), (6, 6));
    }
}

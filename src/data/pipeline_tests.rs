//! Tests of the input pipeline: determinism, shuffling, resume, sharding, remainders, shutdown.

use super::*;
use crate::data::ExampleShape;
use crate::data::source::idx::IdxArray;

/// `n` examples of shape 1×2×1 whose pixels encode their index (`i % 256`, `i / 256`), so a
/// batch can be decoded back into example indices.
fn dataset(n: usize) -> Arc<Dataset> {
    let images: Vec<u8> = (0..n).flat_map(|i| [(i % 256) as u8, (i / 256) as u8]).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 7) as u8).collect();
    let shape = ExampleShape { height: 1, width: 2, channels: 1 };
    let train = Split::new(IdxArray::from_parts(vec![n, 1, 2], images), IdxArray::from_parts(vec![n], labels), shape);
    Arc::new(Dataset {
        test: Some(train.clone()),
        train,
        labels: crate::data::LabelKind::Class { classes: 7 },
        vocabulary: None,
        classes: None,
    })
}

/// `n` token windows of one token each, over the tokens `0..=n`: window `i` reads token `i`
/// and predicts `i + 1`. Shuffled whole by the bijection, not Fisher–Yates.
fn windows(n: usize) -> Arc<Dataset> {
    use crate::data::windows::{Tokens, Windows};
    let tokens = Tokens::Owned((0..=n as u32).collect());
    Arc::new(Dataset {
        train: Split::of(Windows::new(vec![tokens], 1, 1)),
        test: None,
        labels: crate::data::LabelKind::Sequence { classes: n as u32 + 1, len: 1 },
        vocabulary: None,
        classes: None,
    })
}

/// The example indices of a batch of [`dataset`] or of [`windows`].
fn indices(batch: &Batch) -> Vec<usize> {
    assert_eq!(batch.y.len(), batch.n);
    if batch.x.len() == batch.n {
        let ids: Vec<usize> = batch.x.iter().map(|&t| t as usize).collect();
        assert!(ids.iter().zip(&batch.y).all(|(&i, &y)| y as usize == i + 1), "a window's label is its next token");
        return ids;
    }
    assert_eq!(batch.x.len(), batch.n * 2);
    let ids: Vec<usize> =
        batch.x.chunks(2).map(|p| (p[0] * 255.0).round() as usize + 256 * (p[1] * 255.0).round() as usize).collect();
    for (&i, &y) in ids.iter().zip(&batch.y) {
        assert_eq!(y as usize, i % 7, "label travels with its image");
    }
    ids
}

fn options(seed: u64, shuffle: Shuffle, global: usize, drop_remainder: bool) -> PipelineOptions {
    PipelineOptions {
        seed,
        shuffle,
        global_batch: NonZeroUsize::new(global).unwrap(),
        drop_remainder,
        prefetch: 2,
        shard: Shard::WHOLE,
    }
}

fn take(data: &Arc<Dataset>, opts: &PipelineOptions, start: Cursor, k: usize) -> Vec<Vec<usize>> {
    let mut p = Pipeline::new(data.clone(), opts, start).unwrap();
    (0..k)
        .map(|_| {
            let b = p.next_batch().unwrap();
            let ids = indices(&b);
            p.recycle(b);
            ids
        })
        .collect()
}

fn buf(b: usize) -> Shuffle {
    Shuffle::Buffer(NonZeroUsize::new(b).unwrap())
}

/// The first `n` positions of an epoch's order.
fn listed(mut order: EpochOrder, n: usize) -> Vec<usize> {
    order.take(0..n)
}

fn schedule(n: usize, opts: &PipelineOptions) -> BatchSchedule {
    BatchSchedule::new(n, opts, WholeShuffle::FisherYates)
}

#[test]
fn same_seed_same_batches_other_seed_other_batches() {
    for (data, shuffle) in [(dataset(100), Shuffle::Full), (dataset(100), buf(10)), (windows(100), Shuffle::Full)] {
        let a = take(&data, &options(1, shuffle, 8, true), Cursor::default(), 40);
        assert_eq!(a, take(&data, &options(1, shuffle, 8, true), Cursor::default(), 40));
        assert_ne!(a, take(&data, &options(2, shuffle, 8, true), Cursor::default(), 40));
        // Epochs are reshuffled: the second epoch's first batch differs from the first's.
        assert_ne!(a[0], a[12]);
    }
}

#[test]
fn every_epoch_covers_every_example_once() {
    for data in [dataset(103), windows(103)] {
        for shuffle in [Shuffle::Off, Shuffle::Full, buf(1), buf(17), buf(500)] {
            let opts = options(9, shuffle, 10, false);
            let batches = take(&data, &opts, Cursor::default(), 11 * 3);
            for epoch in batches.chunks(11) {
                let mut seen: Vec<usize> = epoch.concat();
                seen.sort_unstable();
                assert_eq!(seen, (0..103).collect::<Vec<_>>(), "{shuffle:?}");
            }
            // Each epoch is reshuffled.
            assert_eq!(shuffle == Shuffle::Off || shuffle == buf(1), batches[0] == batches[11], "{shuffle:?}");
        }
        let off = take(&data, &options(9, Shuffle::Off, 10, false), Cursor::default(), 1);
        assert_eq!(off[0], (0..10).collect::<Vec<_>>());
    }
}

#[test]
fn windows_are_shuffled_whole_by_the_bijection_and_examples_by_fisher_yates() {
    let opts = options(4, Shuffle::Full, 10, false);
    for epoch in 0..3 {
        let mut rng = ChaCha8Rng::seed_from_u64(4 ^ SHUFFLE_DOMAIN);
        rng.set_stream(epoch);
        let bijection = Bijection::new(50, &mut rng);
        let windowed = BatchSchedule::new(50, &opts, WholeShuffle::Bijection).epoch_order(epoch);
        assert_eq!(windowed, EpochOrder::Computed(bijection));
        assert!(matches!(schedule(50, &opts).epoch_order(epoch), EpochOrder::Listed(_)));
    }
    // Off and a buffer are the same for both.
    for shuffle in [Shuffle::Off, buf(7)] {
        let opts = options(4, shuffle, 10, false);
        let windowed = BatchSchedule::new(50, &opts, WholeShuffle::Bijection).epoch_order(2);
        assert_eq!(listed(windowed, 50), listed(schedule(50, &opts).epoch_order(2), 50), "{shuffle:?}");
    }
    let first = |data| take(&data, &options(4, Shuffle::Full, 10, false), Cursor::default(), 1).concat();
    assert_eq!(first(windows(50)), listed(BatchSchedule::new(50, &opts, WholeShuffle::Bijection).epoch_order(0), 10));
    assert_eq!(first(dataset(50)), listed(schedule(50, &opts).epoch_order(0), 10));
}

/// The shuffle buffer as `tf.data` describes it, written as a lazy stream over its input.
struct ReferenceBuffer<I: Iterator<Item = usize>> {
    input: I,
    slots: Vec<usize>,
    rng: ChaCha8Rng,
}

impl<I: Iterator<Item = usize>> Iterator for ReferenceBuffer<I> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let k = below(&mut self.rng, self.slots.len());
        let out = self.slots[k];
        match self.input.next() {
            Some(refill) => self.slots[k] = refill,
            None => {
                let last = self.slots.pop()?;
                if k < self.slots.len() {
                    self.slots[k] = last;
                }
            }
        }
        Some(out)
    }
}

#[test]
fn shuffle_buffer_matches_the_reference() {
    for (n, b) in [(1, 1), (10, 1), (10, 3), (50, 7), (50, 50), (50, 80), (1000, 64)] {
        for epoch in 0..3 {
            let opts = options(5, buf(b), 1, false);
            let ours = listed(schedule(n, &opts).epoch_order(epoch), n);
            let mut rng = ChaCha8Rng::seed_from_u64(5 ^ SHUFFLE_DOMAIN);
            rng.set_stream(epoch);
            let mut input = 0..n;
            let slots = input.by_ref().take(b).collect();
            let reference: Vec<usize> = ReferenceBuffer { input, slots, rng }.collect();
            assert_eq!(ours, reference, "n={n} b={b} epoch={epoch}");
            // Example k enters the buffer after k - b + 1 outputs, so cannot come out earlier.
            for (pos, &k) in ours.iter().enumerate() {
                assert!(pos + b > k, "example {k} at {pos} with buffer {b}");
            }
        }
    }
    let identity = schedule(20, &options(5, buf(1), 1, false)).epoch_order(3);
    assert_eq!(listed(identity, 20), (0..20).collect::<Vec<_>>());
}

#[test]
fn full_shuffle_is_roughly_uniform() {
    // Where example 0 lands over many epochs: each of 8 positions about 1/8 of the time.
    let schedule = schedule(8, &options(3, Shuffle::Full, 1, false));
    let mut counts = [0u32; 8];
    for epoch in 0..8000 {
        let order = listed(schedule.epoch_order(epoch), 8);
        counts[order.iter().position(|&i| i == 0).unwrap()] += 1;
    }
    assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
}

#[test]
fn resume_from_any_cursor_continues_exactly() {
    let cases = [(Shuffle::Full, true), (buf(6), false), (Shuffle::Off, false), (Shuffle::Full, false)];
    for (data, (shuffle, drop_remainder)) in
        [dataset(50), windows(50)].into_iter().flat_map(|d| cases.map(|c| (d.clone(), c)))
    {
        let opts = options(11, shuffle, 8, drop_remainder);
        let whole = take(&data, &opts, Cursor::default(), 30);
        let mut p = Pipeline::new(data.clone(), &opts, Cursor::default()).unwrap();
        for k in 0..30 {
            let cursor = p.cursor();
            assert_eq!(take(&data, &opts, cursor, 30 - k), whole[k..], "from {cursor:?}");
            p.next_batch().unwrap();
        }
    }
}

#[test]
fn cursor_counts_examples_and_rolls_over_epochs() {
    let data = dataset(10);
    let mut p = Pipeline::new(data.clone(), &options(0, Shuffle::Off, 4, false), Cursor::default()).unwrap();
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(p.cursor());
        p.next_batch().unwrap();
    }
    let c = |epoch, offset| Cursor { epoch, offset };
    assert_eq!(seen, [c(0, 0), c(0, 4), c(0, 8), c(1, 0)]);
    // A cursor at the end of an epoch means the start of the next one.
    let p = Pipeline::new(data.clone(), &options(0, Shuffle::Off, 4, true), c(2, 8)).unwrap();
    assert_eq!(p.cursor(), c(3, 0));
    assert_eq!(p.batches_per_epoch(), 2);
    let err = Pipeline::new(data, &options(0, Shuffle::Off, 4, true), c(0, 11)).err().unwrap();
    assert!(err.to_string().starts_with("cursor offset 11 is past the 10 examples"));
}

#[test]
fn drop_remainder_both_ways() {
    let data = dataset(10);
    let sizes = |drop| -> Vec<usize> {
        take(&data, &options(4, Shuffle::Full, 4, drop), Cursor::default(), 6).iter().map(Vec::len).collect()
    };
    assert_eq!(sizes(true), [4, 4, 4, 4, 4, 4]);
    assert_eq!(sizes(false), [4, 4, 2, 4, 4, 2]);
    // With drop_remainder the epoch's first 8 positions are kept: the same examples as the
    // unbatched order's first 8, and the 2 dropped ones change from epoch to epoch.
    let keep = take(&data, &options(4, Shuffle::Full, 4, true), Cursor::default(), 4);
    let whole = take(&data, &options(4, Shuffle::Full, 4, false), Cursor::default(), 6);
    assert_eq!(keep[..2], whole[..2]);
    assert_eq!(keep[2..], whole[3..5]);
    let dropped = |epoch: &[Vec<usize>]| {
        let mut all: Vec<usize> = epoch.concat();
        all.sort_unstable();
        (0..10).filter(|i| all.binary_search(i).is_err()).collect::<Vec<_>>()
    };
    assert_ne!(dropped(&keep[..2]), dropped(&keep[2..]));
}

#[test]
fn shards_union_to_the_global_batch_in_order() {
    for (data, shuffle) in [(dataset(10), Shuffle::Full), (dataset(10), buf(3)), (windows(10), Shuffle::Full)] {
        for drop_remainder in [false, true] {
            let global = take(&data, &options(8, shuffle, 4, drop_remainder), Cursor::default(), 9);
            for count in 1..=4 {
                let count = NonZeroUsize::new(count).unwrap();
                let workers: Vec<Vec<Vec<usize>>> = (0..count.get())
                    .map(|i| {
                        let mut opts = options(8, shuffle, 4, drop_remainder);
                        opts.shard = Shard::new(i, count).unwrap();
                        take(&data, &opts, Cursor::default(), 9)
                    })
                    .collect();
                for (step, want) in global.iter().enumerate() {
                    let rebuilt: Vec<usize> =
                        (0..want.len()).map(|pos| workers[pos % count][step][pos / count]).collect();
                    assert_eq!(&rebuilt, want, "step {step} of {count} shards");
                    let total: usize = workers.iter().map(|w| w[step].len()).sum();
                    assert_eq!(total, want.len());
                }
            }
        }
    }
}

#[test]
fn short_batches_can_leave_a_worker_empty_without_hanging() {
    let data = dataset(9);
    let mut opts = options(1, Shuffle::Off, 4, false);
    opts.shard = Shard::new(3, NonZeroUsize::new(4).unwrap()).unwrap();
    let mut p = Pipeline::new(data, &opts, Cursor::default()).unwrap();
    let ns: Vec<(usize, usize)> = (0..6)
        .map(|_| {
            let b = p.next_batch().unwrap();
            (b.n, b.global_n)
        })
        .collect();
    assert_eq!(ns, [(1, 4), (1, 4), (0, 1), (1, 4), (1, 4), (0, 1)]);
}

#[test]
fn values_are_bytes_over_255() {
    let data = dataset(300);
    let batch =
        Pipeline::new(data, &options(0, Shuffle::Off, 300, true), Cursor::default()).unwrap().next_batch().unwrap();
    for (i, pair) in batch.x.chunks(2).enumerate() {
        assert_eq!(pair[0], (i % 256) as f32 / 255.0);
        assert!((0.0..=1.0).contains(&pair[1]));
    }
}

#[test]
fn dropping_the_pipeline_stops_its_thread() {
    let data = dataset(1000);
    for prefetch in [0, 1, 4] {
        let mut opts = options(0, Shuffle::Full, 10, true);
        opts.prefetch = prefetch;
        let mut p = Pipeline::new(data.clone(), &opts, Cursor::default()).unwrap();
        p.next_batch().unwrap();
        // Let the producer fill the queue and block on it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(Arc::strong_count(&data), 2);
        drop(p);
        // The thread held the other reference; joined means released.
        assert_eq!(Arc::strong_count(&data), 1);
    }
    // Never consumed at all.
    drop(Pipeline::new(data.clone(), &options(0, Shuffle::Off, 10, true), Cursor::default()));
    assert_eq!(Arc::strong_count(&data), 1);
}

#[test]
fn impossible_setups_are_errors() {
    let err = Pipeline::new(dataset(10), &options(0, Shuffle::Off, 11, true), Cursor::default()).err();
    assert_eq!(
        err.map(|e| e.to_string()).unwrap_or_default(),
        "the global batch (11) is larger than the 10 training examples and \
         `data.drop_remainder = true` drops it whole; use a batch of at most 10 or \
         `drop_remainder = false`"
    );
    let ok = take(&dataset(10), &options(0, Shuffle::Off, 11, false), Cursor::default(), 2);
    assert_eq!(ok, [(0..10).collect::<Vec<_>>(), (0..10).collect()]);
    let mut greedy = options(0, Shuffle::Off, 1, false);
    greedy.prefetch = 1 << 40;
    let err = Pipeline::new(dataset(10), &greedy, Cursor::default()).err();
    assert!(matches!(err, Some(DataError::PrefetchTooLarge { max: 64, .. })));
    let empty = Pipeline::new(dataset(0), &options(0, Shuffle::Full, 1, false), Cursor::default());
    assert!(matches!(empty.err(), Some(DataError::EmptyTrainingSet)));
}

#[test]
fn eval_walks_the_split_in_order_sharded() {
    let data = dataset(10);
    let split = data.test.as_ref().unwrap();
    let g = NonZeroUsize::new(4).unwrap();
    let all: Vec<Vec<usize>> = EvalBatches::new(split, g, Shard::WHOLE).map(|b| indices(&b)).collect();
    assert_eq!(all, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    assert_eq!(EvalBatches::new(split, g, Shard::WHOLE).count(), 3);
    let three = NonZeroUsize::new(3).unwrap();
    let last = Shard::new(2, three).unwrap();
    let mine: Vec<Vec<usize>> = EvalBatches::new(split, g, last).map(|b| indices(&b)).collect();
    assert_eq!(mine, [vec![2], vec![6], vec![]]);
}

#[test]
fn shuffle_from_spec() {
    assert_eq!(Shuffle::from_buffer_size(None), Shuffle::Full);
    assert_eq!(Shuffle::from_buffer_size(Some(0)), Shuffle::Off);
    assert_eq!(Shuffle::from_buffer_size(Some(64)), buf(64));
}

#[test]
fn a_shuffle_buffer_holds_its_size_not_the_epoch_and_starts_at_any_position() {
    let opts = options(5, buf(64), 1, false);
    let n = 10_000;
    let whole = listed(schedule(n, &opts).epoch_order(1), n);
    // Batches of 7 read one after the other, as a run reads them.
    let mut order = schedule(n, &opts).epoch_order(1);
    let batches: Vec<usize> = (0..n).step_by(7).flat_map(|s| order.take(s..(s + 7).min(n))).collect();
    assert_eq!(batches, whole);
    // A resumed run's first batch, and a position behind the last one read.
    for start in [0, 1, 4_999, 9_996] {
        let end = (start + 7).min(n);
        assert_eq!(schedule(n, &opts).epoch_order(1).take(start..end), whole[start..end], "from {start}");
    }
    assert_eq!(order.take(3..5), whole[3..5]);
    // Over the windows of a corpus (one per token, 50 million), through the pipeline: the
    // buffer is all that is held (an epoch's list would be 400 MB).
    let corpus = 50_000_000;
    let EpochOrder::Buffered(mut buffer) = BatchSchedule::new(corpus, &opts, WholeShuffle::Bijection).epoch_order(0)
    else {
        panic!("a shuffle buffer lists nothing")
    };
    let first = buffer.take(0..1_000);
    assert!(first.iter().all(|&i| i < 1_000 + 64), "{first:?}");
    assert_eq!(buffer.take(1_000_000..1_000_001).len(), 1);
    assert_eq!(buffer.held(), 64);
    let data = windows(100_000);
    let got = take(&data, &options(5, buf(64), 1000, false), Cursor::default(), 3).concat();
    let mut reference = schedule(100_000, &opts).epoch_order(0);
    assert_eq!(got, reference.take(0..3000));
}

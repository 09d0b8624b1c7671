//! The split seam: every source ([`DataSource`](super::DataSource)) gives its splits as
//! [`Examples`], read by index into a [`Batch`] as `f32` features of any shape and labels of
//! one [`LabelKind`]. The pipeline, the evaluator and the strategies see only a [`Split`]; a
//! source whose examples are read in a new way brings a new `Examples`.

use super::error::DataError;
use super::pipeline::Batch;
use super::source::tfrecord::Order;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// What a dataset's labels are, which decides the model's output and how the loss reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LabelKind {
    /// One class index per example, below `classes`.
    Class { classes: u32 },
    /// `width` float targets per example (regression).
    Target { width: usize },
    /// One class index per position, `len` positions per example, labels shaped like the
    /// inputs (a language model's next tokens).
    Sequence { classes: u32, len: usize },
}

impl LabelKind {
    /// Values in one row of the model's output that the loss reads: classes, or targets.
    pub fn row_width(&self) -> usize {
        match *self {
            LabelKind::Class { classes } | LabelKind::Sequence { classes, .. } => classes as usize,
            LabelKind::Target { width } => width,
        }
    }

    /// Rows of output per example, each a loss term: the positions of a sequence, else 1.
    pub fn rows_per_example(&self) -> usize {
        match *self {
            LabelKind::Class { .. } | LabelKind::Target { .. } => 1,
            LabelKind::Sequence { len, .. } => len,
        }
    }

    /// Values the model outputs per example.
    pub fn outputs(&self) -> usize {
        self.row_width() * self.rows_per_example()
    }

    /// The classes, when labels are classes.
    pub fn classes(&self) -> Option<u32> {
        match *self {
            LabelKind::Class { classes } | LabelKind::Sequence { classes, .. } => Some(classes),
            LabelKind::Target { .. } => None,
        }
    }
}

/// How the training pipeline shuffles a split whole (`Shuffle::Full`) each data-epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WholeShuffle {
    /// Fisher–Yates over a list of every index: a uniform permutation, 8 bytes per example.
    /// Sources of examples (images, table rows) keep it: their examples cost far more than 8
    /// bytes each, and their runs' results stay as they were.
    FisherYates,
    /// A seeded bijection evaluated per position ([`Bijection`](super::bijection::Bijection)):
    /// a few words whatever the count. Token windows take it: one window per token, so a list
    /// would cost 8 bytes per token, more than the tokens themselves.
    Bijection,
}

/// One split of a source, read by example index. Sources held in memory validate their data
/// when loaded, so reading an example in range cannot fail for them; sources that decode
/// lazily (image folders) find a bad file only when they read it, and say so as an error.
pub trait Examples: Send + Sync + fmt::Debug {
    /// Number of examples.
    fn len(&self) -> usize;

    /// The shape of one example's features (images: height, width, channels; text: positions).
    fn shape(&self) -> &[usize];

    /// Appends example `i`'s features to `batch.x` and its labels to `batch.y` (class indices:
    /// one, or one per position) or `batch.targets` (floats). `i` is below [`Examples::len`].
    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError>;

    /// Appends examples `indices`, in this order. Sources whose examples are costly to decode
    /// override it to decode them in parallel.
    fn append_many(&self, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        indices.iter().try_for_each(|&i| self.append(i, batch))
    }

    /// Appends examples `indices` as the training pipeline reads them in data-epoch `epoch`:
    /// the same as [`Examples::append_many`] except for a split with random augmentation,
    /// which draws it from the epoch and each index.
    fn append_many_in_epoch(&self, epoch: u64, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        let _ = epoch;
        self.append_many(indices, batch)
    }

    /// Heap bytes held (memory-mapped files count nothing).
    fn bytes_held(&self) -> usize;

    /// Loss terms (rows of labels) per example: a sequence's positions; 1 by default.
    fn rows_per_example(&self) -> usize {
        1
    }

    /// How the pipeline shuffles this split whole: Fisher–Yates by default.
    fn whole_shuffle(&self) -> WholeShuffle {
        WholeShuffle::FisherYates
    }

    /// A split read only in order (TFRecord files, Parquet row groups) gives its stream here,
    /// and the training pipeline streams each epoch through a shuffle buffer instead of
    /// reading by index.
    fn records(&self) -> Option<&dyn StreamSplit> {
        None
    }

    /// What this split does to each example of its stream ([`Examples::records`]), applied to
    /// `batch.x` as the pipeline read it: the examples at `positions` of data-epoch `epoch`'s
    /// stream, whose random augmentation is drawn from the epoch and the position. Nothing for
    /// a split that reads its stream as it is.
    fn transform_streamed(&self, epoch: u64, positions: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        let _ = (epoch, positions, batch);
        Ok(())
    }
}

/// A split read only in order ([`Examples::records`]): its examples come in shard units (a
/// TFRecord file, a Parquet row group), read unit after unit or through a shuffle buffer. The
/// pipeline resumes a stream exactly by replaying its epoch up to the cursor
/// ([`StreamReader::skip`]), so a unit's examples must come out in the same order every time.
pub trait StreamSplit: Send + Sync + fmt::Debug {
    /// Examples in each shard unit, in order (what the `file` policy deals out to workers).
    fn unit_lens(&self) -> &[usize];

    /// The examples of units `units` (indices, in this order), in `order`.
    fn open_units(&self, units: &[usize], order: Order) -> Box<dyn StreamReader>;

    /// The error for a stream that ends before the count its units had when the run started.
    fn ended_early(&self) -> DataError;

    /// The error for a stream that cannot be read as asked (`problem` says why and what to do).
    fn refused(&self, problem: String) -> DataError;
}

/// One pass over some units of a [`StreamSplit`]: examples are taken one by one (cheaply,
/// not decoded yet) and decoded into a batch together.
pub trait StreamReader: Send {
    /// Skips the next `k` examples without decoding them where the format allows; returns how
    /// many were skipped (fewer than `k` only at the end of the stream).
    fn skip(&mut self, k: usize) -> Result<usize, DataError>;

    /// Takes the next example, to be decoded by [`StreamReader::decode`]; `false` once the
    /// stream has ended.
    fn take(&mut self) -> Result<bool, DataError>;

    /// Appends the examples taken since the last call to `batch`, in order.
    fn decode(&mut self, batch: &mut Batch) -> Result<(), DataError>;
}

/// A split (train or test) of a dataset, shared by the pipeline threads.
#[derive(Debug, Clone)]
pub struct Split {
    examples: Arc<dyn Examples>,
}

impl Split {
    /// A split of `examples`.
    pub fn of(examples: impl Examples + 'static) -> Self {
        Self { examples: Arc::new(examples) }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// True when the split has no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one example's features.
    pub fn shape(&self) -> &[usize] {
        self.examples.shape()
    }

    /// Values in one example's features.
    pub fn example_len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Loss terms per example: a sequence's positions, else 1.
    pub fn rows_per_example(&self) -> usize {
        self.examples.rows_per_example()
    }

    /// How the pipeline shuffles this split whole (see [`Examples::whole_shuffle`]).
    pub fn whole_shuffle(&self) -> WholeShuffle {
        self.examples.whole_shuffle()
    }

    /// Appends examples `indices` to `batch` (see [`Examples::append_many`]).
    pub fn append_many(&self, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.examples.append_many(indices, batch)
    }

    /// Appends examples `indices` as read in training data-epoch `epoch` (see
    /// [`Examples::append_many_in_epoch`]).
    pub fn append_many_in_epoch(&self, epoch: u64, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.examples.append_many_in_epoch(epoch, indices, batch)
    }

    /// Examples `range` as one batch, in order (for tools, tests and `predict`'s replicas;
    /// training reads through the pipeline).
    pub fn read(&self, range: std::ops::Range<usize>) -> Result<Batch, DataError> {
        let indices: Vec<usize> = range.filter(|&i| i < self.len()).collect();
        let mut batch = Batch {
            n: indices.len(),
            global_n: indices.len(),
            rows_per_example: self.rows_per_example(),
            ..Batch::default()
        };
        batch.x.reserve(indices.len() * self.example_len());
        self.append_many(&indices, &mut batch)?;
        Ok(batch)
    }

    /// Heap bytes held by this split.
    pub fn bytes_held(&self) -> usize {
        self.examples.bytes_held()
    }

    /// The stream of a split read only in order (see [`Examples::records`]).
    pub fn records(&self) -> Option<&dyn StreamSplit> {
        self.examples.records()
    }

    /// Transforms examples read from this split's stream (see [`Examples::transform_streamed`]).
    pub fn transform_streamed(&self, epoch: u64, positions: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.examples.transform_streamed(epoch, positions, batch)
    }
}

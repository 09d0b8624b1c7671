//! Datasets and the input pipeline: IDX files ([`idx`]), where they live and how they are
//! fetched ([`sources`], [`download`]), a seeded synthetic dataset ([`synthetic`]), and a
//! deterministic, sharded, prefetching batcher with `tf.data` semantics ([`pipeline`]); readers
//! for the formats users bring (NumPy, CSV, image folders, TFRecord, CIFAR: [`formats`]).
//!
//! Images stay `u8` in memory (MNIST train + test: 55 MB); only the batch being handed out is
//! `f32`, so a training process stays far under its memory budget.
//!
//! Typical use at the edge:
//! ```no_run
//! # use trainrun::data::*;
//! # fn main() -> Result<(), DataError> {
//! let dir = DataDirs::from_process_env().resolve(None, "mnist").ok_or(DataError::NoDataDir { dataset: "mnist" })?;
//! let source = Source::Preset { preset: Preset::mnist(), dir };
//! source.fetch_missing(&Fetcher::default())?;
//! let data = std::sync::Arc::new(source.load()?);
//! # Ok(()) }
//! ```

pub mod download;
mod error;
pub mod formats;
pub mod idx;
pub mod pipeline;
mod shard;
pub mod sources;
pub mod synthetic;

pub use download::{Checksum, Fetcher, RemoteFile};
pub use error::{DataError, FileFailure, Position, UnknownName};
pub use pipeline::{Batch, Cursor, EvalBatches, Pipeline, PipelineOptions, Shuffle};
pub use shard::Shard;
pub use sources::{DataDirs, IdxFiles, Preset, Source};
pub use synthetic::SyntheticConfig;

/// The shape of one example: height × width × channels (NHWC without the N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ExampleShape {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl ExampleShape {
    /// Values in one example (`height × width × channels`).
    pub fn len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// True when an example holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the planner needs to know about a dataset without loading it (`trainrun check`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DataFacts {
    pub train_examples: usize,
    /// `0` when the dataset has no test split.
    pub test_examples: usize,
    pub example_shape: ExampleShape,
    pub classes: u32,
    /// Training files, for the `file` shard policy (which needs one per worker at least).
    /// `0` for the synthetic dataset: it is generated in memory, so there are none to split.
    pub train_files: usize,
}

/// One split (train or test): images as `u8`, NHWC, and one label per image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    images: idx::IdxArray,
    labels: idx::IdxArray,
    shape: ExampleShape,
}

impl Split {
    /// A split from an IDX images array (3-D or 4-D) and labels array (1-D). The caller has
    /// already checked that the counts agree.
    pub(crate) fn new(images: idx::IdxArray, labels: idx::IdxArray, shape: ExampleShape) -> Self {
        Self { images, labels, shape }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.data().len()
    }

    /// True when the split has no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one example.
    pub fn shape(&self) -> ExampleShape {
        self.shape
    }

    /// All images, NHWC, one byte per value.
    pub fn images(&self) -> &[u8] {
        self.images.data()
    }

    /// All labels.
    pub fn labels(&self) -> &[u8] {
        self.labels.data()
    }

    /// Image `i` (`shape().len()` bytes); empty when `i` is out of range.
    pub fn image(&self, i: usize) -> &[u8] {
        let len = self.shape.len();
        self.images().get(i * len..(i + 1) * len).unwrap_or_default()
    }

    /// Heap bytes held by this split.
    pub fn bytes_held(&self) -> usize {
        self.images.bytes_held() + self.labels.bytes_held()
    }
}

/// A loaded dataset: the training split, the test split when there is one, and the classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub train: Split,
    pub test: Option<Split>,
    pub classes: u32,
}

impl Dataset {
    /// What the planner needs, from the loaded data.
    pub fn facts(&self, train_files: usize) -> DataFacts {
        DataFacts {
            train_examples: self.train.len(),
            test_examples: self.test.as_ref().map_or(0, Split::len),
            example_shape: self.train.shape(),
            classes: self.classes,
            train_files,
        }
    }

    /// Heap bytes held by both splits.
    pub fn bytes_held(&self) -> usize {
        self.train.bytes_held() + self.test.as_ref().map_or(0, Split::bytes_held)
    }
}

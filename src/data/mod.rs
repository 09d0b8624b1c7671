//! Datasets and the input pipeline: the sources, one file per `data.dataset` behind the
//! [`DataSource`] trait, each reading its own file format ([`source`]); where their files live
//! and how published ones are fetched ([`DataDirs`], [`download`]); and a deterministic,
//! sharded, prefetching batcher with `tf.data` semantics ([`pipeline`]) over the splits they
//! load ([`Examples`]).
//!
//! Images stay `u8` in memory (MNIST train + test: 55 MB); only the batch being handed out is
//! `f32`, so a training process stays far under its memory budget.
//!
//! Typical use at the edge:
//! ```no_run
//! # use trainrun::data::*;
//! # fn main() -> Result<(), DataError> {
//! let dir = DataDirs::from_process_env().resolve(None, "mnist").ok_or(DataError::NoDataDir { dataset: "mnist" })?;
//! let source = MnistSource { preset: Preset::mnist(), dir, cache: None };
//! source.fetch_missing(&Fetcher::default())?;
//! let data = std::sync::Arc::new(source.load()?);
//! # Ok(()) }
//! ```

mod arrays;
mod bijection;
mod dirs;
pub mod download;
mod error;
pub mod examples;
pub mod formats;
pub mod images;
pub mod pipeline;
pub mod preprocess;
mod shard;
pub mod source;
mod streamed;
pub(crate) mod unlabeled;
pub mod windows;

pub use dirs::DataDirs;
pub use download::{Checksum, Fetcher, RemoteFile};
pub use error::{DataError, FileFailure, Position, UnknownName};
pub use examples::{Examples, LabelKind, Split, WholeShuffle};
pub use pipeline::{Batch, Cursor, EvalBatches, Pipeline, PipelineOptions, Shuffle};
pub use preprocess::{Normalization, Preprocessing, PreprocessingConfig};
pub use shard::Shard;
pub use source::cifar::LabelMode;
pub use source::csv::CsvLabels;
pub use source::image_folder::ColorMode;
pub use source::npy::NpyPair;
pub use source::text::{Encoding, Tokenization, TokenizerDecoder, TokenizerJson, Vocabulary, VocabularyFrom};
pub use source::tfrecord::{TfRecordCompression, TfRecordEncoding};
pub use source::tokens::TokenDtype;
pub use source::{
    AnySource, Cifar100Config, CifarSource, CsvConfig, CsvSource, DataSource, HfDatasetsConfig, HfDatasetsSource,
    IdxFiles, IdxSource, ImageFolderConfig, ImageFolderSource, JsonlConfig, JsonlSource, JsonlTable, JsonlText,
    MnistSource, NpyConfig, NpySource, ParquetConfig, ParquetSource, ParquetTable, ParquetText, Preset, RawValues,
    SyntheticConfig, SyntheticSource, TextConfig, TextSource, TfRecordConfig, TfRecordSource, TokensConfig,
    TokensSource,
};
pub use unlabeled::Unlabeled;

/// The shape of one image: height × width × channels (NHWC without the N).
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

    /// `[height, width, channels]`.
    pub fn dims(&self) -> Vec<usize> {
        vec![self.height, self.width, self.channels]
    }
}

/// What the planner needs to know about a dataset without loading it (`trainrun check`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DataFacts {
    pub train_examples: usize,
    /// `0` when the dataset has no test split.
    pub test_examples: usize,
    /// The shape of one example's features (images: height, width, channels).
    pub example_shape: Vec<usize>,
    /// What the labels are: classes, float targets, or a class per position.
    pub labels: LabelKind,
    /// Training files, for the `file` shard policy (which needs one per worker at least).
    /// `0` for the synthetic dataset: it is generated in memory, so there are none to split.
    pub train_files: usize,
    /// What looks wrong in data that can still train (one class only): the plan shows each
    /// as a warning, at `check` and at a run's start.
    #[serde(skip)]
    pub warnings: Vec<DataWarning>,
}

/// Data that trains but probably not as meant, found while reading its facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataWarning {
    /// The spec key to look at (`data.csv.label`).
    pub key: String,
    /// What was found, with the values.
    pub message: String,
    /// What to do about it.
    pub help: String,
}

impl DataWarning {
    /// Every training example in `path` has the class `name` (`key` names the labels).
    pub fn one_class(key: &str, path: &std::path::Path, name: &str) -> Self {
        Self {
            key: key.into(),
            message: format!(
                "every training label in {} is `{name}`: a classifier of one class has nothing to learn, \
                 and its accuracy of 1.0 means nothing",
                path.display()
            ),
            help: "check the labels and that the file is the whole training set; a classifier needs examples \
                   of two classes at least"
                .into(),
        }
    }
}

/// A loaded dataset: the training split, the test split when there is one, and what the
/// labels are.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub train: Split,
    pub test: Option<Split>,
    pub labels: LabelKind,
    /// How token ids map back to text, for text sources (written as `vocab.json`).
    pub vocabulary: Option<Vocabulary>,
    /// The names of the classes, when labels were names (written as `classes.json`).
    pub classes: Option<formats::Classes>,
}

impl Dataset {
    /// What the planner needs, from the loaded data.
    pub fn facts(&self, train_files: usize) -> DataFacts {
        DataFacts {
            train_examples: self.train.len(),
            test_examples: self.test.as_ref().map_or(0, Split::len),
            example_shape: self.train.shape().to_vec(),
            labels: self.labels,
            train_files,
            warnings: vec![],
        }
    }

    /// Heap bytes held by both splits.
    pub fn bytes_held(&self) -> usize {
        self.train.bytes_held() + self.test.as_ref().map_or(0, Split::bytes_held)
    }
}

//! Where examples come from: one file per source, named as `data.dataset` names it, each a type
//! implementing [`DataSource`]; a source's file format is read in the same file, or under the
//! folder of its name when it needs more than one (`npy/`, `image_folder/`, `cifar/`,
//! `tfrecord/`, `jsonl/`, `parquet/`, `hf_datasets/`); what the two columnar sources share is
//! in `columnar/`.
//!
//! | `data.dataset` | file | type | `[data.<kind>]` table |
//! |---|---|---|---|
//! | `mnist`, `fashion_mnist` | [`mnist`] | [`MnistSource`] (a [`Preset`]) | none |
//! | `idx` | [`idx`] | [`IdxSource`] | `[data.files]` ([`IdxFiles`]) |
//! | `synthetic` | [`synthetic`] | [`SyntheticSource`] | [`SyntheticConfig`] |
//! | `text` | [`text`] | [`TextSource`] | [`TextConfig`] |
//! | `tokens` | [`tokens`] | [`TokensSource`] | [`TokensConfig`] |
//! | `csv` | [`csv`] | [`CsvSource`] | [`CsvConfig`] |
//! | `npy` | [`npy`] | [`NpySource`] | [`NpyConfig`] |
//! | `image_folder` | [`image_folder`] | [`ImageFolderSource`] | [`ImageFolderConfig`] |
//! | `cifar10`, `cifar100` | [`cifar`] | [`CifarSource`] | [`Cifar100Config`] |
//! | `tfrecord` | [`tfrecord`] | [`TfRecordSource`] | [`TfRecordConfig`] |
//! | `jsonl` | [`jsonl`] | [`JsonlSource`] | [`JsonlConfig`] |
//! | `parquet` | [`parquet`] | [`ParquetSource`] | [`ParquetConfig`] |
//! | `hf_datasets` | [`hf_datasets`] | [`HfDatasetsSource`] | [`HfDatasetsConfig`] |
//!
//! Adding a source touches four files and one generated file: its file here (the type, its
//! `impl DataSource`, its `[data.<kind>]` table) and its `mod` line below; its `DatasetKind`
//! variant and table field in `src/spec/data.rs`; its arm in `plan::source`
//! (`src/plan/data.rs`), the one exhaustive match from the spec's name to a source; and
//! `schemas/trainrun.schema.json`, regenerated (`trainrun schema`).
//!
//! A trait object rather than an enum: the plan holds an [`AnySource`] (a shared
//! `dyn DataSource`), so a new source adds no variant and no arm here. The plan stays
//! comparable through [`SameSource`], which every `PartialEq` source gets for free.
//!
//! What a source answers and what it does not: it knows its files (missing ones, fetching
//! them), its facts without loading (sizes, example shape, label kind, and `train_files`,
//! which decides what `auto_shard_policy = "auto"` picks), how to load its splits, what its
//! values are (for `[data.preprocessing]`), and whether it is a stream shuffled by its own
//! buffer. How a split is read is the split's business
//! ([`Examples`](super::examples::Examples)): by index, or, for a split read only in order, as
//! a stream that the pipeline replays up to the cursor on resume (`Examples::records`).
//!
//! A streamed source of files (TFRecord, Parquet) counts its examples from footers or a framing
//! pass in `facts` and gives its shard units in `train_files` (files, or row groups), its
//! buffer in `stream_shuffle`, and its splits' streams through `Examples::records` (a
//! [`StreamSplit`](super::examples::StreamSplit)), whose units the pipeline deals to workers
//! and replays up to the cursor on resume: (file, row group, row) for Parquet.

pub mod cifar;
mod columnar;
pub mod csv;
pub mod hf_datasets;
pub mod idx;
pub mod image_folder;
pub mod jsonl;
pub mod mnist;
pub mod npy;
pub mod parquet;
pub mod synthetic;
pub mod text;
pub mod tfrecord;
pub mod tokens;

pub use cifar::{Cifar100Config, CifarSource};
pub use csv::{CsvConfig, CsvSource};
pub use hf_datasets::{HfDatasetsConfig, HfDatasetsSource};
pub use idx::{IdxFiles, IdxSource};
pub use image_folder::{ImageFolderConfig, ImageFolderSource};
pub use jsonl::{JsonlConfig, JsonlSource, JsonlTable, JsonlText};
pub use mnist::{MnistSource, Preset};
pub use npy::{NpyConfig, NpySource};
pub use parquet::{ParquetConfig, ParquetSource, ParquetTable, ParquetText};
pub use synthetic::{SyntheticConfig, SyntheticSource};
pub use text::{TextConfig, TextSource};
pub use tfrecord::{TfRecordConfig, TfRecordSource};
pub use tokens::{TokensConfig, TokensSource};

use super::download::Fetcher;
use super::error::DataError;
use super::pipeline::Shuffle;
use super::{DataFacts, Dataset};
use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every data source answers, from the spec's table and its folder, for `trainrun check`
/// (facts, missing files) and for a run (fetching, loading).
pub trait DataSource: fmt::Debug + Send + Sync + SameSource {
    /// The dataset's name, as `data.dataset` spells it (`mnist`, `cifar100`, `csv`).
    fn name(&self) -> &'static str;

    /// The folder the files are read from; `None` for generated data.
    fn dir(&self) -> Option<&Path>;

    /// Files (folders end in `/`) the source needs that are not there, as the spec or the
    /// publisher names them. Only checks that they exist.
    fn missing_files(&self) -> Vec<String>;

    /// Downloads the missing files of a published dataset; returns the paths written. A
    /// source of the user's own files has nothing to fetch: its missing files are the error
    /// of [`DataSource::facts`] or [`DataSource::load`].
    fn fetch_missing(&self, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
        let _ = fetcher;
        Ok(vec![])
    }

    /// Example counts, one example's shape, the label kind and the training files, read as
    /// cheaply as the format allows (headers, file sizes, a framing pass).
    fn facts(&self) -> Result<DataFacts, DataError>;

    /// Loads both splits: into memory, memory-mapped, or opened for streaming.
    fn load(&self) -> Result<Dataset, DataError>;

    /// What the examples' values are as loaded, which decides what `[data.preprocessing]`
    /// may do to them.
    fn raw_values(&self) -> RawValues;

    /// Reads `file` for `trainrun predict --input`: its examples as this source reads a test
    /// file, in file order, without labels (a prediction needs none; a file that holds them
    /// is read all the same). `file` is a path as the user gave it, not relative to
    /// `data.dir`. A source that reads no such file says so, naming the sources that do.
    fn read_input(&self, file: &Path) -> Result<super::Split, DataError> {
        Err(DataError::Unsupported {
            path: file.to_path_buf(),
            what: format!(
                "data.dataset = \"{}\" reads no --input files; predict over its test split instead (drop --input), \
                 or train on a source that reads them: {INPUT_SOURCES}",
                self.name()
            ),
        })
    }

    /// For a source read only in order (a stream), its own shuffle: a stream is shuffled by
    /// `data.<name>.shuffle_buffer`, never by `data.shuffle_buffer`. `None` for a source
    /// read by index.
    fn stream_shuffle(&self) -> Option<Shuffle> {
        None
    }
}

/// The sources whose [`DataSource::read_input`] reads a file, and what each reads.
pub const INPUT_SOURCES: &str = "csv (a table with the training table's feature columns), npy (a .npy array of \
     features), parquet (a file with the training files' feature columns), jsonl (objects with the training table's \
     feature fields), hf_datasets (a Dataset folder save_to_disk wrote, or one of its .arrow files, with the training \
     split's feature columns), tfrecord (a file of tf.train.Examples holding the image feature), image_folder (PNG or \
     JPEG files, or folders of them), cifar10 and cifar100 (a binary batch file), idx, mnist and fashion_mnist (an \
     IDX file of images)";

/// What a source's example values are, which decides what `data.preprocessing.rescale`
/// multiplies and whether the examples can be augmented as images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawValues {
    /// Image bytes, which the source already divides by 255.
    Bytes,
    /// Numbers as written in the file.
    Numbers,
    /// Arrays whose dtype only reading tells (`u8` is divided by 255, others are not).
    ArrayDtype,
    /// Token ids: nothing to scale or augment.
    Tokens,
}

/// Compares two sources whatever their types, so a plan that holds one stays `PartialEq`:
/// equal when both are the same type with equal fields. Every `PartialEq` type has it.
pub trait SameSource {
    /// The source, to be downcast by [`SameSource::same_as`].
    fn as_any(&self) -> &dyn Any;

    /// Whether `other` is a source of this type equal to this one.
    fn same_as(&self, other: &dyn Any) -> bool;
}

impl<T: PartialEq + 'static> SameSource for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn same_as(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
}

/// A source of any kind, shared: what the plan holds and the run loads. Derefs to the
/// [`DataSource`], so `source.load()` reads as on the source itself.
#[derive(Debug, Clone)]
pub struct AnySource(Arc<dyn DataSource>);

impl AnySource {
    /// `source`, shared.
    pub fn new(source: impl DataSource + 'static) -> Self {
        Self(Arc::new(source))
    }
}

impl std::ops::Deref for AnySource {
    type Target = dyn DataSource;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl PartialEq for AnySource {
    fn eq(&self, other: &Self) -> bool {
        let (a, b): (&dyn DataSource, &dyn DataSource) = (&*self.0, &*other.0);
        SameSource::same_as(a, SameSource::as_any(b))
    }
}

/// How a source whose files hold either documents or a table (`jsonl`, `parquet`) reads them:
/// the one group its section sets.
enum ReadAs<'a, Text, Table> {
    Text(&'a Text),
    Table(&'a Table),
}

/// A text-or-table source's section, named for [`TextOrTable::read_as`]'s errors.
struct TextOrTable {
    dataset: &'static str,
    /// What an empty `train` list lacks, e.g. "at least one file in data.jsonl.train".
    no_train: &'static str,
    /// The two groups, e.g. "data.jsonl.text (…) or data.jsonl.table (…)".
    neither: &'static str,
    example: &'static str,
}

impl TextOrTable {
    /// The error of a `predict --input` file for a source read as text: a language model's
    /// documents give no rows to predict one by one.
    fn no_text_input(&self, file: &Path) -> DataError {
        DataError::Unsupported {
            path: file.to_path_buf(),
            what: format!(
                "data.{}.text reads documents for a language model, which predict does not take (one row per \
                 example); generate text with `trainrun sample`",
                self.dataset
            ),
        }
    }

    /// The one of `text` and `table` the section sets, with at least one training file; `both`
    /// is the error when it sets both (each source words its own).
    fn read_as<'a, Text, Table>(
        &self,
        train: &[String],
        text: Option<&'a Text>,
        table: Option<&'a Table>,
        both: impl FnOnce() -> DataError,
    ) -> Result<ReadAs<'a, Text, Table>, DataError> {
        let missing = |section| DataError::MissingSection { dataset: self.dataset, section, example: self.example };
        if train.is_empty() {
            return Err(missing(self.no_train));
        }
        match (text, table) {
            (Some(text), None) => Ok(ReadAs::Text(text)),
            (None, Some(table)) => Ok(ReadAs::Table(table)),
            (None, None) => Err(missing(self.neither)),
            (Some(_), Some(_)) => Err(both()),
        }
    }
}

/// `Ok` when nothing is missing; else the error naming every missing file and the folder
/// they were looked for in.
fn require(dataset: &'static str, dir: &Path, missing: Vec<String>) -> Result<(), DataError> {
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DataError::MissingFiles { dataset, dir: dir.to_path_buf(), files: missing })
    }
}

/// The names among `names` that are not files in `dir` (absolute names stay as they are).
fn missing_in<'a>(dir: &Path, names: impl Iterator<Item = &'a String>) -> Vec<String> {
    names.filter(|n| !dir.join(n).is_file()).cloned().collect()
}

pub(super) fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// `names` under `dir`: each a file, or a glob pattern matching one or more files (sorted);
/// `bad` makes the source's error for a pattern that matches nothing.
pub(super) fn expand(dir: &Path, names: &[String], bad: fn(String) -> DataError) -> Result<Vec<PathBuf>, DataError> {
    let mut files = vec![];
    for name in names {
        if !is_pattern(name) {
            files.push(dir.join(name));
            continue;
        }
        let pattern = dir.join(name);
        let pattern_text = pattern.to_str().ok_or_else(|| bad(format!("{} is not UTF-8", pattern.display())))?;
        let matches = glob::glob(pattern_text).map_err(|e| bad(format!("`{name}` is not a glob pattern: {e}")))?;
        let mut found: Vec<PathBuf> = matches.filter_map(Result::ok).filter(|p| p.is_file()).collect();
        if found.is_empty() {
            return Err(bad(format!("`{name}` matches no file in {}; check data.dir and the pattern", dir.display())));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// Runs `a` here and `b` on a second thread, so the big training file and the test files
/// decode at the same time.
fn both<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|s| {
        let handle = s.spawn(b);
        let a = a();
        // A panic here is a bug in this module, not a user error: pass it on unchanged.
        let b = handle.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (a, b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn sources_compare_by_type_and_fields() {
        let config = SyntheticConfig::default();
        let synthetic =
            |config: &SyntheticConfig, seed| AnySource::new(SyntheticSource { config: config.clone(), seed });
        let a = synthetic(&config, 1);
        assert_eq!(a, synthetic(&config, 1));
        assert_ne!(a, synthetic(&config, 2));
        assert_ne!(a, synthetic(&SyntheticConfig { train_examples: NonZeroUsize::MIN, ..config.clone() }, 1));
        let mnist = AnySource::new(MnistSource { preset: Preset::mnist(), dir: "/d".into(), cache: None });
        assert_ne!(a, mnist);
        assert_eq!(mnist, mnist.clone());
        assert_eq!((a.name(), mnist.name()), ("synthetic", "mnist"));
    }
}

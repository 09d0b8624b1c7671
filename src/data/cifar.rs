//! The `cifar10` and `cifar100` sources: the binary CIFAR files, read whole by
//! [`formats::cifar`](super::formats::cifar) (150 MB of `u8` for the training split), divided
//! by 255 as batches are read. The `.bin` files are looked for in `data.dir` itself, then in
//! the folder the official archive unpacks to (`cifar-10-batches-bin`, `cifar-100-binary`);
//! when missing, the archive is downloaded there and checked against its SHA-256, as MNIST's
//! files are (not with `TRAINRUN_OFFLINE` set). The class names are written to
//! `classes.json`.

use super::arrays::{Arrays, classes_of, label_kind};
use super::download::Fetcher;
use super::error::DataError;
use super::examples::{LabelKind, Split};
use super::formats::cifar::{Cifar, Cifar100Label, CifarDataset, CifarPreset, CifarSplit};
use super::formats::{RandomAccess, io_error};
use super::{DataFacts, Dataset};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[data.cifar100]`: which of CIFAR-100's labels is the class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cifar100Config {
    /// `fine` (100 classes) or `coarse` (20 superclasses), as Keras'
    /// `cifar100.load_data(label_mode=…)`. Default: `"fine"`. Example: `label_mode = "coarse"`.
    #[serde(default)]
    pub label_mode: LabelMode,
}

/// `data.cifar100.label_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LabelMode {
    /// The 100 fine classes.
    #[default]
    Fine,
    /// The 20 coarse superclasses.
    Coarse,
}

impl Cifar100Config {
    /// The dataset this table describes.
    pub fn dataset(&self) -> CifarDataset {
        let label = match self.label_mode {
            LabelMode::Fine => Cifar100Label::Fine,
            LabelMode::Coarse => Cifar100Label::Coarse,
        };
        CifarDataset::Cifar100 { label }
    }
}

const SPLITS: [CifarSplit; 2] = [CifarSplit::Train, CifarSplit::Test];

/// The folder holding the `.bin` files: `dir` itself when it holds them all, else the
/// archive's folder under it.
pub fn files_dir(dir: &Path, dataset: CifarDataset) -> PathBuf {
    let direct = SPLITS.iter().flat_map(|&s| dataset.files(s)).all(|f| dir.join(f).is_file());
    if direct { dir.to_path_buf() } else { CifarPreset::of(dataset).files_dir(dir) }
}

/// The `.bin` files not yet in `dir` (nor in the archive's folder under it).
pub fn missing_files(dir: &Path, dataset: CifarDataset) -> Vec<String> {
    let files = files_dir(dir, dataset);
    SPLITS.iter().flat_map(|&s| dataset.files(s)).filter(|f| !files.join(f).is_file()).collect()
}

/// Downloads and unpacks the archive when a `.bin` file is missing; returns what was written.
pub fn fetch_missing(dir: &Path, dataset: CifarDataset, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
    if missing_files(dir, dataset).is_empty() {
        return Ok(vec![]);
    }
    CifarPreset::of(dataset).fetch_missing(dir, fetcher).map(|d| vec![d])
}

/// Examples of a split: from the files' sizes when they are there (a locally written file
/// may hold any number of records; [`load`] checks the sizes), else the published counts.
fn examples(dir: &Path, dataset: CifarDataset, split: CifarSplit) -> Result<usize, DataError> {
    let files = files_dir(dir, dataset);
    let mut total = 0;
    for name in dataset.files(split) {
        let path = files.join(&name);
        if !path.is_file() {
            return Ok(dataset.examples(split));
        }
        let len = std::fs::metadata(&path).map_err(io_error(&path))?.len();
        total += len as usize / dataset.record_len();
    }
    Ok(total)
}

/// Example counts, shape and classes, from file sizes only.
pub fn facts(dir: &Path, dataset: CifarDataset) -> Result<DataFacts, DataError> {
    Ok(DataFacts {
        train_examples: examples(dir, dataset, CifarSplit::Train)?,
        test_examples: examples(dir, dataset, CifarSplit::Test)?,
        example_shape: vec![32, 32, 3],
        labels: LabelKind::Class { classes: dataset.classes().len() },
        // Examples are sharded across workers: the `file` policy is not offered for CIFAR.
        train_files: 1,
    })
}

/// Reads both splits, on two threads.
pub fn load(dir: &Path, dataset: CifarDataset) -> Result<Dataset, DataError> {
    let files = files_dir(dir, dataset);
    let (train, test) = std::thread::scope(|s| {
        let test = s.spawn(|| Cifar::open(&files, dataset, CifarSplit::Test));
        let train = Cifar::open(&files, dataset, CifarSplit::Train);
        // A panic there is a bug in the reader, not a user error: pass it on unchanged.
        (train, test.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    });
    let (train, test) = (train?, test?);
    // One byte per value, in memory.
    let split = |c: Cifar| {
        let held = c.len() * c.example_len();
        Split::of(Arrays::new(c, held))
    };
    let (labels, classes) = (label_kind(train.labels()), classes_of(train.labels()));
    Ok(Dataset { train: split(train), test: Some(split(test)), labels, vocabulary: None, classes })
}

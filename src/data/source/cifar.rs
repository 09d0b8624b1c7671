//! The `cifar10` and `cifar100` sources: the binary CIFAR files, read whole (150 MB of `u8`
//! for the training split), divided by 255 as batches are read. The `.bin` files are looked
//! for in `data.dir` itself, then in the folder the official archive unpacks to
//! (`cifar-10-batches-bin`, `cifar-100-binary`); when missing, the archive is downloaded there
//! and checked against its SHA-256, as MNIST's files are (not with `TRAINRUN_OFFLINE` set).
//! The class names are written to `classes.json`.
//!
//! The format, read here too ([`Cifar`]): the "version suitable for C programs", fixed-size
//! records of label byte(s) then 3072 pixel bytes, the red plane, the green plane, then the
//! blue plane (each 32×32, row-major). CIFAR-10 has one label byte per record, in
//! `data_batch_1.bin`…`data_batch_5.bin` (train) and `test_batch.bin`; CIFAR-100 has a coarse
//! then a fine label byte, in `train.bin` and `test.bin`.
//!
//! A split is read whole (150 MB for the training set) and stored height × width × channels,
//! like every image in trainrun, so the planes are interleaved once at load.
//! [`CifarPreset`] downloads and unpacks the official archives.

mod names;
mod preset;
#[cfg(test)]
mod tests;

pub use preset::CifarPreset;

use super::{DataSource, RawValues, require};
use crate::data::arrays::{Arrays, classes_of, label_kind};
use crate::data::download::Fetcher;
use crate::data::error::{DataError, Position};
use crate::data::examples::{LabelKind, Split};
use crate::data::formats::dtype::widen_u8;
use crate::data::formats::{Classes, Dtype, Labels, RandomAccess, io_error};
use crate::data::{DataFacts, DataWarning, Dataset};
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

/// `data.dataset = "cifar10"` or `"cifar100"`: the binary files in `dir` or the archive's
/// folder under it.
#[derive(Debug, Clone, PartialEq)]
pub struct CifarSource {
    pub dir: PathBuf,
    pub dataset: CifarDataset,
}

impl DataSource for CifarSource {
    fn name(&self) -> &'static str {
        self.dataset.name()
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_files(&self.dir, self.dataset)
    }

    /// Downloads and unpacks the archive when a `.bin` file is missing.
    fn fetch_missing(&self, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
        fetch_missing(&self.dir, self.dataset, fetcher)
    }

    /// Example counts, shape and classes, from file sizes only.
    fn facts(&self) -> Result<DataFacts, DataError> {
        let (dir, dataset) = (&self.dir, self.dataset);
        Ok(DataFacts {
            train_examples: examples(dir, dataset, CifarSplit::Train)?,
            test_examples: examples(dir, dataset, CifarSplit::Test)?,
            example_shape: vec![32, 32, 3],
            labels: LabelKind::Class { classes: dataset.classes().len() },
            // Examples are sharded across workers: the `file` policy is not offered for CIFAR.
            train_files: 1,
            warnings: [CifarSplit::Train, CifarSplit::Test]
                .into_iter()
                .map(|split| unpublished_sizes(dir, dataset, split))
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        })
    }

    /// Reads both splits, on two threads.
    fn load(&self) -> Result<Dataset, DataError> {
        let files = files_dir(&self.dir, self.dataset);
        require(self.name(), &files, self.missing_files())?;
        let dataset = self.dataset;
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

    /// A binary batch file in the format of the training files (`data_batch_1.bin`,
    /// `test_batch.bin`; CIFAR-100's `test.bin`), its images divided by 255 as the test
    /// split's are; the labels every record holds are checked and not used.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        let (mut images, mut labels) = (vec![], vec![]);
        read_file(file, self.dataset, &self.dataset.classes(), &mut images, &mut labels)?;
        crate::data::Unlabeled::split(file, vec![SIDE, SIDE, 3], crate::data::unlabeled::scale_bytes(&images))
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Bytes
    }
}

const SPLITS: [CifarSplit; 2] = [CifarSplit::Train, CifarSplit::Test];

/// The folder holding the `.bin` files: `dir` itself when it holds them all, else the
/// archive's folder under it.
fn files_dir(dir: &Path, dataset: CifarDataset) -> PathBuf {
    let direct = SPLITS.iter().flat_map(|&s| dataset.files(s)).all(|f| dir.join(f).is_file());
    if direct { dir.to_path_buf() } else { CifarPreset::of(dataset).files_dir(dir) }
}

/// The `.bin` files not yet in `dir` (nor in the archive's folder under it).
fn missing_files(dir: &Path, dataset: CifarDataset) -> Vec<String> {
    let files = files_dir(dir, dataset);
    SPLITS.iter().flat_map(|&s| dataset.files(s)).filter(|f| !files.join(f).is_file()).collect()
}

/// Downloads and unpacks the archive when a `.bin` file is missing; returns what was written.
fn fetch_missing(dir: &Path, dataset: CifarDataset, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
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

/// A warning for each file of `split` whose record count is not the published file's
/// (10,000 per CIFAR-10 file, 50,000 and 10,000 for CIFAR-100's): a file cut short at a
/// record's end reads cleanly, and trained on 100 records with no word. A warning rather
/// than a refusal: a subset of one's own, written in the same format, is a fair thing to
/// train on (the tests do).
fn unpublished_sizes(dir: &Path, dataset: CifarDataset, split: CifarSplit) -> Result<Vec<DataWarning>, DataError> {
    let names = dataset.files(split);
    let published = dataset.examples(split) / names.len().max(1);
    let files = files_dir(dir, dataset);
    let mut warnings = vec![];
    for path in names.iter().map(|n| files.join(n)).filter(|p| p.is_file()) {
        let records = std::fs::metadata(&path).map_err(io_error(&path))?.len() as usize / dataset.record_len();
        if records != published {
            warnings.push(DataWarning {
                key: "data.dir".into(),
                message: format!(
                    "{} holds {records} records; the published {} file holds {published}",
                    path.display(),
                    dataset.name()
                ),
                help: "if it is the published file cut short, delete it and let trainrun fetch it again".into(),
            });
        }
    }
    Ok(warnings)
}

const SIDE: usize = 32;
const PIXELS: usize = SIDE * SIDE * 3;

/// Which CIFAR dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CifarDataset {
    Cifar10,
    /// CIFAR-100, labelled by its 100 fine classes or its 20 coarse superclasses.
    Cifar100 {
        label: Cifar100Label,
    },
}

/// Which of CIFAR-100's two labels is the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cifar100Label {
    Fine,
    Coarse,
}

/// The training or the test split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CifarSplit {
    Train,
    Test,
}

impl CifarDataset {
    /// As in `data.dataset`.
    pub fn name(self) -> &'static str {
        match self {
            CifarDataset::Cifar10 => "cifar10",
            CifarDataset::Cifar100 { .. } => "cifar100",
        }
    }

    /// The files of a split, in reading order.
    pub fn files(self, split: CifarSplit) -> Vec<String> {
        match (self, split) {
            (CifarDataset::Cifar10, CifarSplit::Train) => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            (CifarDataset::Cifar10, CifarSplit::Test) => vec!["test_batch.bin".into()],
            (CifarDataset::Cifar100 { .. }, CifarSplit::Train) => vec!["train.bin".into()],
            (CifarDataset::Cifar100 { .. }, CifarSplit::Test) => vec!["test.bin".into()],
        }
    }

    /// Examples in a split of the published files.
    pub fn examples(self, split: CifarSplit) -> usize {
        match split {
            CifarSplit::Train => 50_000,
            CifarSplit::Test => 10_000,
        }
    }

    /// The classes, named as in the archives' label-name files.
    pub fn classes(self) -> Classes {
        let names: &[&str] = match self {
            CifarDataset::Cifar10 => &names::CIFAR10,
            CifarDataset::Cifar100 { label: Cifar100Label::Fine } => &names::CIFAR100_FINE,
            CifarDataset::Cifar100 { label: Cifar100Label::Coarse } => &names::CIFAR100_COARSE,
        };
        Classes::from_names(names.iter().map(|n| n.to_string()).collect())
    }

    /// Bytes per record: the label bytes and the pixels.
    pub fn record_len(self) -> usize {
        self.label_layout().0 + PIXELS
    }

    /// Label bytes before the pixels of each record, and which of them is the class.
    fn label_layout(self) -> (usize, usize) {
        match self {
            CifarDataset::Cifar10 => (1, 0),
            CifarDataset::Cifar100 { label: Cifar100Label::Coarse } => (2, 0),
            CifarDataset::Cifar100 { label: Cifar100Label::Fine } => (2, 1),
        }
    }
}

/// One split of CIFAR in memory, as a [`RandomAccess`] dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Cifar {
    /// `n × 32 × 32 × 3` bytes.
    images: Vec<u8>,
    labels: Labels,
}

impl Cifar {
    /// Reads a split from `dir`, the folder holding the `.bin` files.
    pub fn open(dir: &Path, dataset: CifarDataset, split: CifarSplit) -> Result<Self, DataError> {
        let files = dataset.files(split);
        let missing: Vec<String> = files.iter().filter(|f| !dir.join(f).is_file()).cloned().collect();
        if !missing.is_empty() {
            return Err(DataError::MissingFiles { dataset: dataset.name(), dir: dir.to_path_buf(), files: missing });
        }
        let classes = dataset.classes();
        let (mut images, mut index) = (vec![], vec![]);
        for file in &files {
            read_file(&dir.join(file), dataset, &classes, &mut images, &mut index)?;
        }
        Ok(Self { images, labels: Labels::Classes { index, classes } })
    }
}

/// Appends one file's images (interleaved to height × width × channels) and labels.
fn read_file(
    path: &Path,
    dataset: CifarDataset,
    classes: &Classes,
    images: &mut Vec<u8>,
    index: &mut Vec<u32>,
) -> Result<(), DataError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let (label_bytes, which) = dataset.label_layout();
    let record = label_bytes + PIXELS;
    let whole = bytes.len() - bytes.len() % record;
    if whole != bytes.len() {
        return Err(DataError::Malformed {
            path: path.to_path_buf(),
            at: Position::Byte(whole as u64),
            problem: format!(
                "truncated: {} bytes are left after {} whole {record}-byte records; is it a {} file?",
                bytes.len() - whole,
                whole / record,
                dataset.name()
            ),
        });
    }
    images.reserve(whole / record * PIXELS);
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        let label = u32::from(r[which]);
        if label >= classes.len() {
            return Err(DataError::Malformed {
                path: path.to_path_buf(),
                at: Position::Record(i),
                problem: format!("label {label} is outside the {} classes of {}", classes.len(), dataset.name()),
            });
        }
        index.push(label);
        let (red, rest) = r[label_bytes..].split_at(SIDE * SIDE);
        let (green, blue) = rest.split_at(SIDE * SIDE);
        for ((&r, &g), &b) in red.iter().zip(green).zip(blue) {
            images.extend_from_slice(&[r, g, b]);
        }
    }
    Ok(())
}

impl RandomAccess for Cifar {
    fn len(&self) -> usize {
        self.images.len() / PIXELS
    }

    fn shape(&self) -> &[usize] {
        &[SIDE, SIDE, 3]
    }

    fn dtype(&self) -> Dtype {
        Dtype::U8
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn read_at(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        widen_u8(&self.images[i * PIXELS..(i + 1) * PIXELS], out);
        Ok(())
    }
}

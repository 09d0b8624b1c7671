//! The binary CIFAR-10 and CIFAR-100 files (the "version suitable for C programs"): fixed-size
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

use super::dtype::widen_u8;
use super::{Classes, Dtype, Labels, RandomAccess, io_error};
use crate::data::error::{DataError, Position};
use std::path::{Path, PathBuf};

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
    path: &PathBuf,
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
            path: path.clone(),
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
                path: path.clone(),
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

//! Where examples come from: the MNIST and Fashion-MNIST presets (file names, checksums,
//! mirrors), IDX files named in `[data.files]`, or the synthetic generator; which folder holds
//! them; and loading them into a [`Dataset`].
//!
//! Files already on disk get cheap checks only (their headers, and sizes while decoding); the
//! full checksum is verified when a file is downloaded. Hashing the 47 MB of MNIST training
//! images costs over 100 ms, a large slice of the 0.5 s start-up budget, on every start, while
//! a file damaged on disk almost always also breaks its gzip CRC or its header.

use super::cifar;
use super::download::{Checksum, Fetcher, RemoteFile};
use super::error::DataError;
use super::folders::{self, ImageFolderConfig};
use super::formats::cifar::CifarDataset;
use super::idx::{IdxArray, read_idx, read_idx_dims};
use super::numpy::{self, NpyConfig};
use super::records::{self, TfRecordConfig};
use super::synthetic::{self, SyntheticConfig};
use super::table::{self, CsvConfig};
use super::text::{self, TextConfig};
use super::tokens::{self, TokensConfig};
use super::{DataFacts, Dataset, ExampleShape, LabelKind, Split};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A published dataset: its four files with checksums, mirrors and known shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset {
    /// As in `data.dataset`, e.g. `mnist`.
    pub name: &'static str,
    pub train_images: RemoteFile,
    pub train_labels: RemoteFile,
    pub test_images: RemoteFile,
    pub test_labels: RemoteFile,
    /// Base URLs, tried in order.
    pub mirrors: &'static [&'static str],
    pub train_examples: usize,
    pub test_examples: usize,
    pub shape: ExampleShape,
    pub classes: u32,
}

const MNIST_MIRRORS: &[&str] =
    &["https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/"];
const FASHION_MIRRORS: &[&str] = &["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"];

/// The standard file names of MNIST-shaped datasets, in `Preset::files()` order.
const MNIST_NAMES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

impl Preset {
    /// MNIST; checksums are SHA-256 of the decompressed files.
    pub fn mnist() -> Self {
        let sha256 = |hex: &str| Checksum::Sha256Decompressed(hex.into());
        Self::mnist_shaped(
            "mnist",
            MNIST_MIRRORS,
            [
                sha256("ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
                sha256("65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
                sha256("0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
                sha256("ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
            ],
        )
    }

    /// Fashion-MNIST; its publisher (the zalandoresearch/fashion-mnist README) gives only the
    /// MD5 of each `.gz` file, so that is what is checked.
    pub fn fashion_mnist() -> Self {
        let md5 = |hex: &str| Checksum::Md5File(hex.into());
        Self::mnist_shaped(
            "fashion_mnist",
            FASHION_MIRRORS,
            [
                md5("8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                md5("25c81989df183df01b3e8a0aad5dffbe"),
                md5("bef4ecab320f06d8554ea6380940ec79"),
                md5("bb300cfdad3c16e7a12a480ee83cd310"),
            ],
        )
    }

    fn mnist_shaped(name: &'static str, mirrors: &'static [&'static str], checksums: [Checksum; 4]) -> Self {
        let [train_images, train_labels, test_images, test_labels] =
            std::array::from_fn(|i| RemoteFile { name: MNIST_NAMES[i].into(), checksum: checksums[i].clone() });
        Self {
            name,
            train_images,
            train_labels,
            test_images,
            test_labels,
            mirrors,
            train_examples: 60_000,
            test_examples: 10_000,
            shape: ExampleShape { height: 28, width: 28, channels: 1 },
            classes: 10,
        }
    }

    fn files(&self) -> [&RemoteFile; 4] {
        [&self.train_images, &self.train_labels, &self.test_images, &self.test_labels]
    }

    /// The facts the published files have.
    pub fn facts(&self) -> DataFacts {
        DataFacts {
            train_examples: self.train_examples,
            test_examples: self.test_examples,
            example_shape: self.shape.dims(),
            labels: LabelKind::Class { classes: self.classes },
            train_files: 1,
        }
    }

    /// The dimensions each file must have, in `files()` order.
    fn expected_dims(&self) -> [Vec<usize>; 4] {
        let ExampleShape { height, width, .. } = self.shape;
        [
            vec![self.train_examples, height, width],
            vec![self.train_examples],
            vec![self.test_examples, height, width],
            vec![self.test_examples],
        ]
    }
}

/// `[data.files]`: IDX file names, relative to `data.dir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdxFiles {
    /// Training images (IDX3, `u8`). Example: `train_images = "train-images-idx3-ubyte.gz"`.
    pub train_images: String,
    /// Training labels (IDX1, `u8`). Example: `train_labels = "train-labels-idx1-ubyte.gz"`.
    pub train_labels: String,
    /// Test images, for evaluation. Example: `test_images = "t10k-images-idx3-ubyte.gz"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_images: Option<String>,
    /// Test labels, for evaluation. Example: `test_labels = "t10k-labels-idx1-ubyte.gz"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_labels: Option<String>,
}

/// Finds a preset file: the published `.gz` name, or the same name decompressed.
fn locate(dir: &Path, name: &str) -> Option<PathBuf> {
    let gz = dir.join(name);
    if gz.is_file() {
        return Some(gz);
    }
    let raw = dir.join(name.strip_suffix(".gz")?);
    raw.is_file().then_some(raw)
}

/// Where a run's examples come from, resolved from `[data]` and the environment.
// Built once per run, so the size of the `Preset` variant costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Preset {
        preset: Preset,
        dir: PathBuf,
    },
    Idx {
        dir: PathBuf,
        files: IdxFiles,
    },
    Synthetic {
        config: SyntheticConfig,
        seed: u64,
    },
    /// UTF-8 text files for a language model.
    Text {
        dir: PathBuf,
        config: TextConfig,
    },
    /// Token id files for a language model.
    Tokens {
        dir: PathBuf,
        config: TokensConfig,
    },
    /// A CSV table.
    Csv {
        dir: PathBuf,
        config: CsvConfig,
    },
    /// NumPy arrays.
    Npy {
        dir: PathBuf,
        config: NpyConfig,
    },
    /// A folder of images per class.
    ImageFolder {
        dir: PathBuf,
        config: ImageFolderConfig,
    },
    /// CIFAR-10 or CIFAR-100's binary files.
    Cifar {
        dir: PathBuf,
        dataset: CifarDataset,
    },
    /// TFRecord files of `tf.train.Example`s, streamed.
    TfRecord {
        dir: PathBuf,
        config: TfRecordConfig,
    },
}

impl Source {
    /// The dataset's name, as `data.dataset` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Preset { preset, .. } => preset.name,
            Source::Idx { .. } => "idx",
            Source::Synthetic { .. } => "synthetic",
            Source::Text { .. } => "text",
            Source::Tokens { .. } => "tokens",
            Source::Csv { .. } => "csv",
            Source::Npy { .. } => "npy",
            Source::ImageFolder { .. } => "image_folder",
            Source::Cifar { dataset, .. } => dataset.name(),
            Source::TfRecord { .. } => "tfrecord",
        }
    }

    /// The folder the files are read from (none for synthetic data).
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Source::Preset { dir, .. }
            | Source::Idx { dir, .. }
            | Source::Text { dir, .. }
            | Source::Tokens { dir, .. }
            | Source::Csv { dir, .. }
            | Source::Npy { dir, .. }
            | Source::ImageFolder { dir, .. }
            | Source::Cifar { dir, .. }
            | Source::TfRecord { dir, .. } => Some(dir),
            Source::Synthetic { .. } => None,
        }
    }

    /// Files the dataset needs that are not in its folder.
    pub fn missing_files(&self) -> Vec<String> {
        match self {
            Source::Preset { preset, dir } => {
                preset.files().iter().filter(|f| locate(dir, &f.name).is_none()).map(|f| f.name.clone()).collect()
            }
            Source::Idx { dir, files } => {
                idx_names(files).into_iter().filter(|name| !dir.join(name).is_file()).map(str::to_string).collect()
            }
            Source::Text { dir, config } => missing_in(dir, config.train.iter().chain(&config.validation)),
            Source::Tokens { dir, config } => missing_in(dir, config.train.iter().chain(&config.validation)),
            Source::Csv { dir, config } => missing_in(dir, std::iter::once(&config.train).chain(&config.test)),
            Source::Npy { dir, config } => missing_in(dir, config.files().iter()),
            Source::ImageFolder { dir, config } => {
                config.folders().into_iter().filter(|f| !dir.join(f).is_dir()).map(|f| format!("{f}/")).collect()
            }
            Source::Cifar { dir, dataset } => cifar::missing_files(dir, *dataset),
            Source::TfRecord { dir, config } => config.missing_files(dir),
            Source::Synthetic { .. } => vec![],
        }
    }

    /// Downloads the preset files that are missing; returns the paths written. Other sources
    /// have nothing to fetch (missing `idx` files are reported by [`Source::load`]).
    pub fn fetch_missing(&self, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
        match self {
            Source::Preset { preset, dir } => {
                let missing: Vec<&RemoteFile> =
                    preset.files().into_iter().filter(|f| locate(dir, &f.name).is_none()).collect();
                fetcher.download(preset.name, dir, &missing, preset.mirrors)
            }
            Source::Cifar { dir, dataset } => cifar::fetch_missing(dir, *dataset, fetcher),
            Source::Idx { .. }
            | Source::Synthetic { .. }
            | Source::Text { .. }
            | Source::Tokens { .. }
            | Source::Csv { .. }
            | Source::Npy { .. }
            | Source::ImageFolder { .. }
            | Source::TfRecord { .. } => Ok(vec![]),
        }
    }

    /// Example counts, shape, classes and file count, reading headers only (and the small
    /// label files of `idx` datasets, to count classes). Preset files not yet downloaded are
    /// taken to be the published ones.
    pub fn facts(&self) -> Result<DataFacts, DataError> {
        match self {
            Source::Preset { preset, dir } => {
                for (f, dims) in preset.files().iter().zip(preset.expected_dims()) {
                    if let Some(path) = locate(dir, &f.name) {
                        check_dims(preset, &path, read_idx_dims(&path)?, &dims)?;
                    }
                }
                Ok(preset.facts())
            }
            Source::Idx { dir, files } => {
                self.require_files()?;
                let (train, train_labels) = idx_dims_and_labels(dir, &files.train_images, &files.train_labels)?;
                let test = test_paths(files)?.map(|(i, l)| idx_dims_and_labels(dir, i, l)).transpose()?;
                let classes = max_label(&train_labels, test.as_ref().map(|t| &t.1));
                Ok(DataFacts {
                    train_examples: train_labels.data().len(),
                    test_examples: test.as_ref().map_or(0, |t| t.1.data().len()),
                    example_shape: train.dims(),
                    labels: LabelKind::Class { classes },
                    train_files: 1,
                })
            }
            Source::Synthetic { config, .. } => synthetic::facts(config),
            Source::Text { dir, config } => {
                self.require_files()?;
                text::facts(dir, config)
            }
            Source::Tokens { dir, config } => {
                self.require_files()?;
                tokens::facts(dir, config)
            }
            Source::Csv { dir, config } => {
                self.require_files()?;
                table::facts(dir, config)
            }
            Source::Npy { dir, config } => {
                self.require_files()?;
                numpy::facts(dir, config)
            }
            Source::ImageFolder { dir, config } => {
                self.require_files()?;
                folders::facts(dir, config)
            }
            Source::Cifar { dir, dataset } => cifar::facts(dir, *dataset),
            Source::TfRecord { dir, config } => {
                self.require_files()?;
                records::facts(dir, config)
            }
        }
    }

    /// Loads the dataset. Train and test files are decoded on two threads.
    pub fn load(&self) -> Result<Dataset, DataError> {
        self.require_files()?;
        match self {
            Source::Preset { preset, dir } => {
                let path = |f: &RemoteFile| locate(dir, &f.name).unwrap_or_else(|| dir.join(&f.name));
                let [ti, tl, vi, vl] = preset.files().map(path);
                let (train, test) = both(|| load_split(&ti, &tl), || load_split(&vi, &vl));
                let (train, test) = (train?, test?);
                let dims = preset.expected_dims();
                check_dims(preset, &ti, train.0.dims().to_vec(), &dims[0])?;
                check_dims(preset, &vi, test.0.dims().to_vec(), &dims[2])?;
                check_labels(preset, &tl, train.1.data())?;
                check_labels(preset, &vl, test.1.data())?;
                Ok(Dataset {
                    train: image_split(train),
                    test: Some(image_split(test)),
                    labels: LabelKind::Class { classes: preset.classes },
                    vocabulary: None,
                    classes: None,
                })
            }
            Source::Idx { dir, files } => {
                let test = test_paths(files)?;
                let (train, test) = both(
                    || load_split(&dir.join(&files.train_images), &dir.join(&files.train_labels)),
                    || test.map(|(i, l)| load_split(&dir.join(i), &dir.join(l))).transpose(),
                );
                let (train, test) = (train?, test?);
                let classes = max_label(&train.1, test.as_ref().map(|t| &t.1));
                Ok(Dataset {
                    train: image_split(train),
                    test: test.map(image_split),
                    labels: LabelKind::Class { classes },
                    vocabulary: None,
                    classes: None,
                })
            }
            Source::Synthetic { config, seed } => synthetic::generate(config, *seed),
            Source::Text { dir, config } => text::load(dir, config),
            Source::Tokens { dir, config } => tokens::load(dir, config),
            Source::Csv { dir, config } => table::load(dir, config),
            Source::Npy { dir, config } => numpy::load(dir, config),
            Source::ImageFolder { dir, config } => folders::load(dir, config),
            Source::Cifar { dir, dataset } => cifar::load(dir, *dataset),
            Source::TfRecord { dir, config } => records::load(dir, config),
        }
    }

    fn require_files(&self) -> Result<(), DataError> {
        let missing = self.missing_files();
        match (self, missing.is_empty()) {
            (_, true) | (Source::Synthetic { .. }, _) => Ok(()),
            (Source::Preset { preset, dir }, false) => {
                Err(DataError::MissingFiles { dataset: preset.name, dir: dir.clone(), files: missing })
            }
            (Source::Cifar { dir, dataset }, false) => Err(DataError::MissingFiles {
                dataset: dataset.name(),
                dir: cifar::files_dir(dir, *dataset),
                files: missing,
            }),
            (
                Source::Idx { dir, .. }
                | Source::Text { dir, .. }
                | Source::Tokens { dir, .. }
                | Source::Csv { dir, .. }
                | Source::Npy { dir, .. }
                | Source::ImageFolder { dir, .. }
                | Source::TfRecord { dir, .. },
                false,
            ) => Err(DataError::MissingFiles { dataset: self.name(), dir: dir.clone(), files: missing }),
        }
    }
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

/// The names among `names` that are not files in `dir` (absolute names stay as they are).
fn missing_in<'a>(dir: &Path, names: impl Iterator<Item = &'a String>) -> Vec<String> {
    names.filter(|n| !dir.join(n).is_file()).cloned().collect()
}

fn idx_names(files: &IdxFiles) -> Vec<&str> {
    [
        Some(files.train_images.as_str()),
        Some(files.train_labels.as_str()),
        files.test_images.as_deref(),
        files.test_labels.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn test_paths(files: &IdxFiles) -> Result<Option<(&str, &str)>, DataError> {
    match (&files.test_images, &files.test_labels) {
        (Some(i), Some(l)) => Ok(Some((i, l))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(DataError::MissingSection {
            dataset: "idx",
            section: "both data.files.test_images and data.files.test_labels (or neither)",
            example: "test_images = \"t10k-images-idx3-ubyte.gz\", \
                      test_labels = \"t10k-labels-idx1-ubyte.gz\"",
        }),
    }
}

/// The example shape of an images file's dimensions (`n,h,w` or `n,h,w,c`).
fn image_shape(path: &Path, dims: &[usize]) -> Result<(usize, ExampleShape), DataError> {
    match *dims {
        [n, height, width] => Ok((n, ExampleShape { height, width, channels: 1 })),
        [n, height, width, channels] => Ok((n, ExampleShape { height, width, channels })),
        _ => Err(DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.to_vec(),
            expected: "images need 3 dimensions (n, height, width) or 4 (n, height, width, channels)".into(),
        }),
    }
}

fn check_label_dims(path: &Path, dims: &[usize]) -> Result<usize, DataError> {
    match *dims {
        [n] => Ok(n),
        _ => Err(DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.to_vec(),
            expected: "labels need 1 dimension (one label per example)".into(),
        }),
    }
}

/// Images, labels and the shape of one image, as read and checked by [`load_split`].
type ImageArrays = (IdxArray, IdxArray, ExampleShape);

fn image_split((images, labels, shape): ImageArrays) -> Split {
    Split::new(images, labels, shape)
}

fn load_split(images_path: &Path, labels_path: &Path) -> Result<ImageArrays, DataError> {
    let images = read_idx(images_path)?;
    let (n, shape) = image_shape(images_path, images.dims())?;
    let labels = read_idx(labels_path)?;
    let labels_n = check_label_dims(labels_path, labels.dims())?;
    if n != labels_n {
        return Err(DataError::CountMismatch {
            images_path: images_path.to_path_buf(),
            images: n,
            labels_path: labels_path.to_path_buf(),
            labels: labels_n,
        });
    }
    Ok((images, labels, shape))
}

/// Header of the images, whole labels (small), both checked against each other.
fn idx_dims_and_labels(dir: &Path, images: &str, labels: &str) -> Result<(ExampleShape, IdxArray), DataError> {
    let (images_path, labels_path) = (dir.join(images), dir.join(labels));
    let (n, shape) = image_shape(&images_path, &read_idx_dims(&images_path)?)?;
    let labels = read_idx(&labels_path)?;
    let labels_n = check_label_dims(&labels_path, labels.dims())?;
    if n != labels_n {
        return Err(DataError::CountMismatch { images_path, images: n, labels_path, labels: labels_n });
    }
    Ok((shape, labels))
}

/// Classes of an `idx` dataset: one more than the largest label seen.
fn max_label(train: &IdxArray, test: Option<&IdxArray>) -> u32 {
    let max = |a: &IdxArray| a.data().iter().copied().max().unwrap_or(0);
    let m = max(train).max(test.map_or(0, max));
    u32::from(m) + 1
}

fn bad_dims(preset: &Preset, path: &Path, dims: Vec<usize>, expected: &[usize]) -> DataError {
    DataError::BadDims {
        path: path.to_path_buf(),
        dims,
        expected: format!("{} needs {expected:?}; delete the file so it is downloaded again", preset.name),
    }
}

fn check_dims(preset: &Preset, path: &Path, dims: Vec<usize>, expected: &[usize]) -> Result<(), DataError> {
    if dims == expected { Ok(()) } else { Err(bad_dims(preset, path, dims, expected)) }
}

fn check_labels(preset: &Preset, path: &Path, labels: &[u8]) -> Result<(), DataError> {
    match labels.iter().position(|&l| u32::from(l) >= preset.classes) {
        None => Ok(()),
        Some(index) => Err(DataError::LabelOutOfRange {
            path: path.to_path_buf(),
            dataset: preset.name,
            index,
            label: labels[index],
            classes: preset.classes,
        }),
    }
}

#[cfg(test)]
#[path = "sources_tests.rs"]
mod tests;

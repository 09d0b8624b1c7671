//! The `mnist` and `fashion_mnist` sources: the MNIST-shaped presets, their four IDX files
//! with checksums, mirrors and known shape, read by [`idx`](super::idx).
//!
//! Files already on disk get cheap checks only (their headers, and sizes while decoding); the
//! full checksum is verified when a file is downloaded. Hashing the 47 MB of MNIST training
//! images costs over 100 ms, a large slice of the 0.5 s start-up budget, on every start, while
//! a file damaged on disk almost always also breaks its gzip CRC or its header.

use super::idx::{image_split, load_split, read_idx_dims, read_images};
use super::{DataSource, RawValues, both, require};
use crate::data::download::{Checksum, Fetcher, RemoteFile};
use crate::data::error::DataError;
use crate::data::{DataFacts, Dataset, ExampleShape, LabelKind, Split};
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
            warnings: vec![],
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

/// Finds a preset file: the published `.gz` name, or the same name decompressed.
fn locate(dir: &Path, name: &str) -> Option<PathBuf> {
    let gz = dir.join(name);
    if gz.is_file() {
        return Some(gz);
    }
    let raw = dir.join(name.strip_suffix(".gz")?);
    raw.is_file().then_some(raw)
}

/// `data.dataset = "mnist"` or `"fashion_mnist"`: a preset's files in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct MnistSource {
    pub preset: Preset,
    pub dir: PathBuf,
    /// Where gzip files are kept inflated (`TRAINRUN_DATA_CACHE`), if anywhere.
    pub cache: Option<PathBuf>,
}

impl MnistSource {
    fn missing(&self) -> Vec<&RemoteFile> {
        self.preset.files().into_iter().filter(|f| locate(&self.dir, &f.name).is_none()).collect()
    }
}

impl DataSource for MnistSource {
    fn name(&self) -> &'static str {
        self.preset.name
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        self.missing().into_iter().map(|f| f.name.clone()).collect()
    }

    /// Downloads the files that are missing.
    fn fetch_missing(&self, fetcher: &Fetcher) -> Result<Vec<PathBuf>, DataError> {
        fetcher.download(self.preset.name, &self.dir, &self.missing(), self.preset.mirrors)
    }

    /// The published facts, after checking the headers of the files already there (files not
    /// yet downloaded are taken to be the published ones).
    fn facts(&self) -> Result<DataFacts, DataError> {
        let preset = &self.preset;
        for (f, dims) in preset.files().iter().zip(preset.expected_dims()) {
            if let Some(path) = locate(&self.dir, &f.name) {
                check_dims(preset, &path, read_idx_dims(&path).map_err(DataError::downloaded)?, &dims)?;
            }
        }
        Ok(preset.facts())
    }

    /// Decodes train and test files on two threads and checks them against the preset.
    fn load(&self) -> Result<Dataset, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (preset, dir) = (&self.preset, &self.dir);
        let path = |f: &RemoteFile| locate(dir, &f.name).unwrap_or_else(|| dir.join(&f.name));
        let [ti, tl, vi, vl] = preset.files().map(path);
        let cache = self.cache.as_deref();
        let (train, test) = both(|| load_split(&ti, &tl, cache), || load_split(&vi, &vl, cache));
        let (train, test) = (train.map_err(DataError::downloaded)?, test.map_err(DataError::downloaded)?);
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

    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        read_images(file)
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Bytes
    }
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
mod tests {
    use super::*;
    use crate::data::Split;
    use crate::data::download::tests::{serve, unreachable};
    use crate::data::source::idx::{encode_idx, gzip};
    use sha2::{Digest, Sha256};
    use std::collections::HashMap;

    #[test]
    fn missing_preset_files_are_all_named_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let source = MnistSource { preset: Preset::mnist(), dir: dir.path().to_path_buf(), cache: None };
        let err = source.load().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "mnist: missing in {}: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, \
                 t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; put the files there, or set \
                 `data.dir` (or TRAINRUN_DATA_DIR) to a folder that has them",
                dir.path().display()
            )
        );
        // Facts need no files: a preset's are published.
        assert_eq!(source.facts().unwrap(), Preset::mnist().facts());
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A preset shaped like MNIST but tiny (6 train, 2 test, 2×2), and its gzip files.
    fn tiny_preset() -> (Preset, HashMap<String, Vec<u8>>) {
        let raw = [
            encode_idx(&[6, 2, 2], &[9; 24]),
            encode_idx(&[6], &[0, 1, 2, 0, 1, 2]),
            encode_idx(&[2, 2, 2], &[4; 8]),
            encode_idx(&[2], &[2, 1]),
        ];
        let names = ["tr-i.gz", "tr-l.gz", "te-i.gz", "te-l.gz"];
        let f = |k: usize| RemoteFile {
            name: names[k].into(),
            checksum: Checksum::Sha256Decompressed(sha256_hex(&raw[k])),
        };
        let preset = Preset {
            name: "mnist",
            train_images: f(0),
            train_labels: f(1),
            test_images: f(2),
            test_labels: f(3),
            mirrors: &[],
            train_examples: 6,
            test_examples: 2,
            shape: ExampleShape { height: 2, width: 2, channels: 1 },
            classes: 3,
        };
        let served = names.iter().zip(&raw).map(|(n, r)| (n.to_string(), gzip(r))).collect();
        (preset, served)
    }

    #[test]
    fn preset_downloads_then_loads() {
        let dir = tempfile::tempdir().unwrap();
        let (preset, served) = tiny_preset();
        let addr = serve(served, 4);
        let source = MnistSource { preset, dir: dir.path().join("sub"), cache: None };
        let fetcher = Fetcher::with_mirrors(vec![unreachable(), format!("http://{addr}")]);
        assert_eq!(source.fetch_missing(&fetcher).unwrap().len(), 4);
        assert!(source.missing_files().is_empty());
        // Nothing left to fetch: no request is made (the server would refuse a fifth).
        assert_eq!(source.fetch_missing(&fetcher).unwrap(), Vec::<PathBuf>::new());
        let data = source.load().unwrap();
        assert_eq!(data.train.len(), 6);
        assert_eq!(data.test.as_ref().map(Split::len), Some(2));
        assert_eq!(data.facts(1), source.facts().unwrap());
    }

    #[test]
    fn preset_files_of_the_wrong_shape_or_labels_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (preset, mut served) = tiny_preset();
        served.insert("tr-i.gz".into(), gzip(&encode_idx(&[6, 3, 2], &[0; 36])));
        served.insert("te-l".into(), encode_idx(&[2], &[0, 3]));
        served.remove("te-l.gz");
        for (name, bytes) in &served {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let source = MnistSource { preset: preset.clone(), dir: dir.path().to_path_buf(), cache: None };
        let want = "tr-i.gz: the header gives dimensions [6, 3, 2]; mnist needs [6, 2, 2]; \
                    delete the file so it is downloaded again";
        assert!(source.facts().unwrap_err().to_string().ends_with(want));
        assert!(source.load().unwrap_err().to_string().ends_with(want));
        served.insert("tr-i.gz".into(), gzip(&encode_idx(&[6, 2, 2], &[0; 24])));
        std::fs::write(dir.path().join("tr-i.gz"), &served["tr-i.gz"]).unwrap();
        // The decompressed test labels are found under their name without `.gz`.
        let err = source.load().unwrap_err().to_string();
        assert!(err.ends_with("te-l: label 3 of example 1 is outside the 3 classes of mnist"), "{err}");
    }
}

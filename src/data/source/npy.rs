//! The `npy` source: NumPy arrays, a `.npy` file of features and one of labels per split, or
//! the named arrays of one `.npz` archive (as `np.savez("mnist.npz", x_train=…, y_train=…)`
//! writes them). Integer labels are class indices, float labels regression targets.
//!
//! Files are memory-mapped, so a features array larger than RAM works: the kernel pages in
//! the examples being read. Labels are converted once, at open, into [`Labels`]: integer
//! dtypes are class indices (classes `0..=max`), float dtypes are regression targets.
//!
//! Refused, each with its own message: C-contiguous order only (a Fortran-ordered array of
//! two or more dimensions would need a transpose per example), numeric dtypes only (no object,
//! string, complex or structured arrays), and features and labels of different lengths.
//! Big-endian arrays are read (the conversion to `f32` swaps bytes at no extra cost).
//!
//! A mapped file must not be truncated by another process while it is read: the map would
//! then fault. Training data is not rewritten in place, so the map is worth that rule.

mod header;
mod npz;
#[cfg(test)]
mod tests;

use super::{DataSource, RawValues, missing_in, require};
use crate::data::arrays::{Arrays, label_kind};
use crate::data::error::{DataError, Position};
use crate::data::examples::{LabelKind, Split};
use crate::data::formats::dtype::{self, ByteOrder, Dtype};
use crate::data::formats::{Classes, Labels, RandomAccess, check_buffer, check_index, io_error};
use crate::data::{DataFacts, DataWarning, Dataset};
use memmap2::Mmap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `[data.npy]`: the arrays of each split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NpyConfig {
    /// A `.npz` archive holding every array, relative to `data.dir`; `train` and `test` then
    /// name its members (the `.npy` suffix may be left out). Default: none (`train` and
    /// `test` name `.npy` files). Example: `npz = "mnist.npz"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npz: Option<String>,
    /// The training arrays. Required.
    /// Example: `train = { features = "x_train.npy", labels = "y_train.npy" }`.
    pub train: NpyPair,
    /// The test arrays, evaluated after each epoch. Default: none (nothing is evaluated).
    /// Example: `test = { features = "x_test.npy", labels = "y_test.npy" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<NpyPair>,
}

/// One split's arrays: `.npy` files (relative to `data.dir`), or members of `data.npy.npz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NpyPair {
    /// Features, one example per row of the first axis, of any shape and of dtype u8, i8, u16,
    /// i16, i32, i64, f16, f32 or f64 (u8 is divided by 255). Required.
    /// Example: `features = "x_train.npy"`.
    pub features: String,
    /// Labels, as many as feature rows: integers of shape `(n,)` or `(n, 1)` are class
    /// indices, floats of shape `(n,)` or `(n, k)` regression targets. Required.
    /// Example: `labels = "y_train.npy"`.
    pub labels: String,
}

impl NpyConfig {
    /// The files `data.dir` must hold.
    pub fn files(&self) -> Vec<String> {
        match &self.npz {
            Some(npz) => vec![npz.clone()],
            None => std::iter::once(&self.train)
                .chain(&self.test)
                .flat_map(|p| [p.features.clone(), p.labels.clone()])
                .collect(),
        }
    }
}

/// `data.dataset = "npy"`: `[data.npy]`'s arrays in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct NpySource {
    pub dir: PathBuf,
    pub config: NpyConfig,
}

impl DataSource for NpySource {
    fn name(&self) -> &'static str {
        "npy"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_in(&self.dir, self.config.files().iter())
    }

    /// Example counts, shape and label kind (headers mapped, labels read).
    fn facts(&self) -> Result<DataFacts, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (train, test, labels) = read(&self.dir, &self.config)?;
        let warning = train
            .labels()
            .single_class()
            .map(|name| DataWarning::one_class("data.npy.train", &train.labels_path, name));
        let mut facts = dataset(train, test, labels).facts(1);
        facts.warnings.extend(warning);
        Ok(facts)
    }

    /// Maps the arrays; examples are converted as batches are read.
    fn load(&self) -> Result<Dataset, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (train, test, labels) = read(&self.dir, &self.config)?;
        Ok(dataset(train, test, labels))
    }

    /// A `.npy` array of features, one example per row of the first axis.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        let array = NpyArray::open(file)?;
        let (rows, len) = (array.rows()?, array.row_len());
        let mut values = vec![0f32; rows * len];
        for (i, row) in values.chunks_exact_mut(len.max(1)).enumerate() {
            array.read_row(i, row)?;
        }
        if array.dtype == Dtype::U8 {
            // As the training split scales them (`Arrays`): division, so the values are equal.
            values.iter_mut().for_each(|v| *v /= 255.0);
        }
        crate::data::Unlabeled::split(file, array.shape[1..].to_vec(), values)
    }

    fn raw_values(&self) -> RawValues {
        RawValues::ArrayDtype
    }
}

fn dataset(train: NpyDataset, test: Option<NpyDataset>, labels: LabelKind) -> Dataset {
    Dataset {
        train: Split::of(Arrays::new(train, 0)),
        test: test.map(|t| Split::of(Arrays::new(t, 0))),
        labels,
        vocabulary: None,
        classes: None,
    }
}

fn open(dir: &Path, config: &NpyConfig, pair: &NpyPair) -> Result<NpyDataset, DataError> {
    match &config.npz {
        Some(npz) => NpyDataset::open_npz(&dir.join(npz), &pair.features, &pair.labels),
        None => NpyDataset::open_pair(&dir.join(&pair.features), &dir.join(&pair.labels)),
    }
}

/// Maps both splits and checks that they agree on the example shape and the label kind.
fn read(dir: &Path, config: &NpyConfig) -> Result<(NpyDataset, Option<NpyDataset>, LabelKind), DataError> {
    let train = open(dir, config, &config.train)?;
    let mut labels = label_kind(train.labels());
    let test = config.test.as_ref().map(|pair| open(dir, config, pair)).transpose()?;
    if let Some(test) = &test {
        let path = |d: &NpyDataset| d.features().path().to_path_buf();
        let differ = |difference: String| DataError::SplitsDiffer { train: path(&train), test: path(test), difference };
        if test.shape() != train.shape() {
            let (a, b) = (train.shape(), test.shape());
            return Err(differ(format!("the training examples have shape {a:?}, the test examples {b:?}")));
        }
        labels = match (labels, label_kind(test.labels())) {
            // Class indices are numbers: the classes are those of either split.
            (LabelKind::Class { classes: a }, LabelKind::Class { classes: b }) => {
                LabelKind::Class { classes: a.max(b) }
            }
            (a, b) if a == b => a,
            (a, b) => {
                let kind = |k: LabelKind| match k.classes() {
                    Some(_) => "class indices".to_string(),
                    None => format!("{} float targets per example", k.row_width()),
                };
                return Err(differ(format!("the training labels are {}, the test labels {}", kind(a), kind(b))));
            }
        };
    }
    Ok((train, test, labels))
}

/// One array, memory-mapped; values are read an example (a row along the first axis) at a
/// time.
#[derive(Debug, Clone)]
pub struct NpyArray {
    /// The file, or `archive.npz/member.npy` for an `.npz` member: what errors name.
    path: PathBuf,
    map: Arc<Mmap>,
    /// Where the data starts in `map`.
    start: usize,
    dtype: Dtype,
    order: ByteOrder,
    shape: Vec<usize>,
}

impl NpyArray {
    /// Maps a `.npy` file and checks its header against its size.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let map = map_file(path)?;
        let len = map.len();
        Self::from_map(path.to_path_buf(), Arc::new(map), 0..len)
    }

    /// The array stored in `range` of `map` (an `.npz` member), named `path` in errors.
    fn from_map(path: PathBuf, map: Arc<Mmap>, range: std::ops::Range<usize>) -> Result<Self, DataError> {
        let bytes = map.get(range.clone()).unwrap_or_default();
        let header = header::parse(bytes, &path)?;
        if header.fortran_order && header.shape.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(DataError::Unsupported {
                path,
                what: format!(
                    "a Fortran-ordered (column-major) array of shape {:?} is not read; \
                     save np.ascontiguousarray(array) instead",
                    header.shape
                ),
            });
        }
        let elements = header.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let data = elements.and_then(|e| e.checked_mul(header.dtype.size()));
        let Some(total) = data.and_then(|d| d.checked_add(header.data_offset)) else {
            return Err(DataError::Malformed {
                path,
                at: Position::Byte(0),
                problem: format!("the shape {:?} is too large for any file", header.shape),
            });
        };
        let expected = total as u64;
        let found = bytes.len() as u64;
        if found < expected {
            return Err(DataError::Malformed {
                path,
                at: Position::Byte(found),
                problem: format!(
                    "truncated: the header describes {expected} bytes ({} {} of shape {:?}), the file ends here",
                    elements.unwrap_or(0),
                    header.dtype.name(),
                    header.shape
                ),
            });
        }
        if found > expected {
            return Err(DataError::TrailingBytes { path, expected, found });
        }
        let start = range.start + header.data_offset;
        Ok(Self { path, map, start, dtype: header.dtype, order: header.order, shape: header.shape })
    }

    /// The file (or `archive.npz/member.npy`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The stored element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Rows along the first axis (examples); an error for a 0-dimensional array.
    pub fn rows(&self) -> Result<usize, DataError> {
        self.shape.first().copied().ok_or_else(|| DataError::Malformed {
            path: self.path.clone(),
            at: Position::File,
            problem: "a 0-dimensional array holds no examples; the first axis must index them".into(),
        })
    }

    /// Values per row: the product of the shape after the first axis.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Converts row `i` to `f32` into `out` (`row_len()` values).
    pub fn read_row(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        check_index(i, self.rows()?)?;
        check_buffer(self.row_len(), out.len())?;
        dtype::to_f32(self.dtype, self.order, self.row_bytes(i), out);
        Ok(())
    }

    /// Every value, as `f64` (for labels: exact for every integer up to 2^53).
    fn all_f64(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.shape.iter().product()];
        dtype::to_f64(self.dtype, self.order, self.map.get(self.start..).unwrap_or_default(), &mut out);
        out
    }

    fn row_bytes(&self, i: usize) -> &[u8] {
        let row = self.row_len() * self.dtype.size();
        self.map.get(self.start + i * row..self.start + (i + 1) * row).unwrap_or_default()
    }
}

/// Maps a whole file read-only.
fn map_file(path: &Path) -> Result<Mmap, DataError> {
    let file = File::open(path).map_err(io_error(path))?;
    // SAFETY: the map is read-only and private to this process. Another process truncating
    // the file while it is mapped would fault the reader (the module documentation states
    // the rule); nothing here writes through the map.
    unsafe { Mmap::map(&file) }.map_err(io_error(path))
}

/// Features and labels from NumPy arrays, as a [`RandomAccess`] dataset.
#[derive(Debug, Clone)]
pub struct NpyDataset {
    features: NpyArray,
    len: usize,
    shape: Vec<usize>,
    labels: Labels,
    /// The labels' file (or `archive.npz/member.npy`), for the warnings about them.
    labels_path: PathBuf,
}

impl NpyDataset {
    /// A features `.npy` and a labels `.npy` of the same length.
    pub fn open_pair(features: &Path, labels: &Path) -> Result<Self, DataError> {
        Self::new(NpyArray::open(features)?, NpyArray::open(labels)?)
    }

    /// The arrays `features` and `labels` of one `.npz` archive (as `np.savez(path, x=…, y=…)`
    /// writes them; the `.npy` suffix of member names may be left out). Stored members are
    /// mapped where they lie in the archive; deflated ones (`np.savez_compressed`) are first
    /// inflated into an unlinked temporary file, which costs their size on disk while open.
    pub fn open_npz(path: &Path, features: &str, labels: &str) -> Result<Self, DataError> {
        let npz = npz::Npz::open(path)?;
        Self::new(npz.member(features)?, npz.member(labels)?)
    }

    fn new(features: NpyArray, labels_array: NpyArray) -> Result<Self, DataError> {
        let n = features.rows()?;
        let n_labels = labels_array.rows()?;
        if n != n_labels {
            return Err(DataError::LengthMismatch {
                features_path: features.path.clone(),
                features: n,
                labels_path: labels_array.path.clone(),
                labels: n_labels,
            });
        }
        let malformed =
            |problem| Err(DataError::Malformed { path: features.path.clone(), at: Position::File, problem });
        if n == 0 {
            return malformed(format!(
                "the arrays hold no examples (features of shape {:?}); save the split with its examples",
                features.shape
            ));
        }
        let labels = labels_of(&labels_array)?;
        let shape = features.shape[1..].to_vec();
        Ok(Self { features, len: n, shape, labels, labels_path: labels_array.path })
    }

    /// The features array.
    pub fn features(&self) -> &NpyArray {
        &self.features
    }
}

/// Integer arrays of shape `(n,)` or `(n, 1)` are class indices; float arrays are targets.
fn labels_of(array: &NpyArray) -> Result<Labels, DataError> {
    let values = array.all_f64();
    if array.dtype.is_float() {
        let width = array.row_len();
        let values: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(DataError::Malformed {
                path: array.path.clone(),
                at: Position::Record(i / width.max(1)),
                problem: format!("target {} is not a finite number; drop the example or fill the value in", values[i]),
            });
        }
        return Ok(Labels::Targets { values, width });
    }
    if array.row_len() != 1 {
        return Err(DataError::Malformed {
            path: array.path.clone(),
            at: Position::File,
            problem: format!(
                "{} labels of shape {:?} are neither class indices (shape (n,) or (n, 1)) nor float \
                 targets; save class indices, or a float array for regression",
                array.dtype.name(),
                array.shape
            ),
        });
    }
    let mut index = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        if !(0.0..=f64::from(u32::MAX - 1)).contains(&v) {
            return Err(DataError::Malformed {
                path: array.path.clone(),
                at: Position::Record(i),
                problem: crate::data::formats::not_a_class(v, None),
            });
        }
        index.push(v as u32);
    }
    let count = index.iter().max().map_or(0, |&m| m + 1);
    Ok(Labels::Classes { index, classes: Classes::numbered(count) })
}

impl RandomAccess for NpyDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn dtype(&self) -> Dtype {
        self.features.dtype
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn read_at(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        self.features.read_row(i, out)?;
        // Integer features are finite by construction; only floats are scanned.
        match self.features.dtype.is_float().then(|| crate::data::formats::non_finite(out)).flatten() {
            None => Ok(()),
            Some(problem) => {
                Err(DataError::Malformed { path: self.features.path.clone(), at: Position::Record(i), problem })
            }
        }
    }
}

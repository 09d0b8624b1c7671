//! The `npy` source: NumPy arrays, a `.npy` file of features and one of labels per split, or
//! the named arrays of one `.npz` archive (as `np.savez("mnist.npz", x_train=…, y_train=…)`
//! writes them), read memory-mapped by [`formats::npy`](super::formats::npy), so arrays larger
//! than RAM work. Integer labels are class indices, float labels regression targets.

use super::arrays::{Arrays, label_kind};
use super::error::DataError;
use super::examples::{LabelKind, Split};
use super::formats::RandomAccess;
use super::formats::npy::NpyDataset;
use super::{DataFacts, Dataset};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::Path;

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
        let differ =
            |difference: String| DataError::ClassesDiffer { first: path(&train), second: path(test), difference };
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

/// Example counts, shape and label kind (headers mapped, labels read).
pub fn facts(dir: &Path, config: &NpyConfig) -> Result<DataFacts, DataError> {
    load(dir, config).map(|d| d.facts(1))
}

/// Maps the arrays; examples are converted as batches are read.
pub fn load(dir: &Path, config: &NpyConfig) -> Result<Dataset, DataError> {
    let (train, test, labels) = read(dir, config)?;
    Ok(Dataset {
        train: Split::of(Arrays::new(train, 0)),
        test: test.map(|t| Split::of(Arrays::new(t, 0))),
        labels,
        vocabulary: None,
        classes: None,
    })
}

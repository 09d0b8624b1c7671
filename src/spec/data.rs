//! `[data]`: which dataset, where it lives, and how the input pipeline shuffles and batches it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::PathBuf;

/// `[data]`: the dataset and the input pipeline (`tf.data` vocabulary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// The dataset. Default: `mnist`. Example: `dataset = "fashion_mnist"`.
    #[serde(default)]
    pub dataset: DatasetKind,

    /// Folder holding the dataset files. When unset: `TRAINRUN_DATA_DIR`, then the user's cache
    /// folder (`~/.cache/trainrun/<dataset>`). Missing `mnist` / `fashion_mnist` files are
    /// downloaded there and checked against their SHA-256. Example: `dir = "/data/mnist"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,

    /// File names inside `dir` for `dataset = "idx"` (any MNIST-format IDX files, `.gz` or raw).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<IdxFiles>,

    /// Shape and size of `dataset = "synthetic"` (seeded random images, for benchmarks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticSpec>,

    /// Shuffle buffer size in examples, as `tf.data.Dataset.shuffle(buffer_size)`; the order
    /// is reshuffled every epoch from the run seed. `0` turns shuffling off.
    /// Default: the whole training set (a uniform shuffle). Example: `shuffle_buffer = 10000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_buffer: Option<usize>,

    /// Drop the last partial batch of each pass over the data. When `false`, the partial batch
    /// is used and each replica's loss is weighted by its example count. Default: `true`.
    /// Example: `drop_remainder = false`.
    #[serde(default = "yes")]
    pub drop_remainder: bool,

    /// Batches prepared ahead on a background thread. Default: `2`. Example: `prefetch = 4`.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,

    /// How workers split the data (`tf.data.experimental.AutoShardPolicy`). Default: `auto`.
    /// Example: `auto_shard_policy = "data"`.
    #[serde(default)]
    pub auto_shard_policy: AutoShardPolicy,
}

fn yes() -> bool {
    true
}

fn default_prefetch() -> usize {
    2
}

impl Default for DataSpec {
    fn default() -> Self {
        Self {
            dataset: DatasetKind::default(),
            dir: None,
            files: None,
            synthetic: None,
            shuffle_buffer: None,
            drop_remainder: true,
            prefetch: default_prefetch(),
            auto_shard_policy: AutoShardPolicy::default(),
        }
    }
}

/// `data.dataset`: where examples come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetKind {
    /// MNIST handwritten digits: 60,000 train + 10,000 test images, 28×28, 10 classes.
    #[default]
    Mnist,
    /// Fashion-MNIST: the same shapes as MNIST, clothing classes.
    FashionMnist,
    /// Any MNIST-format IDX files named in `[data.files]`.
    Idx,
    /// Seeded random images shaped by `[data.synthetic]`.
    Synthetic,
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

/// `[data.synthetic]`: a seeded random dataset for benchmarks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyntheticSpec {
    /// Training examples. Default: `60000`. Example: `train_examples = 50000`.
    #[serde(default = "default_synthetic_train")]
    pub train_examples: NonZeroUsize,
    /// Test examples. Default: `10000`. Example: `test_examples = 10000`.
    #[serde(default = "default_synthetic_test")]
    pub test_examples: usize,
    /// Shape of one example, height × width or height × width × channels.
    /// Default: `[28, 28]`. Example: `shape = [32, 32, 3]`.
    #[serde(default = "default_synthetic_shape")]
    #[schemars(length(min = 1, max = 3))]
    pub shape: Vec<NonZeroUsize>,
    /// Number of classes. Default: `10`. Example: `classes = 100`.
    #[serde(default = "default_synthetic_classes")]
    #[schemars(range(min = 2, max = 256))]
    pub classes: u32,
}

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

fn default_synthetic_train() -> NonZeroUsize {
    nz(60_000)
}

fn default_synthetic_test() -> usize {
    10_000
}

fn default_synthetic_shape() -> Vec<NonZeroUsize> {
    vec![nz(28), nz(28)]
}

fn default_synthetic_classes() -> u32 {
    10
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            train_examples: default_synthetic_train(),
            test_examples: default_synthetic_test(),
            shape: default_synthetic_shape(),
            classes: default_synthetic_classes(),
        }
    }
}

/// `data.auto_shard_policy`: TensorFlow's `AutoShardPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AutoShardPolicy {
    /// `file` when there are at least as many files as workers, else `data`.
    #[default]
    Auto,
    /// Each worker reads a disjoint subset of the files.
    File,
    /// Each worker keeps every N-th example of each global batch.
    Data,
    /// No sharding: every worker sees every example (a warning says so).
    Off,
}

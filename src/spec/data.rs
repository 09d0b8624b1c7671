//! `[data]`: which dataset, where it lives, and how the input pipeline shuffles and batches it.

use crate::data::PreprocessingConfig;
use crate::data::{
    Cifar100Config, CsvConfig, HfDatasetsConfig, IdxFiles, ImageFolderConfig, JsonlConfig, NpyConfig, ParquetConfig,
    SyntheticConfig, TextConfig, TfRecordConfig, TokensConfig,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
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
    pub synthetic: Option<SyntheticConfig>,

    /// Files and tokenization of `dataset = "text"` (UTF-8 text for a language model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextConfig>,

    /// Files and dtype of `dataset = "tokens"` (flat token id files for a language model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensConfig>,

    /// Tables and columns of `dataset = "csv"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<CsvConfig>,

    /// Arrays of `dataset = "npy"` (NumPy `.npy` files or one `.npz` archive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npy: Option<NpyConfig>,

    /// Split folders, image size and colour mode of `dataset = "image_folder"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_folder: Option<ImageFolderConfig>,

    /// Which labels `dataset = "cifar100"` trains on (fine or coarse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cifar100: Option<Cifar100Config>,

    /// Files, features and shuffle buffer of `dataset = "tfrecord"` (`tf.train.Example`s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfrecord: Option<TfRecordConfig>,

    /// Files and how to read them for `dataset = "jsonl"` (JSON Lines: documents for a
    /// language model, or a table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonl: Option<JsonlConfig>,

    /// Files and how to read them for `dataset = "parquet"` (Parquet files or globs: a text
    /// column for a language model, or feature columns and a label column, streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<ParquetConfig>,

    /// How to read the folder `data.dir` names for `dataset = "hf_datasets"` (what Hugging
    /// Face `datasets`' `save_to_disk` wrote: a text column for a language model, or feature
    /// columns and a label column, streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_datasets: Option<HfDatasetsConfig>,

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

    /// How workers split the data (`tf.data.experimental.AutoShardPolicy`). `auto` picks
    /// `file` for `tfrecord` when there are at least as many training files as workers, and
    /// for a `parquet` table when there are at least as many row groups as workers (its
    /// shard units); `data` otherwise and for every other source (each reads one training
    /// file, or none: `text`, `tokens`, `synthetic`). `file` with fewer units than workers is
    /// refused.
    /// Default: `auto`. Example: `auto_shard_policy = "data"`.
    #[serde(default)]
    pub auto_shard_policy: AutoShardPolicy,

    /// Rescaling, normalization, augmentation and Keras' `validation_split`, applied as
    /// examples are read (see `[data.preprocessing]`). Default: none (values as the source
    /// gives them: images' bytes divided by 255). Example:
    /// `[data.preprocessing] random_crop = { padding = 4 }, random_flip = "horizontal"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessing: Option<PreprocessingConfig>,
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
            text: None,
            tokens: None,
            csv: None,
            npy: None,
            image_folder: None,
            cifar100: None,
            tfrecord: None,
            jsonl: None,
            parquet: None,
            hf_datasets: None,
            shuffle_buffer: None,
            drop_remainder: true,
            prefetch: default_prefetch(),
            auto_shard_policy: AutoShardPolicy::default(),
            preprocessing: None,
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
    /// UTF-8 text files named in `[data.text]`, tokenized by character or byte, for language
    /// models: examples are windows of `block_size + 1` tokens.
    Text,
    /// Flat little-endian `u16`/`u32` token files named in `[data.tokens]`, memory-mapped.
    Tokens,
    /// A CSV table named in `[data.csv]`: numeric features, a class or float label column.
    Csv,
    /// NumPy arrays named in `[data.npy]` (`.npy` pairs or one `.npz`), memory-mapped:
    /// features of any shape, integer class or float target labels.
    Npy,
    /// Images in `<dir>/<split>/<class>/*.png|jpg|jpeg` (Keras' `image_dataset_from_directory`),
    /// shaped by `[data.image_folder]`; classes are the folder names, sorted.
    ImageFolder,
    /// CIFAR-10: 50,000 train + 10,000 test 32×32 RGB images, 10 classes; the binary files,
    /// downloaded (SHA-256 checked) unless in `dir`.
    Cifar10,
    /// CIFAR-100: the same sizes, 100 fine classes or 20 coarse ones (`[data.cifar100]`).
    Cifar100,
    /// TFRecord files of `tf.train.Example`s named in `[data.tfrecord]` (plain or GZIP),
    /// streamed through a shuffle buffer, never loaded whole.
    Tfrecord,
    /// JSON Lines files named in `[data.jsonl]` (plain, gzip or zstd): a string field as
    /// documents for a language model, or numeric fields and a label as a table.
    Jsonl,
    /// Parquet files named in `[data.parquet]` (pyarrow's, a Hugging Face Hub export): a
    /// string column as documents for a language model, or numeric and list columns and a
    /// label as a table, streamed row group by row group, never loaded whole.
    Parquet,
    /// A folder Hugging Face `datasets`' `save_to_disk` wrote (`dataset_dict.json` or
    /// `state.json` and Arrow files), read as `[data.hf_datasets]` says: a string column as
    /// documents, or numeric and list columns and a label as a table, streamed record batch
    /// by record batch, never loaded whole.
    HfDatasets,
}

/// `data.auto_shard_policy`: TensorFlow's `AutoShardPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AutoShardPolicy {
    /// `file` when there are at least as many training files as workers (only `tfrecord`
    /// has more than one), else `data`.
    #[default]
    Auto,
    /// Worker `i` of `N` reads training files `i, i+N, …` (a streamed source: `tfrecord`'s
    /// files, a `parquet` table's row groups); it needs at least as many as workers.
    File,
    /// Each worker keeps every N-th example of each global batch.
    Data,
    /// No sharding: every worker sees every example (a warning says so).
    Off,
}

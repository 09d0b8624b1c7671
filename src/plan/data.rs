//! `[data]`, resolved: where the examples come from (folder and files found), how the input
//! pipeline orders and batches them, and how workers split them.

use super::{Replicas, StrategyKind};
use crate::data::source::cifar::CifarDataset;
use crate::data::{
    AnySource, CifarSource, CsvSource, DataDirs, DataError, DataFacts, DataSource, HfDatasetsSource, IdxSource,
    ImageFolderSource, JsonlSource, MnistSource, NpySource, ParquetSource, Preprocessing, Preset, Shuffle,
    SyntheticSource, TextSource, TfRecordSource, TokensSource,
};
use crate::spec::{AutoShardPolicy, DataSpec, DatasetKind, Diagnostic};
use serde::Serialize;

/// How the training data is split across workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardPolicy {
    /// One worker: nothing to split.
    None,
    /// Each worker reads its own files.
    File,
    /// Each worker keeps every N-th example of each global batch.
    Data,
    /// Every worker reads everything.
    Off,
}

/// The input pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataPlan {
    /// Where the examples come from.
    #[serde(skip)]
    pub source: AnySource,
    /// Sizes and shapes, after preprocessing (the crop's shape, `validation_split`'s sizes).
    pub facts: DataFacts,
    /// `[data.preprocessing]`, resolved.
    #[serde(skip_serializing_if = "Preprocessing::is_identity")]
    pub preprocessing: Preprocessing,
    /// How each data-epoch is ordered.
    #[serde(skip)]
    pub shuffle: Shuffle,
    /// Drop each data-epoch's last partial batch.
    pub drop_remainder: bool,
    /// Batches prepared ahead.
    pub prefetch: usize,
    /// How workers split the data.
    pub shard: ShardPolicy,
    /// Shards (workers) the data is split into.
    pub num_shards: usize,
}

/// The source `[data]` names, with its folder resolved from `data.dir` or the environment
/// (`dirs`); `seed` (the run seed) drives the synthetic generator. Reads nothing. The one
/// match from a spec name to a source: a new source is an arm here.
pub fn source(spec: &DataSpec, dirs: &DataDirs, seed: u64) -> Result<AnySource, DataError> {
    let dir =
        |name: &'static str| dirs.resolve(spec.dir.as_deref(), name).ok_or(DataError::NoDataDir { dataset: name });
    // A table the source cannot do without, or the error naming it with an example.
    fn needs<T: Clone>(
        table: &Option<T>,
        dataset: &'static str,
        section: &'static str,
        example: &'static str,
    ) -> Result<T, DataError> {
        table.clone().ok_or(DataError::MissingSection { dataset, section, example })
    }
    Ok(match spec.dataset {
        DatasetKind::Mnist => {
            AnySource::new(MnistSource { dir: dir("mnist")?, preset: Preset::mnist(), cache: dirs.data_cache.clone() })
        }
        DatasetKind::FashionMnist => AnySource::new(MnistSource {
            dir: dir("fashion_mnist")?,
            preset: Preset::fashion_mnist(),
            cache: dirs.data_cache.clone(),
        }),
        DatasetKind::Idx => AnySource::new(IdxSource {
            files: needs(
                &spec.files,
                "idx",
                "[data.files]",
                "[data.files] train_images = \"train-images-idx3-ubyte.gz\", \
                 train_labels = \"train-labels-idx1-ubyte.gz\"",
            )?,
            dir: dir("idx")?,
            cache: dirs.data_cache.clone(),
        }),
        DatasetKind::Synthetic => {
            AnySource::new(SyntheticSource { config: spec.synthetic.clone().unwrap_or_default(), seed })
        }
        DatasetKind::Text => AnySource::new(TextSource {
            cache: dirs.token_cache(&dir("text")?),
            config: needs(
                &spec.text,
                "text",
                "[data.text]",
                "[data.text] train = [\"train.txt\"], validation = [\"val.txt\"], block_size = 64",
            )?,
            dir: dir("text")?,
        }),
        DatasetKind::Tokens => AnySource::new(TokensSource {
            config: needs(
                &spec.tokens,
                "tokens",
                "[data.tokens]",
                "[data.tokens] train = [\"train.bin\"], validation = [\"val.bin\"], block_size = 256",
            )?,
            dir: dir("tokens")?,
        }),
        DatasetKind::Csv => AnySource::new(CsvSource {
            config: needs(&spec.csv, "csv", "[data.csv]", "[data.csv] train = \"train.csv\", label = \"species\"")?,
            dir: dir("csv")?,
        }),
        DatasetKind::Npy => AnySource::new(NpySource {
            config: needs(
                &spec.npy,
                "npy",
                "[data.npy]",
                "[data.npy] train = { features = \"x_train.npy\", labels = \"y_train.npy\" }",
            )?,
            dir: dir("npy")?,
        }),
        DatasetKind::ImageFolder => AnySource::new(ImageFolderSource {
            config: spec.image_folder.clone().unwrap_or_default(),
            dir: dir("image_folder")?,
        }),
        DatasetKind::Cifar10 => AnySource::new(CifarSource { dir: dir("cifar10")?, dataset: CifarDataset::Cifar10 }),
        DatasetKind::Cifar100 => {
            AnySource::new(CifarSource { dir: dir("cifar100")?, dataset: spec.cifar100.unwrap_or_default().dataset() })
        }
        DatasetKind::Tfrecord => AnySource::new(TfRecordSource {
            config: needs(
                &spec.tfrecord,
                "tfrecord",
                "[data.tfrecord]",
                "[data.tfrecord] train = [\"train-*.tfrecord\"], shape = [28, 28, 1], classes = 10",
            )?,
            dir: dir("tfrecord")?,
        }),
        DatasetKind::Jsonl => AnySource::new(JsonlSource {
            cache: dirs.token_cache(&dir("jsonl")?),
            config: needs(
                &spec.jsonl,
                "jsonl",
                "[data.jsonl]",
                "[data.jsonl] train = [\"train.jsonl\"], text = { field = \"text\", block_size = 64 }",
            )?,
            dir: dir("jsonl")?,
        }),
        DatasetKind::Parquet => AnySource::new(ParquetSource {
            cache: dirs.token_cache(&dir("parquet")?),
            config: needs(
                &spec.parquet,
                "parquet",
                "[data.parquet]",
                "[data.parquet] train = [\"data/train-*.parquet\"], text = { column = \"text\", block_size = 64 }",
            )?,
            dir: dir("parquet")?,
        }),
        DatasetKind::HfDatasets => AnySource::new(HfDatasetsSource {
            cache: dirs.token_cache(&dir("hf_datasets")?),
            config: needs(
                &spec.hf_datasets,
                "hf_datasets",
                "[data.hf_datasets]",
                "[data.hf_datasets] validation = \"test\", text = { column = \"text\", block_size = 64 }",
            )?,
            dir: dir("hf_datasets")?,
        }),
    })
}

/// Plans the pipeline over `source` (whose facts are `facts`) for the `replicas` of a
/// strategy of `kind`.
pub fn resolve(
    spec: &DataSpec,
    source: &AnySource,
    facts: &DataFacts,
    kind: StrategyKind,
    replicas: &Replicas,
    diags: &mut Vec<Diagnostic>,
) -> DataPlan {
    // Under parameter_server each worker reads its own shuffle of every example, as
    // TensorFlow's `create_per_worker_dataset`: nothing is sharded.
    let workers = match kind {
        StrategyKind::ParameterServer => 1,
        StrategyKind::Default
        | StrategyKind::OneDevice
        | StrategyKind::Mirrored
        | StrategyKind::CentralStorage
        | StrategyKind::MultiWorkerMirrored => replicas.num_workers,
    };
    let shard = if workers <= 1 {
        ShardPolicy::None
    } else {
        match spec.auto_shard_policy {
            AutoShardPolicy::Auto if facts.train_files >= workers => ShardPolicy::File,
            AutoShardPolicy::Auto | AutoShardPolicy::Data => ShardPolicy::Data,
            AutoShardPolicy::File => {
                if facts.train_files < workers {
                    diags.push(
                        Diagnostic::error(
                            "data.auto_shard_policy",
                            format!(
                                "auto_shard_policy = \"file\" needs at least as many training files as workers: {} file{} for {workers} workers",
                                facts.train_files,
                                if facts.train_files == 1 { "" } else { "s" }
                            ),
                        )
                        .help("use auto_shard_policy = \"data\" (or \"auto\"), or split the training data into more files"),
                    );
                }
                ShardPolicy::File
            }
            AutoShardPolicy::Off => {
                diags.push(
                    Diagnostic::warning("data.auto_shard_policy", format!("auto_shard_policy = \"off\": all {workers} workers read every example, so each epoch sees every example {workers} times"))
                        .help("use \"auto\" or \"data\" unless duplicates are intended"),
                );
                ShardPolicy::Off
            }
        }
    };
    for warning in &facts.warnings {
        diags.push(Diagnostic::warning(warning.key.clone(), warning.message.clone()).help(warning.help.clone()));
    }
    let (preprocessing, facts) = super::preprocessing::resolve(spec.preprocessing.as_ref(), &**source, facts, diags);
    if spec.prefetch == 0 {
        diags.push(
            Diagnostic::warning("data.prefetch", "data.prefetch = 0 prepares batches on the training thread")
                .help("use prefetch = 2"),
        );
    }
    DataPlan {
        source: source.clone(),
        facts,
        preprocessing,
        shuffle: shuffle(spec, &**source, diags),
        drop_remainder: spec.drop_remainder,
        prefetch: spec.prefetch,
        shard,
        num_shards: if shard == ShardPolicy::None { 1 } else { workers },
    }
}

/// How each data-epoch is ordered: `data.shuffle_buffer`, or for a stream (TFRecord), which
/// cannot be shuffled whole, its own `data.<name>.shuffle_buffer`.
fn shuffle(spec: &DataSpec, source: &dyn DataSource, diags: &mut Vec<Diagnostic>) -> Shuffle {
    let Some(own) = source.stream_shuffle() else { return Shuffle::from_buffer_size(spec.shuffle_buffer) };
    if let Some(size) = spec.shuffle_buffer {
        let name = source.name();
        diags.push(
            Diagnostic::error(
                "data.shuffle_buffer",
                format!(
                    "data.shuffle_buffer = {size} does not apply to dataset = \"{name}\": a stream is shuffled by its own buffer"
                ),
            )
            .help(format!("remove it and set data.{name}.shuffle_buffer = {size} instead")),
        );
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn dirs(data: Option<&str>) -> DataDirs {
        DataDirs { trainrun_data_dir: data.map(PathBuf::from), ..DataDirs::default() }
    }

    #[test]
    fn a_preset_needs_a_folder() {
        let err = source(&DataSpec::default(), &dirs(None), 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mnist: no data folder: set `data.dir` or TRAINRUN_DATA_DIR (neither XDG_CACHE_HOME nor \
             HOME is set, so there is no cache folder either)"
        );
    }

    #[test]
    fn idx_needs_its_files_section() {
        let spec = DataSpec { dataset: DatasetKind::Idx, ..DataSpec::default() };
        let err = source(&spec, &dirs(Some("/d")), 0).unwrap_err();
        assert!(err.to_string().starts_with("`data.dataset = \"idx\"` needs `[data.files]`"));
    }

    #[test]
    fn synthetic_needs_no_folder() {
        let spec = DataSpec { dataset: DatasetKind::Synthetic, ..DataSpec::default() };
        let source = source(&spec, &DataDirs::default(), 3).unwrap();
        assert_eq!(source.dir(), None);
        let facts = source.facts().unwrap();
        assert_eq!((facts.train_examples, facts.test_examples, facts.train_files), (60_000, 10_000, 0));
    }
}

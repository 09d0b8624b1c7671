//! The `hf_datasets` source: a folder Hugging Face `datasets` wrote with `save_to_disk` (what
//! `load_from_disk` reads), read with the Arrow crates, never loaded whole.
//!
//! A `Dataset` folder holds `state.json` (which names its Arrow files), `dataset_info.json` and
//! the Arrow IPC stream files `data-00000-of-0000N.arrow`; a `DatasetDict` folder holds
//! `dataset_dict.json` (its splits) and one such folder per split ([`folder`]). The training
//! split is `train` (a `DatasetDict`'s, or the `Dataset` itself), the validation split the one
//! `validation` names. Each file's record batches are read alone, only the columns named
//! ([`ipc`]).
//!
//! `[data.hf_datasets]` reads the columns as `[data.parquet]` does, with the same code
//! (`columnar`): a `text` column for a language model, or a `table` of numeric and list columns
//! and a label (a `ClassLabel` is an integer column), streamed record batch by record batch
//! through a shuffle buffer, record batches dealt to workers under the `file` policy, resumed
//! from (file, record batch, row).

pub(super) mod folder;
pub(super) mod ipc;
#[cfg(test)]
mod tests;

use super::columnar::{self, Columnar, ColumnarFile, documents};
use super::parquet::{ParquetTable, ParquetText, dataset, table_input, table_splits};
use super::{DataSource, RawValues, ReadAs, TextOrTable, require};
use crate::data::error::DataError;
use crate::data::examples::{Split, StreamSplit as _};
use crate::data::pipeline::Shuffle;
use crate::data::source::text::Texts;
use crate::data::{DataFacts, Dataset, Vocabulary};
use folder::SplitFiles;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[data.hf_datasets]`: how to read the folder `data.dir` names, which `save_to_disk` wrote.
/// Exactly one of `text` and `table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfDatasetsConfig {
    /// The `DatasetDict` split trained on. Default: `train`; a `Dataset` folder (one split,
    /// a `state.json`) is trained on whole and takes no split name. Example: `train = "train"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<String>,
    /// The `DatasetDict` split evaluated as the test split. Default: none (nothing is
    /// evaluated). Example: `validation = "test"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<String>,
    /// Read a string column as documents for a language model, as `data.parquet.text`.
    /// Example: `text = { column = "text", block_size = 64 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<ParquetText>,
    /// Read numeric columns as features and one column as the label, as `data.parquet.table`.
    /// Example: `table = { label = "label", features = ["pixels"] }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<ParquetTable>,
    /// Rows in the shuffle buffer a table's training rows stream through, as
    /// `tf.data.Dataset.shuffle(buffer_size)` (text windows are shuffled whole).
    /// `0` reads rows in file order. Default: `1024`. Example: `shuffle_buffer = 10000`.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

fn default_shuffle_buffer() -> usize {
    1024
}

/// `data.dataset = "hf_datasets"`: the `save_to_disk` folder `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct HfDatasetsSource {
    /// The token cache's folder, for a text column.
    pub cache: PathBuf,
    pub dir: PathBuf,
    pub config: HfDatasetsConfig,
}

/// `[data.hf_datasets]`, for the errors of reading it as text or as a table.
const SECTION: TextOrTable = TextOrTable {
    dataset: "hf_datasets",
    no_train: "data.hf_datasets.train (a split name)",
    neither: "data.hf_datasets.text (a language model's documents) or data.hf_datasets.table (features and a label)",
    example: EXAMPLE,
};

const EXAMPLE: &str = "[data.hf_datasets] validation = \"test\", text = { column = \"text\", block_size = 64 }";

impl DataSource for HfDatasetsSource {
    fn name(&self) -> &'static str {
        "hf_datasets"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    /// What `save_to_disk` writes that is not there: the folder's `dataset_dict.json` or
    /// `state.json`, a split's `state.json` and `dataset_info.json`, the Arrow files
    /// `state.json` names.
    fn missing_files(&self) -> Vec<String> {
        folder::missing(&self.dir, &self.config)
    }

    /// Text: the documents are read and counted in tokens. A table: the stream headers give
    /// the counts, the label column its classes.
    fn facts(&self) -> Result<DataFacts, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(self.texts(text)?.facts()),
            ReadAs::Table(table) => {
                let files = folder::split_files(&self.dir, &self.config)?;
                let (train, test) = table_splits(Columnar::HfDatasets, &files.train, &files.validation, table)?;
                let units = train.unit_lens().len();
                Ok(dataset(train, test).facts(units))
            }
        }
    }

    /// Text: tokenized windows in memory. A table: the files opened for streaming.
    fn load(&self) -> Result<Dataset, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => self.texts(text)?.dataset(),
            ReadAs::Table(table) => {
                let files = folder::split_files(&self.dir, &self.config)?;
                let (train, test) = table_splits(Columnar::HfDatasets, &files.train, &files.validation, table)?;
                Ok(dataset(train, test))
            }
        }
    }

    /// A `Dataset` folder `save_to_disk` wrote (its Arrow files in order) or one `.arrow` file,
    /// with the training split's feature columns (the label column may be left out), read as
    /// the validation split's rows are.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        match self.read_as()? {
            ReadAs::Text(_) => Err(SECTION.no_text_input(file)),
            ReadAs::Table(table) => {
                let train = folder::split_files(&self.dir, &self.config)?.train;
                table_input(Columnar::HfDatasets, &train, table, &folder::input_files(file)?, file)
            }
        }
    }

    fn raw_values(&self) -> RawValues {
        columnar::raw_values(self.config.text.as_ref())
    }

    /// A table's rows stream through `data.hf_datasets.shuffle_buffer`; text windows are read
    /// by index, shuffled by the pipeline.
    fn stream_shuffle(&self) -> Option<Shuffle> {
        columnar::stream_shuffle(self.config.text.as_ref(), self.config.shuffle_buffer)
    }
}

impl HfDatasetsSource {
    /// The folder's files there, and the one way of reading them that the config names.
    fn read_as(&self) -> Result<ReadAs<'_, ParquetText, ParquetTable>, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let config = &self.config;
        let train = [config.train.clone().unwrap_or_else(|| folder::TRAIN.into())];
        SECTION.read_as(&train, config.text.as_ref(), config.table.as_ref(), || {
            Columnar::HfDatasets.bad(
                "both data.hf_datasets.text and data.hf_datasets.table are set; a dataset is read one way: keep \
                 the one the model needs"
                    .into(),
            )
        })
    }

    /// The text column's documents of both splits, tokenized.
    fn texts(&self, text: &ParquetText) -> Result<Texts, DataError> {
        let (train, validation) = self.opened()?;
        documents::texts(Columnar::HfDatasets, (&train, &validation), text, &self.cache)
    }

    /// Both splits' files, their stream headers read.
    fn opened(&self) -> Result<(Vec<ColumnarFile>, Vec<ColumnarFile>), DataError> {
        let SplitFiles { train, validation } = folder::split_files(&self.dir, &self.config)?;
        Ok((Columnar::HfDatasets.open_all(&train)?, Columnar::HfDatasets.open_all(&validation)?))
    }

    /// The text column read as documents with their token streams' lengths, the token cache
    /// built (`trainrun tokenize`); an error when `[data.hf_datasets]` reads a table.
    pub fn documents(&self) -> Result<Texts, DataError> {
        self.texts(self.text_config()?)
    }

    /// The vocabulary alone: nothing is tokenized (`char` reads the documents for its characters).
    pub fn vocabulary(&self) -> Result<Vocabulary, DataError> {
        let (train, validation) = self.opened()?;
        documents::vocabulary(Columnar::HfDatasets, (&train, &validation), self.text_config()?, &self.cache)
    }

    fn text_config(&self) -> Result<&ParquetText, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(text),
            ReadAs::Table(_) => Err(Columnar::HfDatasets.table_not_text()),
        }
    }
}

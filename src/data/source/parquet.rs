//! The `parquet` source: Parquet files (a Hugging Face Hub export such as
//! `data/train-00000-of-00004.parquet`, anything pyarrow writes), read through the `parquet`
//! crate's Arrow reader one row group at a time, only the columns named, never a file whole.
//! `[data.parquet]` reads them in one of two ways:
//!
//! - `text`: a string column (default `text`) holds documents for a language model; each
//!   file's documents, each followed by the end-of-text text, form one token stream, tokenized
//!   and cut into `block_size` windows as the `text` and `jsonl` sources' are (`text`).
//! - `table`: numeric columns and fixed-size (or equal-length) list columns of numbers (pixels)
//!   are the features, flattened in order; one column is the label: classes (whole numbers, or
//!   names) or a regression target. Rows are streamed (`split`): the shard units are the row
//!   groups of the files in order, so the `file` policy deals row groups to workers, and an
//!   epoch goes through a shuffle buffer of `shuffle_buffer` rows; a resumed run replays its
//!   epoch up to the cursor, skipping whole row groups by their counts in the footers and rows
//!   within one by a row selection, never decoding them.
//!
//! Only the footers are read for counts; a table's label column is read once more for its
//! classes. Every error names the file, and a column's errors the column, its type and what
//! was expected. How columns, streams and text columns are read is shared with `hf_datasets`
//! (`columnar`); this file and `file` hold only what is Parquet's.

pub(super) mod file;
#[cfg(test)]
mod tests;

use super::columnar::columns::TableColumns;
use super::columnar::split::ColumnarSplit;
use super::columnar::{self, Columnar, ColumnarFile, documents};
use super::csv::CsvLabels;
use super::text::{EachBatch, Texts};
use super::{DataSource, RawValues, ReadAs, TextOrTable, expand, is_pattern, require};
use crate::data::error::DataError;
use crate::data::examples::{Split, StreamSplit as _};
use crate::data::pipeline::Shuffle;
use crate::data::{DataFacts, Dataset, Tokenization, Vocabulary, VocabularyFrom};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

/// `[data.parquet]`: Parquet files, read as text for a language model or as a table.
/// Exactly one of `text` and `table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetConfig {
    /// Training files, relative to `data.dir` (or absolute); each a file name or a glob
    /// pattern, matches sorted. Required. Example: `train = ["data/train-*.parquet"]`.
    pub train: Vec<String>,
    /// Validation files, evaluated as the test split. Default: none (nothing is evaluated).
    /// Example: `validation = ["data/validation-*.parquet"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<String>,
    /// Read a string column as documents for a language model.
    /// Example: `text = { column = "text", block_size = 64 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<ParquetText>,
    /// Read numeric columns as features and one column as the label.
    /// Example: `table = { label = "label", features = ["pixels"] }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<ParquetTable>,
    /// Rows in the shuffle buffer a table's training rows stream through, as
    /// `tf.data.Dataset.shuffle(buffer_size)` (text windows are shuffled whole, as `text`'s).
    /// `0` reads rows in file order. Default: `1024`. Example: `shuffle_buffer = 10000`.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

fn default_shuffle_buffer() -> usize {
    1024
}

/// `data.parquet.text`: documents for a language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetText {
    /// The string column holding each document. Default: `text`. Example: `column = "content"`.
    #[serde(default = "default_column")]
    pub column: String,
    /// Text put after every document, as `data.jsonl.text.end_of_text`. Default: a newline
    /// for `char` and `byte`, `<|endoftext|>` for a tiktoken encoding.
    /// Example: `end_of_text = "\n\n"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_text: Option<String>,
    /// How text becomes tokens, as `data.text.tokenization`. Default: `char`.
    /// Example: `tokenization = "gpt2"`.
    #[serde(default)]
    pub tokenization: Tokenization,
    /// Which text the `char` vocabulary is built from, as `data.text.vocabulary`.
    /// Default: `train`. Example: `vocabulary = "train_and_validation"`.
    #[serde(default)]
    pub vocabulary: VocabularyFrom,
    /// Tokens the model sees per example (windows of `block_size + 1` tokens). Required.
    /// Example: `block_size = 64`.
    pub block_size: NonZeroUsize,
}

fn default_column() -> String {
    "text".into()
}

/// `data.parquet.table`: feature columns and a label column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetTable {
    /// The label column: integers (classes `0..=max`), strings (class names, sorted), or
    /// floats (a regression target). Required. Example: `label = "label"`.
    pub label: String,
    /// Feature columns, in this order: numbers, booleans, or lists of numbers of one length
    /// (flattened). Required. Example: `features = ["pixels"]`.
    pub features: Vec<String>,
    /// What the label column holds, as `data.csv.labels`. Default: told by its type (floats
    /// are regression targets, integers and strings classes). Example: `labels = "regression"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<CsvLabels>,
    /// The shape one example's features take (their count must match), for a convolution.
    /// Default: one dimension, the flattened features. Example: `shape = [28, 28, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
}

/// `data.dataset = "parquet"`: `[data.parquet]`'s files in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParquetSource {
    /// The token cache's folder, for a text column.
    pub cache: PathBuf,
    pub dir: PathBuf,
    pub config: ParquetConfig,
}

/// `[data.parquet]`, for the errors of reading it as text or as a table.
const SECTION: TextOrTable = TextOrTable {
    dataset: "parquet",
    no_train: "at least one file in data.parquet.train",
    neither: "data.parquet.text (a language model's documents) or data.parquet.table (features and a label)",
    example: EXAMPLE,
};

impl DataSource for ParquetSource {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    /// Plain names (not patterns) that are not files; a pattern matching nothing is the
    /// error of `facts` and `load`.
    fn missing_files(&self) -> Vec<String> {
        let names = self.config.train.iter().chain(&self.config.validation);
        names.filter(|n| !is_pattern(n) && !self.dir.join(n).is_file()).cloned().collect()
    }

    /// Text: the documents are read and counted in tokens. A table: the footers give the
    /// counts, the label column its classes.
    fn facts(&self) -> Result<DataFacts, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(self.texts(text)?.facts()),
            ReadAs::Table(table) => {
                let (train, test) = self.splits(table)?;
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
                let (train, test) = self.splits(table)?;
                Ok(dataset(train, test))
            }
        }
    }

    /// A Parquet file with the training files' feature columns (the label column may be left
    /// out), read as the test split's rows are.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        match self.read_as()? {
            ReadAs::Text(_) => Err(SECTION.no_text_input(file)),
            ReadAs::Table(table) => table_input(Columnar::Parquet, &self.files()?.train, table, &[file.into()], file),
        }
    }

    fn raw_values(&self) -> RawValues {
        columnar::raw_values(self.config.text.as_ref())
    }

    /// A table's rows stream through `data.parquet.shuffle_buffer`; text windows are read by
    /// index, shuffled by the pipeline.
    fn stream_shuffle(&self) -> Option<Shuffle> {
        columnar::stream_shuffle(self.config.text.as_ref(), self.config.shuffle_buffer)
    }
}

/// The training and validation files, globs expanded.
struct ParquetFiles {
    train: Vec<PathBuf>,
    validation: Vec<PathBuf>,
}

impl ParquetSource {
    /// The files there, and the one way of reading them that the config names.
    fn read_as(&self) -> Result<ReadAs<'_, ParquetText, ParquetTable>, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let config = &self.config;
        SECTION.read_as(&config.train, config.text.as_ref(), config.table.as_ref(), || {
            bad("both data.parquet.text and data.parquet.table are set; a file is read one way: keep the one the \
                 model needs"
                .into())
        })
    }

    fn files(&self) -> Result<ParquetFiles, DataError> {
        Ok(ParquetFiles {
            train: expand(&self.dir, &self.config.train, bad)?,
            validation: expand(&self.dir, &self.config.validation, bad)?,
        })
    }

    /// The text column's documents, tokenized.
    fn texts(&self, text: &ParquetText) -> Result<Texts, DataError> {
        let (train, validation) = self.opened()?;
        documents::texts(Columnar::Parquet, (&train, &validation), text, &self.cache)
    }

    /// Both splits' files, their footers read.
    fn opened(&self) -> Result<(Vec<ColumnarFile>, Vec<ColumnarFile>), DataError> {
        let files = self.files()?;
        Ok((Columnar::Parquet.open_all(&files.train)?, Columnar::Parquet.open_all(&files.validation)?))
    }

    /// The text column read as documents with their token streams' lengths, the token cache
    /// built (`trainrun tokenize`); an error when `[data.parquet]` reads a table.
    pub fn documents(&self) -> Result<Texts, DataError> {
        self.texts(self.text_config()?)
    }

    /// The vocabulary alone: nothing is tokenized (`char` reads the documents for its characters).
    pub fn vocabulary(&self) -> Result<Vocabulary, DataError> {
        let (train, validation) = self.opened()?;
        documents::vocabulary(Columnar::Parquet, (&train, &validation), self.text_config()?, &self.cache)
    }

    /// Every document of the training files' text column, a batch at a time, read as a run's
    /// tokenizing pass reads them (`bench --only corpus` times it): nothing is tokenized.
    pub(crate) fn read_training_documents(&self, each: &mut EachBatch<'_>) -> Result<(), DataError> {
        let text = self.text_config()?;
        for file in &self.opened()?.0 {
            documents::documents(Columnar::Parquet, file, &text.column)?.each_batch(each)?;
        }
        Ok(())
    }

    fn text_config(&self) -> Result<&ParquetText, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(text),
            ReadAs::Table(_) => Err(Columnar::Parquet.table_not_text()),
        }
    }

    /// Both splits' files, their footers read and their columns checked.
    fn splits(&self, table: &ParquetTable) -> Result<(ColumnarSplit, Option<ColumnarSplit>), DataError> {
        let files = self.files()?;
        table_splits(Columnar::Parquet, &files.train, &files.validation, table)
    }
}

/// The training and (when there are files) validation splits of a columnar table: the files
/// opened, the columns resolved from the training files and checked in every file.
pub(super) fn table_splits(
    format: Columnar,
    train: &[PathBuf],
    validation: &[PathBuf],
    table: &ParquetTable,
) -> Result<(ColumnarSplit, Option<ColumnarSplit>), DataError> {
    let train = format.open_all(train)?;
    let columns = TableColumns::resolve(format, &train, table)?;
    let test = match validation.is_empty() {
        true => None,
        false => Some(ColumnarSplit::new(format.open_all(validation)?, columns.clone())?),
    };
    Ok((ColumnarSplit::new(train, columns)?, test))
}

/// The feature rows of `files` (the Arrow or Parquet files of one `predict --input` path,
/// `named`), in order: each file's columns checked against the training files' (the label
/// column may be missing).
pub(super) fn table_input(
    format: Columnar,
    train: &[PathBuf],
    table: &ParquetTable,
    files: &[PathBuf],
    named: &Path,
) -> Result<Split, DataError> {
    let columns = TableColumns::resolve(format, &format.open_all(train)?, table)?;
    let mut values = vec![];
    for file in files {
        let input = format.open(file)?;
        let schema = input.schema().clone();
        columns.check_features(file, &schema)?;
        let indices = columns.feature_names().map(|n| schema.index_of(n).map_err(|e| format.unreadable(file, e)));
        let projection = indices.collect::<Result<Vec<_>, _>>()?;
        for batch in input.read_all(&projection, INPUT_BATCH_ROWS) {
            values.extend(columns.decode_features(&batch?, file)?);
        }
    }
    crate::data::Unlabeled::split(named, columns.shape().to_vec(), values)
}

/// Rows decoded at a time from a `predict --input` file (all are held: predictions are
/// written whole).
const INPUT_BATCH_ROWS: usize = 8192;

/// A columnar table's dataset: its splits streamed.
pub(super) fn dataset(train: ColumnarSplit, test: Option<ColumnarSplit>) -> Dataset {
    let (labels, classes) = train.columns().labels();
    Dataset { train: Split::of(train), test: test.map(Split::of), labels, vocabulary: None, classes }
}

/// The source's error for what `[data.parquet]` asks that the files cannot give.
fn bad(problem: String) -> DataError {
    Columnar::Parquet.bad(problem)
}

const EXAMPLE: &str = "[data.parquet] train = [\"data/train-*.parquet\"], table = { label = \"label\", features = \
                       [\"pixels\"] }";

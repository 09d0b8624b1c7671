//! The `jsonl` source: JSON Lines files (one JSON object a line), plain, gzip or zstd
//! compressed, read in one of two ways that `[data.jsonl]` names:
//!
//! - `text`: a string field of each object (default `text`) is a document for a language model.
//!   A file's documents, each followed by the end-of-text text, form one token stream, tokenized
//!   and cut into windows as the `text` source's files are (the same tokenizations, vocabulary
//!   and `vocab.json`).
//! - `table`: named numeric fields (numbers, or arrays of numbers flattened in order) are the
//!   features and one field is the label, read as the `csv` source reads its columns: classes
//!   (names, or whole numbers) or regression targets.
//!
//! Neither is ever held. Text is streamed: a file's documents are read a batch at a time
//! whenever they are needed (the `char` vocabulary, the token stream), and the stream goes
//! through the token cache; its windows are read by index. A table is checked in one pass at
//! load that keeps nothing per row (`table`), then streamed row by row (`stream`) as the
//! Parquet tables are: the files are the shard units, an epoch goes through a shuffle buffer
//! of `shuffle_buffer` rows, and a resumed run replays its epoch up to the cursor. Every error
//! names the file, the line, the column and the byte offset (`lines`).

mod lines;
mod stream;
mod table;

use super::text::{DOCUMENTS_A_BATCH, DocumentReader, EachBatch, Joining, TextFile, Texts, Tokenizing, borrowed};
use super::{DataSource, RawValues, ReadAs, TextOrTable, missing_in, require};
use crate::data::error::DataError;
use crate::data::examples::Split;
use crate::data::pipeline::Shuffle;
use crate::data::{CsvLabels, DataFacts, DataWarning, Dataset, Tokenization, Vocabulary, VocabularyFrom};
use lines::Lines;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use stream::JsonlTableSplit;

/// `[data.jsonl]`: JSON Lines files, read as text for a language model or as a table.
/// Exactly one of `text` and `table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonlConfig {
    /// Training files, relative to `data.dir` (or absolute): plain, gzip or zstd (told by their
    /// first bytes). Required. Example: `train = ["train.jsonl.gz"]`.
    pub train: Vec<String>,
    /// Validation files, evaluated as the test split. Default: none (nothing is evaluated).
    /// Example: `validation = ["val.jsonl"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<String>,
    /// Read a text field as documents for a language model.
    /// Example: `text = { field = "text", block_size = 64 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<JsonlText>,
    /// Read numeric fields as features and one field as the label.
    /// Example: `table = { label = "species", features = ["petal_length", "petal_width"] }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<JsonlTable>,
    /// Rows in the shuffle buffer a table's training rows stream through, as
    /// `tf.data.Dataset.shuffle(buffer_size)` (text windows are shuffled whole, as `text`'s).
    /// `0` reads rows in file order. Default: `1024`. Example: `shuffle_buffer = 10000`.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

fn default_shuffle_buffer() -> usize {
    1024
}

/// `data.jsonl.text`: documents for a language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonlText {
    /// The string field holding each document. Default: `text`. Example: `field = "content"`.
    #[serde(default = "default_field")]
    pub field: String,
    /// Text put after every document, so the model learns where one ends; with a tiktoken
    /// encoding or a `tokenizer.json` its special tokens (`<|endoftext|>`) are read as such.
    /// Default: a newline for `char` and `byte`, `<|endoftext|>` for a tiktoken encoding, the
    /// `tokenizer.json`'s end-of-text special token (`<|endoftext|>`, `<|end_of_text|>`, `</s>`,
    /// `<eos>` or `[SEP]`; required when it has none). Example: `end_of_text = "\n\n"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_text: Option<String>,
    /// How text becomes tokens, as `data.text.tokenization` (`char`, `byte`, `gpt2`,
    /// `r50k_base`, `cl100k_base`, `o200k_base`, `{ tokenizer_json = "tokenizer.json" }`).
    /// Default: `char`. Example: `tokenization = "gpt2"`.
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

fn default_field() -> String {
    "text".into()
}

/// `data.jsonl.table`: a table of numeric fields and a label field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonlTable {
    /// The label field. Required. Example: `label = "species"`.
    pub label: String,
    /// Feature fields, in this order: numbers, or arrays of numbers (flattened). Default: every
    /// field of the first training object but the label, in sorted order.
    /// Example: `features = ["sepal_length", "sepal_width"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// What the label field holds, as `data.csv.labels`. Default: inferred (strings or whole
    /// numbers are classes, other numbers regression targets). Example: `labels = "regression"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<CsvLabels>,
}

/// `[data.jsonl]`, for the errors of reading it as text or as a table.
const SECTION: TextOrTable = TextOrTable {
    dataset: "jsonl",
    no_train: "at least one file in data.jsonl.train",
    neither: "data.jsonl.text (a language model's documents) or data.jsonl.table (features and a label)",
    example: EXAMPLE,
};

/// `data.dataset = "jsonl"`: `[data.jsonl]`'s files in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonlSource {
    pub dir: PathBuf,
    pub config: JsonlConfig,
    /// The token cache's folder.
    pub cache: PathBuf,
}

impl DataSource for JsonlSource {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_in(&self.dir, self.config.train.iter().chain(&self.config.validation))
    }

    /// Example counts, shape and labels: the files are read (a table's in one pass that
    /// keeps nothing per row).
    fn facts(&self) -> Result<DataFacts, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(self.texts(text)?.facts()),
            ReadAs::Table(table) => {
                let scan = self.scan(table)?;
                let path = self.dir.join(&self.config.train[0]);
                let warning = |name: &String| DataWarning::one_class("data.jsonl.table.label", &path, name);
                let files = |s: &table::Scanned| s.rows.iter().filter(|&&r| r > 0).count();
                Ok(DataFacts {
                    train_examples: scan.train.rows.iter().sum(),
                    test_examples: scan.test.as_ref().map_or(0, |t| t.rows.iter().sum()),
                    example_shape: vec![scan.train.features.width()],
                    labels: scan.kind,
                    // The shard units of the `file` policy: the files that hold rows.
                    train_files: files(&scan.train),
                    warnings: scan.single_class.iter().map(warning).collect(),
                })
            }
        }
    }

    /// Reads the files: tokenized windows, or a table opened for streaming.
    fn load(&self) -> Result<Dataset, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => self.texts(text)?.dataset(),
            ReadAs::Table(table) => {
                let scan = self.scan(table)?;
                let split = |s| Split::of(JsonlTableSplit::new(s, &table.label));
                Ok(Dataset {
                    train: split(scan.train),
                    test: scan.test.map(split),
                    labels: scan.kind,
                    vocabulary: None,
                    classes: scan.classes,
                })
            }
        }
    }

    /// A JSONL file of objects with the training table's feature fields (the label field may
    /// be left out).
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        match self.read_as()? {
            ReadAs::Text(_) => Err(SECTION.no_text_input(file)),
            ReadAs::Table(table) => {
                let train: Vec<PathBuf> = self.config.train.iter().map(|f| self.dir.join(f)).collect();
                let (shape, values) = table::read_input(&train, table, file)?;
                crate::data::Unlabeled::split(file, shape, values)
            }
        }
    }

    fn raw_values(&self) -> RawValues {
        match self.config.text {
            Some(_) => RawValues::Tokens,
            None => RawValues::Numbers,
        }
    }

    /// A table's rows stream through `data.jsonl.shuffle_buffer`; text windows are read by
    /// index, shuffled by the pipeline.
    fn stream_shuffle(&self) -> Option<Shuffle> {
        let buffer = NonZeroUsize::new(self.config.shuffle_buffer).map_or(Shuffle::Off, Shuffle::Buffer);
        self.config.table.as_ref().map(|_| buffer)
    }
}

impl JsonlSource {
    /// The files there, and the one way of reading them that the config names.
    fn read_as(&self) -> Result<ReadAs<'_, JsonlText, JsonlTable>, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let config = &self.config;
        SECTION.read_as(&config.train, config.text.as_ref(), config.table.as_ref(), || DataError::BadJsonl {
            problem: "both data.jsonl.text and data.jsonl.table are set; a file is read one way: keep the one the \
                      model needs"
                .into(),
        })
    }

    /// The documents of every file, each file's joined into one text.
    fn texts(&self, config: &JsonlText) -> Result<Texts, DataError> {
        let (train, validation, how) = self.read_documents(config)?;
        Texts::new(train, validation, &how)
    }

    /// The files read as documents with their token streams' lengths (`trainrun tokenize`); an
    /// error when `[data.jsonl]` reads a table.
    pub fn documents(&self) -> Result<Texts, DataError> {
        self.texts(self.text_config()?)
    }

    /// The vocabulary alone: nothing is tokenized (`char` reads the files for its characters).
    pub fn vocabulary(&self) -> Result<Vocabulary, DataError> {
        let (train, validation, how) = self.read_documents(self.text_config()?)?;
        how.vocabulary(&train, &validation).map(|(vocabulary, _)| vocabulary)
    }

    fn text_config(&self) -> Result<&JsonlText, DataError> {
        match self.read_as()? {
            ReadAs::Text(text) => Ok(text),
            ReadAs::Table(_) => Err(DataError::BadJsonl {
                problem: "this spec reads data.jsonl.table (numbers and a label), not text to tokenize".into(),
            }),
        }
    }

    /// The training and validation files' documents, and how they are tokenized.
    fn read_documents(&self, config: &JsonlText) -> Result<(Vec<TextFile>, Vec<TextFile>, Tokenizing), DataError> {
        let streamed =
            |path: PathBuf| TextFile::streamed(path.clone(), JsonlDocuments { path, field: config.field.clone() });
        let all = |names: &[String]| -> Vec<TextFile> { names.iter().map(|n| streamed(self.dir.join(n))).collect() };
        let tokenizing = Tokenizing {
            dataset: "jsonl",
            reading: format!("jsonl field {:?}", config.field),
            cache: self.cache.clone(),
            tokenization: config.tokenization.clone(),
            vocabulary: config.vocabulary,
            block: config.block_size.get(),
            joining: Joining::Documents { end_of_text: config.end_of_text.clone(), key: "data.jsonl.text.end_of_text" },
        };
        Ok((all(&self.config.train), all(&self.config.validation), tokenizing))
    }

    /// The pass over the training files and the validation files, the latter read as the
    /// former.
    fn scan(&self, config: &JsonlTable) -> Result<table::TableScan, DataError> {
        let paths = |names: &[String]| names.iter().map(|n| self.dir.join(n)).collect::<Vec<_>>();
        table::scan(&paths(&self.config.train), &paths(&self.config.validation), config)
    }
}

const EXAMPLE: &str = "[data.jsonl] train = [\"train.jsonl\"], text = { field = \"text\", block_size = 64 }";

/// The documents of a JSONL file: its objects' string field `field`, read a batch at a time.
struct JsonlDocuments {
    path: PathBuf,
    field: String,
}

impl DocumentReader for JsonlDocuments {
    fn each_batch(&self, each: &mut EachBatch<'_>) -> Result<(), DataError> {
        let (path, field) = (&self.path, &self.field);
        let mut lines = Lines::open(path)?;
        let mut documents = Vec::with_capacity(DOCUMENTS_A_BATCH);
        while let Some(mut line) = lines.next_object()? {
            match line.object.remove(field) {
                Some(Value::String(document)) => documents.push(document),
                Some(other) => return Err(table::wrong_field(path, &line, field, lines::kind_of(&other), "a string")),
                None => return Err(table::missing_field(path, &line, field)),
            }
            if documents.len() == DOCUMENTS_A_BATCH {
                each(&borrowed(&documents))?;
                documents.clear();
            }
        }
        match documents.is_empty() {
            true => Ok(()),
            false => each(&borrowed(&documents)),
        }
    }
}

#[cfg(test)]
mod tests;

//! A columnar text column as a language model's documents: each file's string column streamed
//! unit by unit (only that column, a record batch at a time, never the file whole), its
//! documents tokenized and windowed as the `text` and `jsonl` sources' are ([`Texts`]).
//!
//! A second thread reads (decompresses and decodes) the next record batches while the caller
//! works on the current one, a few batches ahead at most and in order, so the documents, their
//! ids and the token cache are the same as read on one thread. The documents are handed out as
//! slices of the Arrow string array, whose UTF-8 the `parquet` and `arrow` readers have checked:
//! nothing is copied or checked again.

use super::columns::{column, strings, wrong_type};
use super::{Columnar, ColumnarFile};
use crate::data::Vocabulary;
use crate::data::error::DataError;
use crate::data::source::parquet::ParquetText;
use crate::data::source::text::{DOCUMENTS_A_BATCH, DocumentReader, EachBatch, Joining, TextFile, Texts, Tokenizing};
use arrow_array::Array as _;
use std::path::Path;

/// The documents of every training and validation file, checked, counted and (through the token
/// cache) tokenized.
pub(in crate::data::source) fn texts(
    format: Columnar,
    files: (&[ColumnarFile], &[ColumnarFile]),
    config: &ParquetText,
    cache: &Path,
) -> Result<Texts, DataError> {
    let (train, validation, tokenizing) = read(format, files, config, cache)?;
    Texts::new(train, validation, &tokenizing)
}

/// The vocabulary alone (`trainrun tokenize --text`): nothing is tokenized, and only `char`
/// reads the documents, for its characters.
pub(in crate::data::source) fn vocabulary(
    format: Columnar,
    files: (&[ColumnarFile], &[ColumnarFile]),
    config: &ParquetText,
    cache: &Path,
) -> Result<Vocabulary, DataError> {
    let (train, validation, tokenizing) = read(format, files, config, cache)?;
    tokenizing.vocabulary(&train, &validation).map(|(vocabulary, _)| vocabulary)
}

/// Every file's documents (streamed) and how they are tokenized.
fn read(
    format: Columnar,
    (train, validation): (&[ColumnarFile], &[ColumnarFile]),
    config: &ParquetText,
    cache: &Path,
) -> Result<(Vec<TextFile>, Vec<TextFile>, Tokenizing), DataError> {
    // `reading` is part of the token cache's key: how a file's documents are read.
    let (dataset, end_of_text_key, reading) = match format {
        Columnar::Parquet => ("parquet", "data.parquet.text.end_of_text", "parquet"),
        Columnar::HfDatasets => ("hf_datasets", "data.hf_datasets.text.end_of_text", "arrow"),
    };
    let tokenizing = Tokenizing {
        dataset,
        reading: format!("{reading} column {:?}", config.column),
        cache: cache.to_path_buf(),
        tokenization: config.tokenization.clone(),
        vocabulary: config.vocabulary,
        block: config.block_size.get(),
        joining: Joining::Documents { end_of_text: config.end_of_text.clone(), key: end_of_text_key },
    };
    let all = |files: &[ColumnarFile]| -> Result<Vec<TextFile>, DataError> {
        files.iter().map(|f| documents(format, f, &config.column)).collect()
    };
    Ok((all(train)?, all(validation)?, tokenizing))
}

/// The documents of column `name` of `file`, in order, streamed; the column checked to hold
/// strings.
pub(in crate::data::source) fn documents(
    format: Columnar,
    file: &ColumnarFile,
    name: &str,
) -> Result<TextFile, DataError> {
    let (path, schema) = (file.path(), file.schema());
    let data_type = column(format, path, schema, name)?;
    if strings(&arrow_array::new_empty_array(data_type)).is_none() {
        return Err(wrong_type(format, path, name, data_type, "strings (documents)"));
    }
    let index = schema.index_of(name).map_err(|e| format.unreadable(path, e))?;
    let reader = ColumnDocuments { format, file: file.clone(), index, name: name.to_owned() };
    Ok(TextFile::streamed(path.to_path_buf(), reader))
}

/// A file's string column, read a record batch at a time.
struct ColumnDocuments {
    format: Columnar,
    file: ColumnarFile,
    /// The column's index in the file's schema.
    index: usize,
    name: String,
}

/// Record batches read ahead of the one handed out: enough to cover a page's decompression
/// (a batch is about [`DOCUMENTS_A_BATCH`] documents), few enough that the documents in memory
/// stay a handful of batches whatever the file's size.
const READ_AHEAD: usize = 4;

impl DocumentReader for ColumnDocuments {
    fn each_batch(&self, each: &mut EachBatch<'_>) -> Result<(), DataError> {
        let (format, path, name) = (self.format, self.file.path(), &self.name);
        std::thread::scope(|scope| {
            let (sender, batches) = std::sync::mpsc::sync_channel(READ_AHEAD);
            scope.spawn(move || {
                for batch in self.file.read_all(&[self.index], DOCUMENTS_A_BATCH) {
                    let failed = batch.is_err();
                    // The receiver is gone when the caller stopped (on an error): read no further.
                    if sender.send(batch).is_err() || failed {
                        break;
                    }
                }
            });
            // Returning drops `batches`, which ends the reading thread before the scope joins it.
            for batch in batches {
                let batch = batch?;
                let array = batch.column(0);
                if array.null_count() > 0 {
                    return Err(format.bad(format!(
                        "{}: column `{name}` has {} null documents; every row needs a string",
                        path.display(),
                        array.null_count()
                    )));
                }
                let documents = strings(array.as_ref())
                    .ok_or_else(|| wrong_type(format, path, name, array.data_type(), "strings"))?;
                each(&documents)?;
            }
            Ok(())
        })
    }
}

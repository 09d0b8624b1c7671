//! A columnar text column as a language model's documents: each file's string column read unit
//! by unit (only that column), its documents tokenized and windowed as the `text` and `jsonl`
//! sources' are ([`Texts`]).

use super::columns::{column, strings, wrong_type};
use super::{Columnar, ColumnarFile};
use crate::data::error::DataError;
use crate::data::source::parquet::ParquetText;
use crate::data::source::text::{Joining, TextFile, Texts, Tokenizing};
use arrow_array::Array as _;
use std::path::Path;

/// Record batches of this many rows (from a Parquet row group): documents are strings, so a
/// batch of them is small.
const BATCH_ROWS: usize = 8192;

/// The documents of every training and validation file, checked and counted.
pub(in crate::data::source) fn texts(
    format: Columnar,
    (train, validation): (&[ColumnarFile], &[ColumnarFile]),
    config: &ParquetText,
    cache: &Path,
) -> Result<Texts, DataError> {
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
    Texts::new(all(train)?, all(validation)?, &tokenizing)
}

/// The documents of column `name` of `file`, in order.
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
    let mut documents = vec![];
    for batch in file.read_all(&[index], BATCH_ROWS) {
        let batch = batch?;
        let array = batch.column(0);
        if array.null_count() > 0 {
            return Err(format.bad(format!(
                "{}: column `{name}` has {} null documents; every row needs a string",
                path.display(),
                array.null_count()
            )));
        }
        let values =
            strings(array.as_ref()).ok_or_else(|| wrong_type(format, path, name, array.data_type(), "strings"))?;
        documents.extend(values.into_iter().map(str::to_owned));
    }
    Ok(TextFile { path: path.to_path_buf(), documents })
}

//! A Parquet text column as a language model's documents: each file's string column read row
//! group by row group (only that column), its documents tokenized and windowed as the `text`
//! and `jsonl` sources' are ([`Texts`]).

use super::columns::{column, open, strings, wrong_type};
use super::split::unreadable;
use super::{ParquetFiles, ParquetText};
use crate::data::error::DataError;
use crate::data::source::text::{Joining, TextFile, Texts, Tokenizing};
use arrow_array::Array as _;
use parquet::arrow::ProjectionMask;
use std::path::{Path, PathBuf};

/// Record batches of this many rows: documents are strings, so a batch of them is small.
const BATCH_ROWS: usize = 8192;

/// The documents of every training and validation file, checked and counted.
pub(super) fn texts(files: &ParquetFiles, config: &ParquetText, cache: &Path) -> Result<Texts, DataError> {
    let tokenizing = Tokenizing {
        dataset: "parquet",
        reading: format!("parquet column {:?}", config.column),
        cache: cache.to_path_buf(),
        tokenization: config.tokenization.clone(),
        vocabulary: config.vocabulary,
        block: config.block_size.get(),
        joining: Joining::Documents { end_of_text: config.end_of_text.clone(), key: "data.parquet.text.end_of_text" },
    };
    let all = |paths: &[PathBuf]| -> Result<Vec<TextFile>, DataError> {
        paths.iter().map(|p| documents(p, &config.column)).collect()
    };
    Texts::new(all(&files.train)?, all(&files.validation)?, &tokenizing)
}

/// The documents of column `name` of the file at `path`, in order.
pub(super) fn documents(path: &Path, name: &str) -> Result<TextFile, DataError> {
    let builder = open(path)?;
    let schema = builder.schema().clone();
    let data_type = column(path, &schema, name)?;
    if strings(&arrow_array::new_empty_array(data_type)).is_none() {
        return Err(wrong_type(path, name, data_type, "strings (documents)"));
    }
    let index = schema.index_of(name).map_err(|e| unreadable(path, e))?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder.with_projection(mask).with_batch_size(BATCH_ROWS).build().map_err(|e| unreadable(path, e))?;
    let mut documents = vec![];
    for batch in reader {
        let batch = batch.map_err(|e| unreadable(path, e))?;
        let array = batch.column(0);
        if array.null_count() > 0 {
            return Err(super::bad(format!(
                "{}: column `{name}` has {} null documents; every row needs a string",
                path.display(),
                array.null_count()
            )));
        }
        let values = strings(array.as_ref()).ok_or_else(|| wrong_type(path, name, array.data_type(), "strings"))?;
        documents.extend(values.into_iter().map(str::to_owned));
    }
    Ok(TextFile { path: path.to_path_buf(), documents })
}

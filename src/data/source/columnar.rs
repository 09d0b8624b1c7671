//! What the sources of columnar files share (`parquet`, `hf_datasets`): files of Arrow record
//! batches ([`ColumnarFile`]) in one of two formats ([`Columnar`]), cut into shard units (a
//! Parquet row group, an Arrow IPC stream's record batch) whose row counts are known before
//! anything is decoded; a table's columns found and checked in their Arrow schemas
//! ([`columns`]), a `datasets` `ClassLabel`'s names among them ([`class_label`]); a table split streamed unit by unit with an exact resume cursor ([`split`]);
//! and a string column read as a language model's documents ([`documents`]).
//!
//! A format answers only how its files are opened and read; everything a column or a cursor
//! means is written once here, for both.

mod class_label;
pub(super) mod columns;
pub(super) mod documents;
pub(super) mod split;

use super::RawValues;
use super::hf_datasets::ipc::IpcStreamFile;
use super::parquet::ParquetText;
use super::parquet::file::ParquetFile;
use crate::data::error::DataError;
use crate::data::pipeline::Shuffle;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

/// What a columnar source's values are: token ids when it reads a `text` column, else numbers.
pub(super) fn raw_values(text: Option<&ParquetText>) -> RawValues {
    match text {
        Some(_) => RawValues::Tokens,
        None => RawValues::Numbers,
    }
}

/// A table's rows stream through the source's `shuffle_buffer`; a text column's windows are
/// read by index, shuffled by the pipeline (`None`).
pub(super) fn stream_shuffle(text: Option<&ParquetText>, shuffle_buffer: usize) -> Option<Shuffle> {
    match text {
        Some(_) => None,
        None => Some(NonZeroUsize::new(shuffle_buffer).map_or(Shuffle::Off, Shuffle::Buffer)),
    }
}

/// The format of a source's columnar files, which words its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Columnar {
    /// Parquet files (`data.parquet`).
    Parquet,
    /// Arrow IPC stream files written by Hugging Face `datasets`' `save_to_disk`
    /// (`data.hf_datasets`).
    HfDatasets,
}

impl Columnar {
    /// The spec section the source reads, for errors (`data.parquet`).
    pub(super) fn section(self) -> &'static str {
        match self {
            Columnar::Parquet => "data.parquet",
            Columnar::HfDatasets => "data.hf_datasets",
        }
    }

    /// The source's error for what its section asks that the files cannot give.
    pub(super) fn bad(self, problem: String) -> DataError {
        match self {
            Columnar::Parquet => DataError::BadParquet { problem },
            Columnar::HfDatasets => DataError::BadHfDatasets { problem },
        }
    }

    /// The error of `trainrun tokenize` for a section that reads a table.
    pub(super) fn table_not_text(self) -> DataError {
        self.bad(format!("this spec reads {}.table (numbers and a label), not text to tokenize", self.section()))
    }

    /// The error for a file the format's reader cannot read (exit 4, naming the file).
    pub(super) fn unreadable(self, path: &Path, detail: impl std::fmt::Display) -> DataError {
        let (path, detail) = (path.to_path_buf(), detail.to_string());
        match self {
            Columnar::Parquet => DataError::ParquetUnreadable { path, detail },
            Columnar::HfDatasets => DataError::ArrowUnreadable { path, detail },
        }
    }

    /// `path` opened: its schema and its units' row counts read (a footer, or a pass over the
    /// stream's message headers), nothing decoded.
    pub(super) fn open(self, path: &Path) -> Result<ColumnarFile, DataError> {
        Ok(match self {
            Columnar::Parquet => ColumnarFile::Parquet(ParquetFile::open(path)?),
            Columnar::HfDatasets => ColumnarFile::Ipc(IpcStreamFile::open(path)?),
        })
    }

    /// Every file of `paths`, opened.
    pub(super) fn open_all(self, paths: &[PathBuf]) -> Result<Vec<ColumnarFile>, DataError> {
        paths.iter().map(|p| self.open(p)).collect()
    }
}

/// One columnar file, opened.
#[derive(Debug, Clone)]
pub(super) enum ColumnarFile {
    Parquet(ParquetFile),
    Ipc(IpcStreamFile),
}

impl ColumnarFile {
    pub(super) fn path(&self) -> &Path {
        match self {
            ColumnarFile::Parquet(f) => f.path(),
            ColumnarFile::Ipc(f) => f.path(),
        }
    }

    /// The file's Arrow schema.
    pub(super) fn schema(&self) -> &SchemaRef {
        match self {
            ColumnarFile::Parquet(f) => f.schema(),
            ColumnarFile::Ipc(f) => f.schema(),
        }
    }

    /// Rows in each of the file's units (row groups, record batches), in order.
    pub(super) fn unit_rows(&self) -> &[usize] {
        match self {
            ColumnarFile::Parquet(f) => f.unit_rows(),
            ColumnarFile::Ipc(f) => f.unit_rows(),
        }
    }

    /// The record batches of unit `unit`, only columns `columns` (indices into the schema),
    /// its first `skip` rows left out without decoding them where the format allows; a
    /// Parquet unit is decoded `batch_rows` rows at a time, an IPC batch as it was written.
    pub(super) fn read(
        &self,
        unit: usize,
        skip: usize,
        columns: &[usize],
        batch_rows: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch, DataError>> + Send>, DataError> {
        match self {
            ColumnarFile::Parquet(f) => f.read(unit, skip, columns, batch_rows),
            ColumnarFile::Ipc(f) => f.read(unit, skip, columns),
        }
    }

    /// Every record batch of the file, only columns `columns`, unit after unit.
    pub(super) fn read_all(
        &self,
        columns: &[usize],
        batch_rows: usize,
    ) -> impl Iterator<Item = Result<RecordBatch, DataError>> + '_ {
        let columns = columns.to_vec();
        (0..self.unit_rows().len()).flat_map(move |unit| match self.read(unit, 0, &columns, batch_rows) {
            Ok(batches) => batches,
            Err(e) => Box::new(std::iter::once(Err(e))),
        })
    }
}

//! One Parquet file as a [`ColumnarFile`](crate::data::source::columnar::ColumnarFile): its
//! footer read once (schema, row groups and their row counts), each row group then read alone
//! through the `parquet` crate's Arrow reader with only the columns asked for, rows before a
//! resume point left out by a row selection, never decoded.

use crate::data::error::DataError;
use crate::data::source::columnar::Columnar;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A Parquet file whose footer has been read.
#[derive(Debug, Clone)]
pub(in crate::data::source) struct ParquetFile {
    path: PathBuf,
    metadata: ArrowReaderMetadata,
    /// Rows in each row group.
    rows: Vec<usize>,
}

fn unreadable(path: &Path, detail: impl std::fmt::Display) -> DataError {
    Columnar::Parquet.unreadable(path, detail)
}

impl ParquetFile {
    /// Reads `path`'s footer.
    pub(in crate::data::source) fn open(path: &Path) -> Result<Self, DataError> {
        let file = File::open(path).map_err(|source| DataError::Read { path: path.to_path_buf(), source })?;
        let metadata = ArrowReaderMetadata::load(&file, Default::default()).map_err(|e| unreadable(path, e))?;
        let groups = metadata.metadata().row_groups().iter();
        let rows = groups.map(|g| usize::try_from(g.num_rows()).map_err(|e| unreadable(path, e)));
        let rows = rows.collect::<Result<_, _>>()?;
        Ok(Self { path: path.to_path_buf(), metadata, rows })
    }

    pub(in crate::data::source) fn path(&self) -> &Path {
        &self.path
    }

    pub(in crate::data::source) fn schema(&self) -> &SchemaRef {
        self.metadata.schema()
    }

    /// Rows in each row group.
    pub(in crate::data::source) fn unit_rows(&self) -> &[usize] {
        &self.rows
    }

    /// Row group `row_group`'s record batches of `batch_rows` rows, columns `columns` only,
    /// its first `skip` rows left out by a row selection.
    pub(in crate::data::source) fn read(
        &self,
        row_group: usize,
        skip: usize,
        columns: &[usize],
        batch_rows: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch, DataError>> + Send>, DataError> {
        let path = &self.path;
        let handle = File::open(path).map_err(|source| DataError::Read { path: path.clone(), source })?;
        let projection = ProjectionMask::roots(self.metadata.parquet_schema(), columns.iter().copied());
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, self.metadata.clone())
            .with_row_groups(vec![row_group])
            .with_projection(projection)
            .with_batch_size(batch_rows);
        let rows = self.rows.get(row_group).copied().unwrap_or(0);
        if skip > 0 {
            let selectors = vec![RowSelector::skip(skip), RowSelector::select(rows.saturating_sub(skip))];
            builder = builder.with_row_selection(RowSelection::from(selectors));
        }
        let reader = builder.build().map_err(|e| unreadable(path, e))?;
        let path = path.clone();
        Ok(Box::new(reader.map(move |batch| batch.map_err(|e| unreadable(&path, e)))))
    }
}

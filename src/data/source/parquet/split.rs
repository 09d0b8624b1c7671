//! A Parquet table split as a stream of rows ([`ParquetSplit`]): its files' footers read, its
//! shard units the row groups of the files in order, each opened alone with only the columns
//! read ([`RowStream`]), in order or through the shuffle buffer ([`ParquetReader`]), and read
//! in order by index for evaluation.
//!
//! Resuming replays an epoch up to its cursor: unshuffled, whole row groups are skipped by
//! their counts and rows within one by a row selection, so the position is found from (file,
//! row group, row) without decoding what lies before it.

use super::columns::{TableColumns, open};
use crate::data::error::DataError;
use crate::data::examples::{Examples, StreamReader, StreamSplit};
use crate::data::pipeline::Batch;
use crate::data::source::tfrecord::{Order, ShuffleBuffer};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Rows decoded at a time: a record batch of this many rows is the most held besides the
/// shuffle buffer.
const BATCH_ROWS: usize = 1024;

/// One example: its features and its label.
#[derive(Debug, Clone)]
pub(super) struct TableRow {
    pub x: Vec<f32>,
    pub label: RowLabel,
}

/// A row's label.
#[derive(Debug, Clone, Copy)]
pub(super) enum RowLabel {
    Class(u32),
    Target(f32),
}

/// The error for a file the Parquet reader cannot read.
pub(super) fn unreadable(path: &Path, error: impl fmt::Display) -> DataError {
    DataError::ParquetUnreadable { path: path.to_path_buf(), detail: error.to_string() }
}

/// A file, its footer, and which of its columns are read.
struct TableFile {
    path: PathBuf,
    metadata: ArrowReaderMetadata,
    projection: ProjectionMask,
}

/// A shard unit: one row group of one file.
#[derive(Debug, Clone, Copy)]
struct Unit {
    file: usize,
    row_group: usize,
    rows: usize,
}

/// What every stream over a split shares.
struct Footers {
    files: Vec<TableFile>,
    units: Vec<Unit>,
    columns: TableColumns,
}

/// One split's files as a stream of rows.
pub(super) struct ParquetSplit {
    footers: Arc<Footers>,
    lens: Vec<usize>,
    total: usize,
    /// The in-order stream random access reads from, and the index of its next row.
    sequential: Mutex<Option<(usize, RowStream)>>,
}

impl fmt::Debug for ParquetSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<&Path> = self.footers.files.iter().map(|f| f.path.as_path()).collect();
        f.debug_struct("ParquetSplit").field("files", &files).field("lens", &self.lens).finish_non_exhaustive()
    }
}

impl ParquetSplit {
    /// `paths`' footers read and their columns checked against `columns`.
    pub(super) fn new(paths: Vec<PathBuf>, columns: TableColumns) -> Result<Self, DataError> {
        let (mut files, mut units) = (vec![], vec![]);
        for (f, path) in paths.into_iter().enumerate() {
            let builder = open(&path)?;
            let schema = builder.schema().clone();
            columns.check(&path, &schema)?;
            let indices = columns.names().map(|n| schema.index_of(n).map_err(|e| unreadable(&path, e)));
            let projection = ProjectionMask::roots(builder.parquet_schema(), indices.collect::<Result<Vec<_>, _>>()?);
            let metadata = builder.metadata().clone();
            for (row_group, meta) in metadata.row_groups().iter().enumerate() {
                let rows = usize::try_from(meta.num_rows()).map_err(|e| unreadable(&path, e))?;
                if rows > 0 {
                    units.push(Unit { file: f, row_group, rows });
                }
            }
            let metadata =
                ArrowReaderMetadata::try_new(metadata, Default::default()).map_err(|e| unreadable(&path, e))?;
            files.push(TableFile { path, metadata, projection });
        }
        let lens: Vec<usize> = units.iter().map(|u| u.rows).collect();
        let total = lens.iter().sum();
        let footers = Arc::new(Footers { files, units, columns });
        Ok(Self { footers, lens, total, sequential: Mutex::new(None) })
    }

    /// The columns read.
    pub(super) fn columns(&self) -> &TableColumns {
        &self.footers.columns
    }

    /// Rows of units `units`, in order.
    fn rows(&self, units: &[usize]) -> RowStream {
        RowStream {
            footers: self.footers.clone(),
            units: units.to_vec(),
            next_unit: 0,
            reader: None,
            left: 0,
            rows: Vec::new().into_iter(),
        }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.lens.len()).collect()
    }
}

impl StreamSplit for ParquetSplit {
    /// A Parquet split's shard units are its files' row groups, in order.
    fn unit_lens(&self) -> &[usize] {
        &self.lens
    }

    fn open_units(&self, units: &[usize], order: Order) -> Box<dyn StreamReader> {
        let shuffle = match order {
            Order::Files => None,
            Order::Shuffled { buffer_size, seed, epoch } => Some(ShuffleBuffer::new(buffer_size, seed, epoch)),
        };
        Box::new(ParquetReader { rows: self.rows(units), shuffle, pending: vec![] })
    }

    fn ended_early(&self) -> DataError {
        let files = self.footers.files.iter().map(|f| f.path.clone()).collect();
        DataError::StreamEnded { files, expected: self.total }
    }

    fn refused(&self, problem: String) -> DataError {
        super::bad(problem)
    }
}

impl Examples for ParquetSplit {
    fn len(&self) -> usize {
        self.total
    }

    fn shape(&self) -> &[usize] {
        self.footers.columns.shape()
    }

    /// Reads in file order: forward from the last row read (skipping the ones in between),
    /// from the start again when `i` is behind it.
    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let mut state = self.sequential.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, mut rows) = match state.take() {
            Some((next, rows)) if next <= i => (next, rows),
            _ => (0, self.rows(&self.all())),
        };
        if rows.skip(i - next)? < i - next {
            return Err(StreamSplit::ended_early(self));
        }
        let row = rows.next()?.ok_or_else(|| StreamSplit::ended_early(self))?;
        append_row(row, batch);
        *state = Some((i + 1, rows));
        Ok(())
    }

    /// Rows are read as batches are made: nothing is held but one record batch.
    fn bytes_held(&self) -> usize {
        0
    }

    fn records(&self) -> Option<&dyn StreamSplit> {
        Some(self)
    }
}

fn append_row(row: TableRow, batch: &mut Batch) {
    batch.x.extend_from_slice(&row.x);
    match row.label {
        RowLabel::Class(c) => batch.y.push(c),
        RowLabel::Target(t) => batch.targets.push(t),
    }
}

/// The rows of some units, in order, decoded a record batch at a time.
struct RowStream {
    footers: Arc<Footers>,
    units: Vec<usize>,
    next_unit: usize,
    /// The open unit's reader and its file.
    reader: Option<(usize, ParquetRecordBatchReader)>,
    /// Rows the open reader has still to give.
    left: usize,
    /// Rows decoded and not yet given.
    rows: std::vec::IntoIter<TableRow>,
}

impl RowStream {
    /// The next row, `None` at the end.
    fn next(&mut self) -> Result<Option<TableRow>, DataError> {
        loop {
            if let Some(row) = self.rows.next() {
                return Ok(Some(row));
            }
            if self.reader.is_some() {
                self.decode_next()?;
            } else if !self.open_next(0)? {
                return Ok(None);
            }
        }
    }

    /// Skips `k` rows, decoding none it can skip by counts; returns how many were skipped
    /// (fewer only at the end).
    fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        let mut done = 0;
        while done < k {
            let (held, want) = (self.rows.len(), k - done);
            if held > 0 {
                let n = want.min(held);
                self.rows.nth(n - 1);
                done += n;
            } else if self.reader.is_some() {
                if want >= self.left {
                    done += self.left;
                    (self.reader, self.left) = (None, 0);
                } else {
                    self.decode_next()?;
                }
            } else {
                let Some(&unit) = self.units.get(self.next_unit) else { break };
                let rows = self.footers.units[unit].rows;
                if want >= rows {
                    self.next_unit += 1;
                    done += rows;
                } else {
                    self.open_next(want)?;
                    done += want;
                }
            }
        }
        Ok(done)
    }

    /// Opens the next unit with its first `skip` rows skipped by a row selection; `false`
    /// when every unit has been read.
    fn open_next(&mut self, skip: usize) -> Result<bool, DataError> {
        let Some(&unit) = self.units.get(self.next_unit) else { return Ok(false) };
        self.next_unit += 1;
        let Unit { file, row_group, rows } = self.footers.units[unit];
        let table = &self.footers.files[file];
        let handle = File::open(&table.path).map_err(|source| DataError::Read { path: table.path.clone(), source })?;
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, table.metadata.clone())
            .with_row_groups(vec![row_group])
            .with_projection(table.projection.clone())
            .with_batch_size(BATCH_ROWS);
        if skip > 0 {
            let selectors = vec![RowSelector::skip(skip), RowSelector::select(rows - skip)];
            builder = builder.with_row_selection(RowSelection::from(selectors));
        }
        let reader = builder.build().map_err(|e| unreadable(&table.path, e))?;
        (self.reader, self.left) = (Some((file, reader)), rows - skip);
        Ok(true)
    }

    /// Decodes the open reader's next record batch, or closes it at its end.
    fn decode_next(&mut self) -> Result<(), DataError> {
        let Some((file, reader)) = &mut self.reader else { return Ok(()) };
        let path = &self.footers.files[*file].path;
        match reader.next() {
            Some(batch) => {
                let batch = batch.map_err(|e| unreadable(path, e))?;
                self.left = self.left.saturating_sub(batch.num_rows());
                let mut rows = Vec::with_capacity(batch.num_rows());
                self.footers.columns.decode(&batch, path, &mut rows)?;
                self.rows = rows.into_iter();
            }
            None => (self.reader, self.left) = (None, 0),
        }
        Ok(())
    }
}

/// One pass over some units: rows in order or through the shuffle buffer.
struct ParquetReader {
    rows: RowStream,
    shuffle: Option<ShuffleBuffer<TableRow>>,
    pending: Vec<TableRow>,
}

impl ParquetReader {
    fn next(&mut self) -> Result<Option<TableRow>, DataError> {
        let rows = &mut self.rows;
        match &mut self.shuffle {
            Some(buffer) => buffer.next_from(|| rows.next()),
            None => rows.next(),
        }
    }
}

impl StreamReader for ParquetReader {
    /// Unshuffled, rows are skipped by counts; shuffled, they pass through the buffer (the
    /// outputs after the skip are then the ones an unbroken pass gives).
    fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        if self.shuffle.is_none() {
            return self.rows.skip(k);
        }
        for done in 0..k {
            if self.next()?.is_none() {
                return Ok(done);
            }
        }
        Ok(k)
    }

    fn take(&mut self) -> Result<bool, DataError> {
        let next = self.next()?;
        let more = next.is_some();
        self.pending.extend(next);
        Ok(more)
    }

    fn decode(&mut self, batch: &mut Batch) -> Result<(), DataError> {
        self.pending.drain(..).for_each(|row| append_row(row, batch));
        Ok(())
    }
}

//! A columnar table split as a stream of rows ([`ColumnarSplit`]): its files opened (footers,
//! or stream headers), its shard units the units of the files in order (Parquet row groups,
//! Arrow record batches), each read alone with only the columns read ([`RowStream`]), in order
//! or through the shuffle buffer ([`RowReader`], which the `jsonl` table shares), and read in
//! order by index for evaluation.
//!
//! Resuming replays an epoch up to its cursor: unshuffled, whole units are skipped by their
//! counts and rows within one by the format's row selection, so the position is found from
//! (file, unit, row) without decoding what lies before it.

use super::ColumnarFile;
use super::columns::TableColumns;
use crate::data::error::DataError;
use crate::data::examples::{Examples, StreamReader, StreamSplit};
use crate::data::pipeline::Batch;
use crate::data::source::tfrecord::{Order, ShuffleBuffer};
use arrow_array::RecordBatch;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Rows decoded at a time (from a Parquet row group; an Arrow record batch is read as it was
/// written): a record batch of this many rows is the most held besides the shuffle buffer.
const BATCH_ROWS: usize = 1024;

/// A unit's record batches.
type Batches = Box<dyn Iterator<Item = Result<RecordBatch, DataError>> + Send>;

/// One example: its features and its label.
#[derive(Debug, Clone)]
pub(in crate::data::source) struct TableRow {
    pub x: Vec<f32>,
    pub label: RowLabel,
}

/// A row's label.
#[derive(Debug, Clone, Copy)]
pub(in crate::data::source) enum RowLabel {
    Class(u32),
    Target(f32),
}

/// A file, and which of its columns are read (indices into its schema).
struct TableFile {
    file: ColumnarFile,
    projection: Vec<usize>,
}

/// A shard unit: one unit (row group, record batch) of one file.
#[derive(Debug, Clone, Copy)]
struct Unit {
    file: usize,
    unit: usize,
    rows: usize,
}

/// What every stream over a split shares.
struct Footers {
    files: Vec<TableFile>,
    units: Vec<Unit>,
    columns: TableColumns,
}

/// One split's files as a stream of rows.
pub(in crate::data::source) struct ColumnarSplit {
    footers: Arc<Footers>,
    lens: Vec<usize>,
    total: usize,
    /// The in-order stream random access reads from, and the index of its next row.
    sequential: Mutex<Option<(usize, RowStream)>>,
}

impl fmt::Debug for ColumnarSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<&Path> = self.footers.files.iter().map(|f| f.file.path()).collect();
        f.debug_struct("ColumnarSplit").field("files", &files).field("lens", &self.lens).finish_non_exhaustive()
    }
}

impl ColumnarSplit {
    /// `opened` files, their columns checked against `columns`.
    pub(in crate::data::source) fn new(opened: Vec<ColumnarFile>, columns: TableColumns) -> Result<Self, DataError> {
        let (mut files, mut units) = (vec![], vec![]);
        for (f, file) in opened.into_iter().enumerate() {
            let (path, schema) = (file.path(), file.schema());
            columns.check(path, schema)?;
            let indices = columns.names().map(|n| schema.index_of(n).map_err(|e| columns.format().unreadable(path, e)));
            let projection = indices.collect::<Result<Vec<_>, _>>()?;
            let nonempty = file.unit_rows().iter().enumerate().filter(|(_, rows)| **rows > 0);
            units.extend(nonempty.map(|(unit, &rows)| Unit { file: f, unit, rows }));
            files.push(TableFile { file, projection });
        }
        let lens: Vec<usize> = units.iter().map(|u| u.rows).collect();
        let total = lens.iter().sum();
        let footers = Arc::new(Footers { files, units, columns });
        Ok(Self { footers, lens, total, sequential: Mutex::new(None) })
    }

    /// The columns read.
    pub(in crate::data::source) fn columns(&self) -> &TableColumns {
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

impl StreamSplit for ColumnarSplit {
    /// A columnar split's shard units are its files' units (row groups, record batches), in order.
    fn unit_lens(&self) -> &[usize] {
        &self.lens
    }

    fn open_units(&self, units: &[usize], order: Order) -> Box<dyn StreamReader> {
        Box::new(RowReader::new(self.rows(units), order))
    }

    fn ended_early(&self) -> DataError {
        let files = self.footers.files.iter().map(|f| f.file.path().to_path_buf()).collect();
        DataError::StreamEnded { files, expected: self.total }
    }

    fn refused(&self, problem: String) -> DataError {
        self.footers.columns.format().bad(problem)
    }
}

impl Examples for ColumnarSplit {
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

pub(in crate::data::source) fn append_row(row: TableRow, batch: &mut Batch) {
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
    /// The open unit's record batches and its file.
    reader: Option<(usize, Batches)>,
    /// Rows the open reader has still to give.
    left: usize,
    /// Rows decoded and not yet given.
    rows: std::vec::IntoIter<TableRow>,
}

impl OrderedRows for RowStream {
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
}

impl RowStream {
    /// Opens the next unit with its first `skip` rows skipped by a row selection; `false`
    /// when every unit has been read.
    fn open_next(&mut self, skip: usize) -> Result<bool, DataError> {
        let Some(&unit) = self.units.get(self.next_unit) else { return Ok(false) };
        self.next_unit += 1;
        let Unit { file, unit, rows } = self.footers.units[unit];
        let table = &self.footers.files[file];
        let reader = table.file.read(unit, skip, &table.projection, BATCH_ROWS)?;
        (self.reader, self.left) = (Some((file, reader)), rows - skip);
        Ok(true)
    }

    /// Decodes the open reader's next record batch, or closes it at its end.
    fn decode_next(&mut self) -> Result<(), DataError> {
        let Some((file, reader)) = &mut self.reader else { return Ok(()) };
        let path = self.footers.files[*file].file.path();
        match reader.next() {
            Some(batch) => {
                let batch = batch?;
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

/// The rows of some shard units of a table read only in order, in order: a columnar
/// split's (`RowStream`) or a JSONL table's.
pub(in crate::data::source) trait OrderedRows: Send {
    /// The next row, `None` at the end.
    fn next(&mut self) -> Result<Option<TableRow>, DataError>;

    /// Skips `k` rows, decoding none it can skip by counts; returns how many were skipped
    /// (fewer only at the end).
    fn skip(&mut self, k: usize) -> Result<usize, DataError>;
}

/// One pass over some units: rows in order or through the shuffle buffer, which holds at most
/// its `buffer_size` rows (besides the rows taken for the batch being made).
pub(in crate::data::source) struct RowReader<R> {
    rows: R,
    shuffle: Option<ShuffleBuffer<TableRow>>,
    pending: Vec<TableRow>,
}

impl<R: OrderedRows> RowReader<R> {
    /// A pass over `rows` in `order`.
    pub(in crate::data::source) fn new(rows: R, order: Order) -> Self {
        let shuffle = match order {
            Order::Files => None,
            Order::Shuffled { buffer_size, seed, epoch } => Some(ShuffleBuffer::new(buffer_size, seed, epoch)),
        };
        Self { rows, shuffle, pending: vec![] }
    }

    /// Rows held in the shuffle buffer now (a test's measure of memory).
    #[cfg(test)]
    pub(in crate::data::source) fn buffered(&self) -> usize {
        self.shuffle.as_ref().map_or(0, ShuffleBuffer::len)
    }

    fn next(&mut self) -> Result<Option<TableRow>, DataError> {
        let rows = &mut self.rows;
        match &mut self.shuffle {
            Some(buffer) => buffer.next_from(|| rows.next()),
            None => rows.next(),
        }
    }
}

impl<R: OrderedRows> StreamReader for RowReader<R> {
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

/// Checks that a pass over `units` of `records` (in file order, and through a shuffle buffer)
/// after skipping `k` rows gives the rows an unbroken pass gives after its first `k`, for
/// every `k` up to past the end, as a resumed pipeline relies on; returns the rows of a pass
/// (test helper; `width` values a row).
#[cfg(test)]
pub(in crate::data::source) fn assert_skips_resume_an_unbroken_pass(
    records: &dyn StreamSplit,
    units: &[usize],
    width: usize,
) -> usize {
    let rest = |order, k| {
        let mut reader = records.open_units(units, order);
        let skipped = reader.skip(k).unwrap();
        while reader.take().unwrap() {}
        let mut batch = Batch::default();
        reader.decode(&mut batch).unwrap();
        (skipped, batch.x, batch.y)
    };
    let buffer = std::num::NonZeroUsize::new(4).unwrap();
    let mut rows = 0;
    for order in [Order::Files, Order::Shuffled { buffer_size: buffer, seed: 9, epoch: 2 }] {
        let (_, x, y) = rest(order, 0);
        rows = y.len();
        for k in 0..=y.len() + 1 {
            let (skipped, xk, yk) = rest(order, k);
            assert_eq!(skipped, k.min(y.len()), "{order:?} skip {k}");
            assert_eq!((&xk[..], &yk[..]), (&x[width * skipped..], &y[skipped..]), "{order:?} skip {k}");
        }
    }
    rows
}

//! A JSONL table split as a stream of rows ([`JsonlTableSplit`]): its shard units are its
//! files (those holding objects), each read line by line through its decompressor, in order or
//! through the shuffle buffer the columnar tables use ([`RowReader`]), and in order by index for
//! evaluation. Nothing is held but the open files' buffers and the shuffle buffer's rows.
//!
//! Resuming replays an epoch up to its cursor: unshuffled, whole files are skipped by the
//! counts of the pass at load, and objects within one by counting its lines, never parsing
//! them, so the position is found from (file, object) without decoding what lies before it.

use super::lines::{Lines, ObjectLine};
use super::table::{FeatureReader, Labeler, Scanned, label_value};
use crate::data::error::{DataError, Position};
use crate::data::examples::{Examples, StreamReader, StreamSplit};
use crate::data::pipeline::Batch;
use crate::data::source::columnar::split::{OrderedRows, RowReader, TableRow, append_row};
use crate::data::source::tfrecord::Order;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

/// A shard unit: a file and its objects.
#[derive(Debug, Clone, Copy)]
struct FileUnit {
    file: usize,
    rows: usize,
}

/// What every stream over a split shares.
struct TableFiles {
    files: Vec<PathBuf>,
    units: Vec<FileUnit>,
    features: FeatureReader,
    labels: Labeler,
    /// The label field.
    label: String,
    total: usize,
}

impl TableFiles {
    /// Object `line` of file `file` as a row, read as the pass at load read it.
    fn row(&self, file: usize, line: &ObjectLine) -> Result<TableRow, DataError> {
        let path = &self.files[file];
        let mut x = Vec::with_capacity(self.features.width());
        self.features.decode(path, line, &mut x)?;
        let value = label_value(path, line, &self.label)?;
        let label = self.labels.label(&value).ok_or_else(|| DataError::Malformed {
            path: path.clone(),
            at: Position::LineByte { line: line.line, column: 1, byte: line.byte },
            problem: format!(
                "label field `{}` holds {value:?}, which the file did not hold when the run started; a file must \
                 not change during a run: start it again",
                self.label
            ),
        })?;
        Ok(TableRow { x, label })
    }

    fn ended_early(&self) -> DataError {
        DataError::StreamEnded { files: self.files.clone(), expected: self.total }
    }
}

/// One split's files as a stream of rows.
pub(super) struct JsonlTableSplit {
    table: Arc<TableFiles>,
    lens: Vec<usize>,
    shape: [usize; 1],
    /// The in-order stream random access reads from, and the index of its next row.
    sequential: Mutex<Option<(usize, JsonlRows)>>,
}

impl fmt::Debug for JsonlTableSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlTableSplit")
            .field("files", &self.table.files)
            .field("lens", &self.lens)
            .finish_non_exhaustive()
    }
}

impl JsonlTableSplit {
    /// The split the pass at load found, reading field `label` as its labels.
    pub(super) fn new(scanned: Scanned, label: &str) -> Self {
        let nonempty = scanned.rows.iter().enumerate().filter(|(_, rows)| **rows > 0);
        let units: Vec<FileUnit> = nonempty.map(|(file, &rows)| FileUnit { file, rows }).collect();
        let lens: Vec<usize> = units.iter().map(|u| u.rows).collect();
        let shape = [scanned.features.width()];
        let table = TableFiles {
            files: scanned.files,
            units,
            features: scanned.features,
            labels: scanned.labels,
            label: label.to_string(),
            total: lens.iter().sum(),
        };
        Self { table: Arc::new(table), lens, shape, sequential: Mutex::new(None) }
    }

    /// Rows of units `units`, in order.
    fn rows(&self, units: &[usize]) -> JsonlRows {
        JsonlRows { table: self.table.clone(), units: units.to_vec(), next_unit: 0, open: None }
    }
}

impl StreamSplit for JsonlTableSplit {
    /// A JSONL table's shard units are its files, in order.
    fn unit_lens(&self) -> &[usize] {
        &self.lens
    }

    fn open_units(&self, units: &[usize], order: Order) -> Box<dyn StreamReader> {
        Box::new(RowReader::new(self.rows(units), order))
    }

    fn ended_early(&self) -> DataError {
        self.table.ended_early()
    }

    fn refused(&self, problem: String) -> DataError {
        DataError::BadJsonl { problem }
    }
}

impl Examples for JsonlTableSplit {
    fn len(&self) -> usize {
        self.table.total
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Reads in file order: forward from the last row read (skipping the ones in between),
    /// from the start again when `i` is behind it.
    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let mut state = self.sequential.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, mut rows) = match state.take() {
            Some((next, rows)) if next <= i => (next, rows),
            _ => (0, self.rows(&(0..self.lens.len()).collect::<Vec<_>>())),
        };
        if rows.skip(i - next)? < i - next {
            return Err(self.table.ended_early());
        }
        let row = rows.next()?.ok_or_else(|| self.table.ended_early())?;
        append_row(row, batch);
        *state = Some((i + 1, rows));
        Ok(())
    }

    /// Rows are read as batches are made: nothing is held but the open file's buffers.
    fn bytes_held(&self) -> usize {
        0
    }

    fn records(&self) -> Option<&dyn StreamSplit> {
        Some(self)
    }
}

/// The file being read and the objects it has still to give.
struct OpenFile {
    file: usize,
    lines: Lines,
    left: usize,
}

/// The rows of some units, in order, one object at a time.
struct JsonlRows {
    table: Arc<TableFiles>,
    units: Vec<usize>,
    next_unit: usize,
    open: Option<OpenFile>,
}

impl JsonlRows {
    /// Opens the next unit; `false` when every unit has been read.
    fn open_next(&mut self) -> Result<bool, DataError> {
        let Some(&unit) = self.units.get(self.next_unit) else { return Ok(false) };
        self.next_unit += 1;
        let FileUnit { file, rows } = self.table.units[unit];
        self.open = Some(OpenFile { file, lines: Lines::open(&self.table.files[file])?, left: rows });
        Ok(true)
    }
}

impl OrderedRows for JsonlRows {
    fn next(&mut self) -> Result<Option<TableRow>, DataError> {
        loop {
            match &mut self.open {
                Some(open) if open.left > 0 => {
                    let line = open.lines.next_object()?.ok_or_else(|| self.table.ended_early())?;
                    open.left -= 1;
                    return self.table.row(open.file, &line).map(Some);
                }
                Some(_) => self.open = None,
                None => {
                    if !self.open_next()? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Whole files are skipped by their counts, objects within one by counting lines.
    fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        let mut done = 0;
        while done < k {
            let want = k - done;
            match &mut self.open {
                Some(open) if open.left > 0 => {
                    let n = want.min(open.left);
                    if open.lines.skip_objects(n)? < n {
                        return Err(self.table.ended_early());
                    }
                    open.left -= n;
                    done += n;
                }
                Some(_) => self.open = None,
                None => {
                    let Some(&unit) = self.units.get(self.next_unit) else { break };
                    let rows = self.table.units[unit].rows;
                    if want >= rows {
                        self.next_unit += 1;
                        done += rows;
                    } else {
                        self.open_next()?;
                    }
                }
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
impl JsonlTableSplit {
    /// A pass over units `units` in `order` as a [`RowReader`], to count the rows it holds.
    pub(super) fn reader(&self, units: &[usize], order: Order) -> RowReader<impl OrderedRows> {
        RowReader::new(self.rows(units), order)
    }
}

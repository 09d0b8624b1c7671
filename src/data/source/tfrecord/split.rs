//! A TFRecord split as a stream of examples ([`RecordSplit`]): its files, counted by a framing
//! pass, opened in file order or through the shuffle buffer ([`RecordReader`]), and read in
//! order by index for evaluation.

use super::{Compression, Encoded, ExampleSpec, ExampleStream, Order, scan};
use crate::data::error::DataError;
use crate::data::examples::{Examples, StreamReader, StreamSplit};
use crate::data::formats::Dtype;
use crate::data::pipeline::Batch;
use rayon::prelude::*;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;

/// Records in each file (a framing pass: every length CRC checked, payloads skipped). A plain
/// file that fails at once but starts as gzip does is named as such, with the key to set.
fn count(files: &[PathBuf], compression: Compression) -> Result<Vec<usize>, DataError> {
    files
        .iter()
        .map(|f| {
            scan(f, compression).map(|offsets| offsets.len()).map_err(|e| match (compression, &e) {
                (Compression::None, DataError::BadCrc { offset: 0, .. })
                    if Compression::detect(f).is_ok_and(|c| c == Compression::Gzip) =>
                {
                    DataError::BadTfRecord {
                        problem: format!(
                            "{} is gzip-compressed; set data.tfrecord.compression = \"gzip\"",
                            f.display()
                        ),
                    }
                }
                _ => e,
            })
        })
        .collect()
}

/// One split's files as a stream of examples.
pub struct RecordSplit {
    files: Vec<PathBuf>,
    /// Records in each file.
    lens: Vec<usize>,
    compression: Compression,
    spec: ExampleSpec,
    shape: Vec<usize>,
    total: usize,
    /// The in-order stream random access reads from, and the index of its next example.
    sequential: Mutex<Option<(usize, ExampleStream)>>,
}

impl fmt::Debug for RecordSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordSplit").field("files", &self.files).field("lens", &self.lens).finish_non_exhaustive()
    }
}

impl RecordSplit {
    pub(super) fn new(files: Vec<PathBuf>, compression: Compression, spec: ExampleSpec) -> Result<Self, DataError> {
        let lens = count(&files, compression)?;
        let shape = spec.shape();
        let total = lens.iter().sum();
        Ok(Self { files, lens, compression, spec, shape, total, sequential: Mutex::new(None) })
    }

    /// Records in each file, in order.
    pub fn file_lens(&self) -> &[usize] {
        &self.lens
    }

    /// The examples of files `files` (indices, in this order), in `order`.
    pub fn open(&self, files: &[usize], order: Order) -> RecordReader {
        let paths = files.iter().filter_map(|&f| self.files.get(f).cloned()).collect();
        RecordReader {
            stream: ExampleStream::new(paths, self.compression, self.spec.clone(), order),
            scale: self.spec.dtype() == Dtype::U8,
        }
    }

    /// The error for a stream that ends before the count its files had when the run started.
    pub fn ended_early(&self) -> DataError {
        DataError::StreamEnded { files: self.files.clone(), expected: self.total }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.files.len()).collect()
    }
}

/// Examples streamed from a [`RecordSplit`], appended to batches.
pub struct RecordReader {
    stream: ExampleStream,
    /// Divide by 255 (`u8` images).
    scale: bool,
}

impl RecordReader {
    /// Appends the next example to `batch`; `false` once the stream has ended.
    pub fn append(&mut self, batch: &mut Batch) -> Result<bool, DataError> {
        let from = batch.x.len();
        batch.x.resize(from + self.stream.example_len(), 0.0);
        match self.stream.next_into(&mut batch.x[from..])? {
            Some(label) => {
                if self.scale {
                    // Division, not multiplication by 1/255, as every other u8 source.
                    batch.x[from..].iter_mut().for_each(|v| *v /= 255.0);
                }
                batch.y.push(label);
                Ok(true)
            }
            None => {
                batch.x.truncate(from);
                Ok(false)
            }
        }
    }

    /// Reads the next example into `pending` without decoding it; `false` once the stream
    /// has ended.
    pub fn take_encoded(&mut self, pending: &mut Vec<Encoded>) -> Result<bool, DataError> {
        let next = self.stream.next_encoded()?;
        let more = next.is_some();
        pending.extend(next);
        Ok(more)
    }

    /// Decodes `pending` into `batch` in order, the examples in parallel: PNG or JPEG images
    /// take tens of microseconds each, too much for the pipeline's one thread to keep a
    /// small model fed. The values are those [`RecordReader::append`] gives.
    pub fn decode_into(&self, pending: Vec<Encoded>, batch: &mut Batch) -> Result<(), DataError> {
        let (len, decoder, scale) = (self.stream.example_len(), self.stream.decoder(), self.scale);
        let from = batch.x.len();
        batch.x.resize(from + pending.len() * len, 0.0);
        let labels: Vec<Result<u32, DataError>> = batch.x[from..]
            .par_chunks_mut(len.max(1))
            .zip(pending)
            .map(|(out, encoded)| {
                let label = decoder.decode(encoded, out)?;
                if scale {
                    // Division, not multiplication by 1/255, as every other u8 source.
                    out.iter_mut().for_each(|v| *v /= 255.0);
                }
                Ok(label)
            })
            .collect();
        for label in labels {
            batch.y.push(label?);
        }
        Ok(())
    }

    /// Skips the next `k` examples without decoding them; returns how many were skipped.
    pub fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        self.stream.skip(k as u64).map(|n| n as usize)
    }
}

impl Examples for RecordSplit {
    fn len(&self) -> usize {
        self.total
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Reads in file order: forward from the last example read (skipping, not decoding, the
    /// ones in between), from the start again when `i` is behind it.
    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let mut state = self.sequential.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, reader) = match state.take() {
            Some((next, reader)) if next <= i => (next, reader),
            _ => (0, self.open(&self.all(), Order::Files).stream),
        };
        let mut reader = RecordReader { stream: reader, scale: self.spec.dtype() == Dtype::U8 };
        if reader.skip(i - next)? < i - next || !reader.append(batch)? {
            return Err(self.ended_early());
        }
        *state = Some((i + 1, reader.stream));
        Ok(())
    }

    /// Records are read as batches are made: nothing is held but the reader's buffers.
    fn bytes_held(&self) -> usize {
        0
    }

    fn records(&self) -> Option<&dyn StreamSplit> {
        Some(self)
    }
}

impl StreamSplit for RecordSplit {
    /// A TFRecord split's shard units are its files.
    fn unit_lens(&self) -> &[usize] {
        self.file_lens()
    }

    fn open_units(&self, units: &[usize], order: Order) -> Box<dyn StreamReader> {
        Box::new(PendingReader { reader: self.open(units, order), pending: Vec::new() })
    }

    fn ended_early(&self) -> DataError {
        RecordSplit::ended_early(self)
    }

    fn refused(&self, problem: String) -> DataError {
        DataError::BadTfRecord { problem }
    }
}

/// A [`RecordReader`] and the records taken from it, decoded together (in parallel).
struct PendingReader {
    reader: RecordReader,
    pending: Vec<Encoded>,
}

impl StreamReader for PendingReader {
    fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        self.reader.skip(k)
    }

    fn take(&mut self) -> Result<bool, DataError> {
        self.reader.take_encoded(&mut self.pending)
    }

    fn decode(&mut self, batch: &mut Batch) -> Result<(), DataError> {
        self.reader.decode_into(std::mem::take(&mut self.pending), batch)
    }
}

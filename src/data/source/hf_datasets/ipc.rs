//! One Arrow IPC *stream* file (`data-00000-of-00004.arrow`, as `datasets` writes them with
//! pyarrow's `RecordBatchStreamWriter`) as a
//! [`ColumnarFile`](crate::data::source::columnar::ColumnarFile). A stream has no footer, so
//! opening it walks its message headers once: the schema, then each record batch's row count
//! and where its body lies, skipping the bodies. A record batch is then read alone (only its
//! bytes, only the columns asked for) and is the file's shard unit.
//!
//! A file that ends inside a message, or without the end-of-stream marker that every writer
//! puts last, is truncated: the error names the file and the byte offset.

use crate::data::error::DataError;
use crate::data::source::columnar::Columnar;
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::{MessageHeader, MetadataVersion};
use arrow_schema::SchemaRef;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The marker before a message's length (since Arrow 0.15).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// Where one record batch lies in the file.
#[derive(Debug, Clone, Copy)]
struct BatchAt {
    /// Offset of its metadata (a flatbuffer `Message`, padded).
    meta: u64,
    meta_len: usize,
    body_len: usize,
}

/// An Arrow IPC stream file whose message headers have been read.
#[derive(Debug, Clone)]
pub(in crate::data::source) struct IpcStreamFile {
    path: PathBuf,
    schema: SchemaRef,
    version: MetadataVersion,
    batches: Vec<BatchAt>,
    /// Rows in each record batch.
    rows: Vec<usize>,
}

fn unreadable(path: &Path, detail: impl std::fmt::Display) -> DataError {
    Columnar::HfDatasets.unreadable(path, detail)
}

impl IpcStreamFile {
    /// Walks `path`'s messages: the schema, then every record batch's header.
    pub(in crate::data::source) fn open(path: &Path) -> Result<Self, DataError> {
        let io = |source| DataError::Read { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut reader = BufReader::new(file);
        let (mut at, mut schema, mut version) = (0u64, None, MetadataVersion::V5);
        let (mut batches, mut rows) = (vec![], vec![]);
        let truncated = |at: u64, what: &str| {
            unreadable(path, format!("truncated at byte {at} of {len}: {what}; write the file again (save_to_disk)"))
        };
        loop {
            let mut word = [0u8; 4];
            if at + 4 > len {
                return Err(truncated(at, "no end-of-stream marker"));
            }
            reader.read_exact(&mut word).map_err(io)?;
            at += 4;
            if word == CONTINUATION {
                if at + 4 > len {
                    return Err(truncated(at, "a message length is cut off"));
                }
                reader.read_exact(&mut word).map_err(io)?;
                at += 4;
            }
            let meta_len = i32::from_le_bytes(word);
            if meta_len == 0 {
                break;
            }
            let meta_len = usize::try_from(meta_len)
                .map_err(|_| unreadable(path, format!("byte {}: a message length of {meta_len}", at - 4)))?;
            if at + meta_len as u64 > len {
                return Err(truncated(at, "a message header is cut off"));
            }
            let mut meta = vec![0u8; meta_len];
            reader.read_exact(&mut meta).map_err(io)?;
            let message = arrow_ipc::root_as_message(&meta)
                .map_err(|e| unreadable(path, format!("byte {at}: not an Arrow IPC message: {e}")))?;
            let meta_at = at;
            at += meta_len as u64;
            let body_len = usize::try_from(message.bodyLength())
                .map_err(|_| unreadable(path, format!("byte {meta_at}: a body length of {}", message.bodyLength())))?;
            if at + body_len as u64 > len {
                return Err(truncated(at, "a record batch's body is cut off"));
            }
            version = message.version();
            match (message.header_type(), &schema) {
                (MessageHeader::Schema, None) => {
                    let fb =
                        message.header_as_schema().ok_or_else(|| unreadable(path, "a schema that does not parse"))?;
                    schema = Some(Arc::new(arrow_ipc::convert::try_fb_to_schema(fb).map_err(|e| unreadable(path, e))?));
                }
                (MessageHeader::RecordBatch, Some(_)) => {
                    let batch = message.header_as_record_batch().ok_or_else(|| {
                        unreadable(path, format!("byte {meta_at}: a record batch that does not parse"))
                    })?;
                    let n = usize::try_from(batch.length())
                        .map_err(|_| unreadable(path, format!("byte {meta_at}: {} rows", batch.length())))?;
                    batches.push(BatchAt { meta: meta_at, meta_len, body_len });
                    rows.push(n);
                }
                (MessageHeader::DictionaryBatch, _) => {
                    return Err(unreadable(
                        path,
                        "dictionary-encoded columns are not read; save the dataset without them \
                         (`cast` the column to a plain type first)",
                    ));
                }
                (other, _) => {
                    return Err(unreadable(path, format!("byte {meta_at}: an unexpected {other:?} message")));
                }
            }
            reader.seek(SeekFrom::Current(body_len as i64)).map_err(io)?;
            at += body_len as u64;
        }
        let schema = schema.ok_or_else(|| unreadable(path, "no schema: the stream is empty"))?;
        Ok(Self { path: path.to_path_buf(), schema, version, batches, rows })
    }

    pub(in crate::data::source) fn path(&self) -> &Path {
        &self.path
    }

    pub(in crate::data::source) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows in each record batch.
    pub(in crate::data::source) fn unit_rows(&self) -> &[usize] {
        &self.rows
    }

    /// Record batch `unit`, columns `columns` only, without its first `skip` rows: only its
    /// bytes are read.
    pub(in crate::data::source) fn read(
        &self,
        unit: usize,
        skip: usize,
        columns: &[usize],
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch, DataError>> + Send>, DataError> {
        let path = &self.path;
        let at = self.batches.get(unit).ok_or_else(|| unreadable(path, format!("no record batch {unit}")))?;
        let io = |source| DataError::Read { path: path.clone(), source };
        let mut file = File::open(path).map_err(io)?;
        file.seek(SeekFrom::Start(at.meta)).map_err(io)?;
        let (mut meta, mut body) = (vec![0u8; at.meta_len], vec![0u8; at.body_len]);
        file.read_exact(&mut meta).and_then(|()| file.read_exact(&mut body)).map_err(io)?;
        let message = arrow_ipc::root_as_message(&meta)
            .map_err(|e| unreadable(path, format!("byte {}: not an Arrow IPC message: {e}", at.meta)))?;
        let header = message
            .header_as_record_batch()
            .ok_or_else(|| unreadable(path, format!("byte {}: a record batch that does not parse", at.meta)))?;
        let batch = arrow_ipc::reader::read_record_batch(
            &Buffer::from_vec(body),
            header,
            self.schema.clone(),
            &HashMap::new(),
            Some(columns),
            &self.version,
        )
        .map_err(|e| unreadable(path, format!("record batch {unit} (byte {}): {e}", at.meta)))?;
        let rows = batch.num_rows();
        Ok(Box::new(std::iter::once(Ok(batch.slice(skip.min(rows), rows - skip.min(rows))))))
    }
}

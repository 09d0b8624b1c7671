//! TFRecord framing: each record is a little-endian `u64` length, the masked CRC-32C of those
//! 8 bytes, the payload, and the masked CRC-32C of the payload (the framing
//! `train/tensorboard.rs` writes). Both checksums are verified; a file that ends inside a
//! record, or a checksum that does not match, is an error naming the file and the record's
//! byte offset (in the decompressed stream, for a gzip file).
//!
//! Files are read through a buffer, a record at a time: never whole.

use crate::data::error::{DataError, Position};
use crate::data::formats::io_error;
use flate2::bufread::MultiGzDecoder;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// Large enough that a read costs one system call per many small records.
const BUFFER: usize = 256 << 10;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// How a TFRecord file is compressed (`tf.data.TFRecordDataset`'s `compression_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    /// Tells from the first bytes: a valid record header means uncompressed, gzip's magic
    /// means gzip. (A length whose low bytes happen to be gzip's magic still passes its CRC,
    /// so the header is tried first.)
    pub fn detect(path: &Path) -> Result<Self, DataError> {
        let mut head = Vec::with_capacity(12);
        File::open(path).and_then(|f| f.take(12).read_to_end(&mut head)).map_err(io_error(path))?;
        let valid_header = head.len() == 12 && masked_crc(&head[..8]).to_le_bytes() == head[8..12];
        Ok(if !valid_header && head.starts_with(&GZIP_MAGIC) { Compression::Gzip } else { Compression::None })
    }
}

/// TFRecord's checksum: CRC-32C, rotated and offset so a CRC of data holding CRCs stays well
/// distributed.
pub fn masked_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one record framing `payload` to `out` (what `tf.io.TFRecordWriter` writes).
pub fn write_record(out: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = (payload.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc(&len).to_le_bytes())?;
    out.write_all(payload)?;
    out.write_all(&masked_crc(payload).to_le_bytes())
}

/// The byte source: a plain file can skip a payload by seeking; gzip must inflate it.
enum FileBytes {
    /// The file and its length.
    Plain(BufReader<File>, u64),
    /// Boxed: the inflate state is 300 bytes more than a plain reader.
    Gzip(Box<BufReader<MultiGzDecoder<BufReader<File>>>>),
}

/// Reads the records of one file in order.
pub struct RecordFile {
    path: PathBuf,
    bytes: FileBytes,
    /// Offset of the next record.
    offset: u64,
}

impl RecordFile {
    /// Opens `path` for reading from its first record.
    pub fn open(path: &Path, compression: Compression) -> Result<Self, DataError> {
        let file = File::open(path).map_err(io_error(path))?;
        let bytes = match compression {
            Compression::None => {
                let len = file.metadata().map_err(io_error(path))?.len();
                FileBytes::Plain(BufReader::with_capacity(BUFFER, file), len)
            }
            Compression::Gzip => FileBytes::Gzip(Box::new(BufReader::with_capacity(
                BUFFER,
                MultiGzDecoder::new(BufReader::with_capacity(BUFFER, file)),
            ))),
        };
        Ok(Self { path: path.to_path_buf(), bytes, offset: 0 })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next record's payload into `buf` (replacing its contents); returns the
    /// record's offset, or `None` at the end of the file.
    pub fn read_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, DataError> {
        let Some(len) = self.header()? else { return Ok(None) };
        let at = self.offset;
        buf.clear();
        // Grows as bytes arrive, so a file cut short cannot make us allocate its claimed size.
        buf.reserve(len.min(64 << 20) as usize);
        let read = self.reader().take(len).read_to_end(buf).map_err(|e| self.io_error(e))?;
        if (read as u64) < len {
            return Err(self.truncated(at, format!("the file ends inside a {len}-byte record")));
        }
        let stored = self.footer(at)?;
        let computed = masked_crc(buf);
        if stored != computed {
            return Err(DataError::BadCrc { path: self.path.clone(), offset: at, part: "data", stored, computed });
        }
        self.offset = at + 16 + len;
        Ok(Some(at))
    }

    /// Skips the next record without reading its payload where the file allows (only its
    /// length checksum is verified); returns its offset, or `None` at the end.
    pub fn skip(&mut self) -> Result<Option<u64>, DataError> {
        let Some(len) = self.header()? else { return Ok(None) };
        let at = self.offset;
        let skipped = match &mut self.bytes {
            FileBytes::Plain(file, end) => {
                // In a plain file the record's offset is the file position.
                let skip = len.min(end.saturating_sub(at + 12));
                file.seek_relative(skip as i64).map(|()| skip)
            }
            FileBytes::Gzip(gz) => io::copy(&mut gz.take(len), &mut io::sink()),
        }
        .map_err(|e| self.io_error(e))?;
        if skipped < len {
            return Err(self.truncated(at, format!("the file ends inside a {len}-byte record")));
        }
        self.footer(at)?;
        self.offset = at + 16 + len;
        Ok(Some(at))
    }

    /// The next record's length after checking its CRC, or `None` at a clean end of file.
    fn header(&mut self) -> Result<Option<u64>, DataError> {
        let mut head = [0u8; 12];
        let got = read_full(self.reader(), &mut head).map_err(|e| self.io_error(e))?;
        match got {
            0 => return Ok(None),
            12 => {}
            n => {
                return Err(
                    self.truncated(self.offset, format!("the file ends {n} bytes into a 12-byte record header"))
                );
            }
        }
        let stored = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        let computed = masked_crc(&head[..8]);
        if stored != computed {
            return Err(DataError::BadCrc {
                path: self.path.clone(),
                offset: self.offset,
                part: "length",
                stored,
                computed,
            });
        }
        Ok(Some(u64::from_le_bytes([head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7]])))
    }

    /// The stored payload CRC.
    fn footer(&mut self, at: u64) -> Result<u32, DataError> {
        let mut crc = [0u8; 4];
        let got = read_full(self.reader(), &mut crc).map_err(|e| self.io_error(e))?;
        if got < 4 {
            return Err(self.truncated(at, "the file ends inside a record's checksum".into()));
        }
        Ok(u32::from_le_bytes(crc))
    }

    fn reader(&mut self) -> &mut dyn BufRead {
        match &mut self.bytes {
            FileBytes::Plain(r, _) => r,
            FileBytes::Gzip(r) => r,
        }
    }

    fn truncated(&self, at: u64, problem: String) -> DataError {
        DataError::Malformed {
            path: self.path.clone(),
            at: Position::Byte(at),
            problem: format!("truncated: {problem}"),
        }
    }

    fn io_error(&self, source: io::Error) -> DataError {
        match self.bytes {
            FileBytes::Plain(..) => DataError::Read { path: self.path.clone(), source },
            // A plain file declared gzip fails here too: name the key before the damage.
            FileBytes::Gzip(_) => DataError::Malformed {
                path: self.path.clone(),
                at: Position::File,
                problem: format!(
                    "not readable as gzip ({source}), which data.tfrecord.compression = \"gzip\" says it is: \
                     set compression = \"none\" if the file is not compressed; if it is, it was cut short \
                     or damaged: write it again"
                ),
            },
        }
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The offset of every record of a file: a framing scan that checks each length's CRC and
/// skips the payloads (for a gzip file they must still be inflated).
pub fn scan(path: &Path, compression: Compression) -> Result<Vec<u64>, DataError> {
    let mut reader = RecordFile::open(path, compression)?;
    let mut offsets = vec![];
    while let Some(at) = reader.skip()? {
        offsets.push(at);
    }
    Ok(offsets)
}

//! Reading a JSONL file: one JSON object a line, plain, gzip or zstd compressed (told apart by
//! their first bytes, never by the file name). Each object comes with its 1-based line and the
//! byte offset of the line's start (in the decompressed stream), so every error names
//! `file:line:column` and the byte.
//!
//! Blank lines (only whitespace) are skipped, as Python's `json` readers of JSONL do; anything
//! else that is not one JSON object is an error, never skipped.

use crate::data::error::{DataError, Position};
use flate2::read::MultiGzDecoder;
use serde_json::{Map, Value};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The compression of a JSONL file, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonlCompression {
    /// Plain text.
    None,
    /// gzip (`1f 8b`), as Python's `gzip.open` writes.
    Gzip,
    /// Zstandard (`28 b5 2f fd`), as the `zstandard` package or `zstd` writes.
    Zstd,
}

impl JsonlCompression {
    /// The compression whose magic number `head` starts with; plain text otherwise.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(&[0x1f, 0x8b]) {
            JsonlCompression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            JsonlCompression::Zstd
        } else {
            JsonlCompression::None
        }
    }
}

/// One object of a JSONL file and where it was.
#[derive(Debug)]
pub struct ObjectLine {
    pub object: Map<String, Value>,
    /// 1-based line number.
    pub line: u64,
    /// Byte offset of the line's first byte (decompressed).
    pub byte: u64,
}

/// The objects of a JSONL file, in order.
pub struct Lines {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    compression: JsonlCompression,
    buf: Vec<u8>,
    line: u64,
    byte: u64,
}

impl Lines {
    /// Opens `path`, decompressing it when its first bytes say it is compressed.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let read_error = |source| DataError::Read { path: path.to_path_buf(), source };
        let mut file = BufReader::new(File::open(path).map_err(read_error)?);
        let compression = JsonlCompression::sniff(file.fill_buf().map_err(read_error)?);
        let reader: Box<dyn BufRead + Send> = match compression {
            JsonlCompression::None => Box::new(file),
            JsonlCompression::Gzip => Box::new(BufReader::new(MultiGzDecoder::new(file))),
            JsonlCompression::Zstd => {
                let decoder = ruzstd::decoding::StreamingDecoder::new(file).map_err(|e| DataError::Malformed {
                    path: path.to_path_buf(),
                    at: Position::Byte(0),
                    problem: format!("corrupt zstd data ({e}); the file is damaged or not zstd"),
                })?;
                Box::new(BufReader::new(decoder))
            }
        };
        Ok(Self { path: path.to_path_buf(), reader, compression, buf: vec![], line: 0, byte: 0 })
    }

    /// The next object, `None` at the end of the file.
    pub fn next_object(&mut self) -> Result<Option<ObjectLine>, DataError> {
        loop {
            self.buf.clear();
            let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| self.stream_error(e))?;
            if n == 0 {
                return Ok(None);
            }
            let (line, byte) = (self.line + 1, self.byte);
            self.line = line;
            self.byte += n as u64;
            let text = std::str::from_utf8(&self.buf).map_err(|e| {
                self.malformed(
                    Position::Byte(byte + e.valid_up_to() as u64),
                    format!("line {line} is not UTF-8 text; JSON Lines files are UTF-8"),
                )
            })?;
            if text.trim().is_empty() {
                continue;
            }
            let object = match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(object)) => object,
                Ok(other) => {
                    let kind = kind_of(&other);
                    return Err(self.malformed(
                        at(line, 1, byte),
                        format!("the line holds {kind}, not a JSON object; each line of a JSONL file is one object"),
                    ));
                }
                Err(e) => {
                    // serde_json counts columns in characters from 1; the byte is the line's
                    // start plus the characters before the column, in bytes.
                    let column = e.column().max(1);
                    let offset: usize = text.chars().take(column - 1).map(char::len_utf8).sum();
                    let problem = format!("invalid JSON: {}", without_position(&e));
                    return Err(self.malformed(at(line, column, byte + offset as u64), problem));
                }
            };
            return Ok(Some(ObjectLine { object, line, byte }));
        }
    }

    /// Skips the next `k` objects without parsing them (a resumed stream finds its place):
    /// lines are counted as [`Lines::next_object`] counts them, blank ones not at all; returns
    /// how many were skipped (fewer only at the end of the file).
    pub fn skip_objects(&mut self, k: usize) -> Result<usize, DataError> {
        let mut done = 0;
        while done < k {
            self.buf.clear();
            let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| self.stream_error(e))?;
            if n == 0 {
                break;
            }
            self.line += 1;
            self.byte += n as u64;
            // A line that is not UTF-8 is no blank line: `next_object` would stop on it, and
            // the pass at load already has.
            let blank = std::str::from_utf8(&self.buf).is_ok_and(|text| text.trim().is_empty());
            done += usize::from(!blank);
        }
        Ok(done)
    }

    fn malformed(&self, at: Position, problem: String) -> DataError {
        DataError::Malformed { path: self.path.clone(), at, problem }
    }

    /// A failure of the decompressor or the disk, at the byte reached.
    fn stream_error(&self, source: std::io::Error) -> DataError {
        match self.compression {
            JsonlCompression::None => DataError::Read { path: self.path.clone(), source },
            JsonlCompression::Gzip => DataError::Gzip { path: self.path.clone(), source, downloaded: false },
            JsonlCompression::Zstd => self.malformed(
                Position::Byte(self.byte),
                format!("corrupt zstd data ({source}); the file is damaged or truncated"),
            ),
        }
    }
}

/// `line:column` with the byte offset, as every JSONL error names its place.
fn at(line: u64, column: usize, byte: u64) -> Position {
    Position::LineByte { line, column, byte }
}

/// serde_json's message without its own ` at line 1 column 7` (the position is named once, as
/// the file's).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// What a JSON value is, in words.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
